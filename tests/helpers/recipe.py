"""configs/tiny_modern_recipe.py over the session's synthetic data, short, one layer."""

import pytest

from configs import tiny_modern_recipe
from tests.helpers.corpora import ONE_LAYER
from tests.helpers.trainer import short_run_config


@pytest.fixture
def data_dir(synthetic_data):
    return synthetic_data


def _recipe_config(data_dir, **overrides):
    """configs/tiny_modern_recipe.py on the synthetic data, short, with a one-layer model
    (these tests are about the recipe's objective, schedules and batch sizes, and one
    layer traces and compiles in about half the time)."""
    config = short_run_config(
        tiny_modern_recipe,
        data_dir,
        steps=16,
        batch_size=32,
        warmup_steps=4,
        predictions=20,  # 64 * 0.3 = 19.2
        eval_every=8,
        eval_batches=2,
        checkpoint_every=8,
        **ONE_LAYER,
    )
    config.optimizer.decay_steps = 6
    config.fill_mask_samples = 0
    config.batch_warmup_steps = 0  # each batch size compiles: only where a test wants them
    config.update_from_flattened_dict(overrides)
    return config
