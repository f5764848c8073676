"""CPU demo of replaced-token detection on the modern encoder: configs/modernbert_tiny.py
(ModernBERT L4/H128/A4 and its recipe, on the built-in demo corpus) with one field changed,
`objective = "rtd"`: a generator a quarter as wide (32, one head) fills the masked positions
and the discriminator labels every token original or replaced (docs/electra.md, "Replaced-token
detection on ModernBERT", quotes a run).

    python train.py --config configs/modernbert_rtd_tiny.py --workdir runs/modernbert_rtd_tiny
"""

from configs import modernbert_tiny


def get_config():
    config = modernbert_tiny.get_config()
    config.objective = "rtd"
    return config
