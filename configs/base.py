"""BERT-base, phase 1: google-research/bert's recipe.

Sequence length 128 with 20 predictions per sequence for 90% of pretraining (phase 2,
configs/base_phase2.py, continues at 512), batch 256, AdamW at 1e-4 with weight decay 0.01,
10k warmup steps and google's linear decay computed from step 0, 1M steps.

    python train.py --config configs/base.py --workdir runs/base
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.preset = "base"
    config.model.dtype = "bfloat16"  # parameters stay float32; matmuls in bf16 on TPU/GPU
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20  # ~ 128 * 0.15
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 10_000
    config.optimizer.schedule = "google"
    config.optimizer.weight_decay = 0.01
    config.num_train_steps = 1_000_000
    config.batch_size = 256
    config.checkpoint_every_steps = 10_000
    return config
