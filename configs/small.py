"""BERT-small (L4/H512/A8): a model that trains on one accelerator in hours.

Used by the CPU benchmark too. Bring your own corpus with --config.data.input=...

    python train.py --config configs/small.py --workdir runs/small
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.preset = "small"
    config.model.dtype = "bfloat16"
    config.optimizer.learning_rate = 5e-4  # smaller models take larger rates (Turc et al. 2019)
    config.optimizer.warmup_steps = 10_000
    config.num_train_steps = 500_000
    config.batch_size = 256
    return config
