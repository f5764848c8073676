"""ModernBERT-large pretrained from scratch with its recipe, phase 1 (sequence length 1,024).

configs/modernbert_base.py with the published large sizes (answerdotai/ModernBERT-large: H
1024, I 2624, 28 layers, 16 heads) and its peak learning rate of 5e-4 as we read the paper.
The context-extension phase is configs/modernbert_base_context.py with
--config.model.preset=large --config.optimizer.learning_rate=<its constant rate>.

    python train.py --config configs/modernbert_large.py --workdir runs/modernbert_large
"""

from configs import modernbert_base


def get_config():
    config = modernbert_base.get_config()
    config.model.preset = "large"
    config.optimizer.learning_rate = 5e-4
    return config
