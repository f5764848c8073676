"""A packed-document pretraining config over the session's packed data."""

import pathlib

from configs import tiny_packed

SEQ_LEN = 64  # the rows of conftest's packed_data


def packed_config(data_dir: pathlib.Path, **overrides):
    config = tiny_packed.get_config()
    config.data.dir = str(data_dir)
    config.data.max_seq_length = SEQ_LEN
    config.data.max_predictions_per_seq = 20
    config.model.num_layers = 1
    config.batch_size = 16
    config.batch_warmup_start = 0
    config.batch_warmup_steps = 0
    config.num_train_steps = 40
    config.log_every_steps = 1
    config.eval_every_steps = 1000
    config.eval_batches = 1
    config.checkpoint_every_steps = 40
    config.optimizer.warmup_steps = 4
    config.optimizer.decay_steps = 8
    config.fill_mask_samples = 0
    config.update_from_flattened_dict(overrides)
    return config
