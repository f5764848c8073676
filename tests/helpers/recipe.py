"""configs/tiny_modern_recipe.py over the session's synthetic data, short, one layer."""

import pytest

from configs import tiny_modern_recipe
from tests.helpers.corpora import ONE_LAYER


@pytest.fixture
def data_dir(synthetic_data):
    return synthetic_data


def _recipe_config(data_dir, **overrides):
    """configs/tiny_modern_recipe.py on the synthetic data, short, with a one-layer model
    (these tests are about the recipe's objective, schedules and batch sizes, and one
    layer traces and compiles in about half the time)."""
    config = tiny_modern_recipe.get_config()
    config.update_from_flattened_dict(ONE_LAYER)
    config.data.dir = str(data_dir)
    config.data.max_seq_length = 64
    config.data.max_predictions_per_seq = 20  # 64 * 0.3 = 19.2
    config.batch_size = 32
    config.num_train_steps = 16
    config.log_every_steps = 1
    config.eval_every_steps = 8
    config.eval_batches = 2
    config.checkpoint_every_steps = 8
    config.optimizer.warmup_steps = 4
    config.optimizer.decay_steps = 6
    config.fill_mask_samples = 0
    config.batch_warmup_steps = 0  # each batch size compiles: only where a test wants them
    config.update_from_flattened_dict(overrides)
    return config
