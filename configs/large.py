"""BERT-large (L24/H1024/A16), phase 1 with google's AdamW recipe (seq 128, batch 256).

python train.py --config configs/large.py --workdir runs/large
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.preset = "large"
    config.model.remat_policy = "dots"  # 24 layers: trade some recompute for memory
    config.model.scan_layers = True  # compile time independent of depth
    return config
