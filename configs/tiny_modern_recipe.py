"""The tiny CPU demo (configs/tiny.py) trained with the modern recipe instead of google's.

The recipe of ModernBERT (Warner et al. 2024, arXiv 2412.13663) on BERT's architecture:
- masked LM only, no sentence-pair task (RoBERTa onwards); the data can stay sentence pairs;
- 30% of the tokens masked (80/10/10 inside them), evaluation at google's 15% so that eval
  losses compare with runs of other rates;
- StableAdamW: AdamW whose per-tensor step is divided by max(1, RMS(g / sqrt(v))) in place of
  global gradient clipping; lr 8e-4, betas (0.9, 0.98), eps 1e-6, weight decay 1e-5 removed
  per step at the peak rate (ModernBERT's decoupled_stableadamw), none on biases and
  LayerNorm;
- warmup-stable-decay: linear warmup, the peak rate, then a 1 - sqrt decay over the last
  decay_steps. ModernBERT trains with decay_steps=0 (stable) and decays in a later phase:
  resume the same workdir with a larger num_train_steps and decay_steps > 0.

- batch-size warmup: the global batch grows from a quarter of its size to all of it over the
  first steps (ModernBERT: 768 to 4608 sequences over its first 50B tokens); counted in steps,
  as the learning-rate schedule is.

Sized like configs/tiny.py (600 steps of 32 sequences). On the demo corpus one run ended at
about configs/tiny.py's eval MLM accuracy (0.129 at the 15% eval rate, against the unigram
baseline's 0.046), rising through 0.088 and 0.117 at steps 200 and 400.
"""

from configs import tiny


def get_config():
    config = tiny.get_config()
    config.objective = "mlm"
    config.data.masked_lm_prob = 0.3
    config.data.eval_masked_lm_prob = 0.15
    # Room for 30% of 128 tokens (38): a smaller cap would lower the rate of long sequences.
    config.data.max_predictions_per_seq = 40
    config.optimizer.name = "stable_adamw"
    config.optimizer.learning_rate = 8e-4
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 1e-5
    config.optimizer.lr_decoupled_weight_decay = True
    config.optimizer.max_grad_norm = None  # update clipping replaces it
    config.optimizer.schedule = "wsd"
    config.optimizer.warmup_steps = 60
    config.optimizer.decay_steps = 120  # the last fifth of the 600 steps
    config.optimizer.end_learning_rate = 0.0
    config.batch_warmup_start = 8  # 8, 16, 24 then 32 sequences per step
    config.batch_warmup_steps = 100
    return config
