"""The tiny CPU demo (configs/tiny.py) trained with the modern recipe instead of google's.

The recipe of ModernBERT (configs/modern_recipe.py lists its parts) on BERT's architecture;
the data stays sentence pairs. ModernBERT trains with decay_steps=0 (stable) and decays in a
later phase: resume the same workdir with a larger num_train_steps and decay_steps > 0.

Batch-size warmup: the global batch grows from a quarter of its size to all of it over the
first steps (ModernBERT: 768 to 4608 sequences over its first 50B tokens); counted in steps,
as the learning-rate schedule is.

Sized like configs/tiny.py (600 steps of 32 sequences). On the demo corpus one run ended at
about configs/tiny.py's eval MLM accuracy (0.129 at the 15% eval rate, against the unigram
baseline's 0.046), rising through 0.088 and 0.117 at steps 200 and 400.

    python train.py --config configs/tiny_modern_recipe.py --workdir runs/tiny_modern_recipe
"""

from configs import modern_recipe, tiny


def get_config():
    config = modern_recipe.apply(tiny.get_config(), learning_rate=8e-4)
    # Room for 30% of 128 tokens (38): a smaller cap would lower the rate of long sequences.
    config.data.max_predictions_per_seq = 40
    config.optimizer.warmup_steps = 60
    config.optimizer.decay_steps = 120  # the last fifth of the 600 steps
    config.batch_warmup_start = 8  # 8, 16, 24 then 32 sequences per step
    config.batch_warmup_steps = 100
    return config
