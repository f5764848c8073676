"""CPU demo: the tiny preset (L2/H128/A2) on the built-in demo corpus, minutes on a laptop.

Sized so that `python train.py` (data preparation, tokenizer training, training, evaluation
and checkpoints) finishes in about five minutes on two CPU cores. It shows the machinery
working and the losses falling; a model worth using needs a real corpus and a larger config.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.preset = "tiny"
    config.data.vocab_size = 4000  # a ~1.5 MB corpus; a small vocabulary also trains faster
    config.data.dupe_factor = 2
    config.data.eval_fraction = 0.05
    config.optimizer.learning_rate = 2e-3  # small models tolerate (and need) a larger rate
    config.optimizer.warmup_steps = 60
    config.num_train_steps = 600
    config.batch_size = 32
    config.log_every_steps = 50
    config.eval_every_steps = 200
    config.eval_batches = 20
    config.checkpoint_every_steps = 200
    return config
