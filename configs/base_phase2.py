"""BERT-base, phase 2: sequence length 512, initialised from a phase-1 checkpoint.

Only the parameters come from phase 1 (set --config.init_from=<phase-1 workdir>); the
optimizer starts fresh with its own warmup, as NVIDIA's two-phase recipe does. Position
embeddings beyond 128 were learned little in phase 1; phase 2 is what trains them.
Prepare the data at 512 (the prepared directory records its sequence length and is
rejected if it does not match).

    python train.py --config configs/base_phase2.py --workdir runs/base_phase2 \
        --config.init_from=runs/base
"""

import ml_collections

from configs import base


def get_config():
    config = base.get_config()
    # Required: a phase-1 workdir or checkpoint directory (validation says so if unset).
    config.init_from = ml_collections.config_dict.placeholder(str)
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 80  # ~ 512 * 0.15
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 1_000
    config.num_train_steps = 100_000
    config.batch_size = 256
    config.model.remat_policy = "dots"  # activations at 512 are 4x those at 128
    return config
