"""CPU demo: the tiny preset (L2/H128/A2) on the built-in demo corpus, minutes on a laptop.

Sized so that `python train.py` (data preparation, tokenizer training, training, evaluation
and checkpoints) finishes in a few minutes on two CPU cores.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.preset = "tiny"
    config.data.vocab_size = 8000      # a ~1 MB demo corpus does not support a larger vocabulary
    config.data.dupe_factor = 2
    config.data.eval_fraction = 0.05
    config.optimizer.learning_rate = 1e-3  # small models tolerate (and need) a larger rate
    config.optimizer.warmup_steps = 100
    config.num_train_steps = 1200
    config.batch_size = 32
    config.log_every_steps = 50
    config.eval_every_steps = 400
    config.eval_batches = 20
    config.checkpoint_every_steps = 400
    return config
