"""ModernBERT-base's context-extension phase: 8,192 tokens from a phase-1 checkpoint.

Set --config.init_from=<the configs/modernbert_base.py work directory>. Only the parameters
come from it: the optimizer starts fresh (StableAdamW at a constant 3e-4, a short warmup),
the global rotary theta goes from 10,000 to 160,000, and the rows are whole documents packed
into 8,192 slots. The data is tokenized with phase 1's tokenizer (the one beside its
checkpoints) when prepared here. Rows of 576 x 8,192 keep phase 1's tokens per step. The
run records where it started and what changed in its checkpoints' meta ("phase").
ModernBERT then decays: resume this work directory with more steps and decay_steps > 0.

    python train.py --config configs/modernbert_base_context.py --workdir runs/modernbert_8k \
        --config.init_from=runs/modernbert_base
"""

import ml_collections

from configs import modern_recipe, modernbert_base


def get_config():
    config = modern_recipe.apply(modernbert_base.get_config(), learning_rate=3e-4)
    config.init_from = ml_collections.config_dict.placeholder(str)
    config.model.global_rope_theta = 160_000.0
    config.data.max_seq_length = 8192
    config.data.max_predictions_per_seq = 2458  # 30% of 8,192
    config.optimizer.warmup_steps = 500
    config.optimizer.decay_steps = 0  # the constant phase
    config.batch_size = 576
    config.batch_warmup_start = 0
    config.batch_warmup_steps = 0
    config.num_train_steps = 53_000  # about 250B tokens
    return config
