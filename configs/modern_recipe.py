"""ModernBERT's pretraining recipe (Warner et al. 2024, arXiv 2412.13663) as config fields,
shared by every config that trains with it (configs/tiny_modern_recipe.py on BERT's
architecture, configs/modernbert_*.py on ModernBERT's):

- masked LM only, no sentence-pair task (RoBERTa onwards);
- 30% of the tokens masked (80/10/10 inside them), evaluation at google's 15% so that eval
  losses compare with runs of other rates;
- StableAdamW: AdamW whose per-tensor step is divided by max(1, RMS(g / sqrt(v))) in place of
  global gradient clipping; betas (0.9, 0.98), eps 1e-6, weight decay 1e-5 removed per step at
  the peak rate (ModernBERT's decoupled_stableadamw), none on biases and norms;
- warmup-stable-decay: linear warmup, the peak rate, then a 1 - sqrt decay to zero over the
  last optimizer.decay_steps (0: the stable phase only, decayed later by resuming the same
  workdir with more steps and decay_steps > 0).

Batch-size warmup and the data layout are sized by each config.
"""


def apply(config, *, learning_rate: float):
    """Sets the recipe's objective, masking rates and optimizer on `config`; returns it."""
    config.objective = "mlm"
    config.data.masked_lm_prob = 0.3
    config.data.eval_masked_lm_prob = 0.15
    config.optimizer.name = "stable_adamw"
    config.optimizer.learning_rate = learning_rate
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 1e-5
    config.optimizer.lr_decoupled_weight_decay = True
    config.optimizer.max_grad_norm = None  # update clipping replaces it
    config.optimizer.schedule = "wsd"
    config.optimizer.end_learning_rate = 0.0
    return config
