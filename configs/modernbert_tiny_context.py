"""The CPU demo's context-extension phase: configs/modernbert_tiny.py continued at 512 tokens.

ModernBERT's context extension (configs/modernbert_base_context.py) at the demo's size: set
--config.init_from=<the modernbert_tiny work directory>. The parameters come from that run,
the optimizer starts fresh at a constant rate, the global rotary theta goes from 10,000 to
160,000, and rows of 512 tokens hold the same tokens per step as the demo's 32 x 128. The
demo corpus is prepared again at 512 with the first run's tokenizer.

    python train.py --config configs/modernbert_tiny_context.py --workdir runs/modernbert_512 \
        --config.init_from=runs/modernbert_tiny
"""

import ml_collections

from configs import modernbert_tiny


def get_config():
    config = modernbert_tiny.get_config()
    config.init_from = ml_collections.config_dict.placeholder(str)
    config.model.global_rope_theta = 160_000.0
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 160  # room for 30% of 512
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 10
    config.optimizer.decay_steps = 0  # the constant phase
    config.batch_size = 8
    config.batch_warmup_start = 0
    config.batch_warmup_steps = 0
    config.num_train_steps = 100
    config.eval_every_steps = 50
    config.eval_batches = 10
    config.checkpoint_every_steps = 50
    return config
