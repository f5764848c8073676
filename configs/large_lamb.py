"""BERT-large with LAMB at batch 32k, sequence length 128 (You et al. 2019; NVIDIA's phase 1).

LAMB's per-layer trust ratio is what makes a 32k batch trainable: peak rate 6e-3 with a long
warmup (28.4% of the 7,038 steps) and polynomial decay of power 0.5. A 32k batch rarely fits
in device memory at once: raise grad_accum_steps until it does (the update is the same).

    python train.py --config configs/large_lamb.py --workdir runs/large_lamb
"""

from configs import large


def get_config():
    config = large.get_config()
    config.optimizer.name = "lamb"
    config.optimizer.learning_rate = 6e-3
    config.optimizer.schedule = "polynomial"
    config.optimizer.polynomial_power = 0.5
    config.optimizer.warmup_steps = 2_000  # 0.2843 * 7038
    config.optimizer.weight_decay = 0.01
    config.num_train_steps = 7_038
    config.batch_size = 32_768
    config.grad_accum_steps = 16
    config.checkpoint_every_steps = 200
    config.eval_every_steps = 500
    return config
