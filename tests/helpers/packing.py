"""A packed-document pretraining config over the session's packed data."""

import pathlib

from configs import tiny_packed
from tests.helpers.trainer import short_run_config

SEQ_LEN = 64  # the rows of conftest's packed_data


def packed_config(data_dir: pathlib.Path, **overrides):
    config = short_run_config(
        tiny_packed, data_dir, steps=40, batch_size=16, warmup_steps=4, predictions=20
    )
    config.model.num_layers = 1
    config.update(batch_warmup_start=0, batch_warmup_steps=0, fill_mask_samples=0)
    config.optimizer.decay_steps = 8
    config.update_from_flattened_dict(overrides)
    return config
