"""CPU demo of the modern encoder: a tiny ModernBERT pretrained with the modern recipe.

The architecture is ModernBERT's (bertjax.encoders.modernbert: rotary positions, GeGLU,
pre-LayerNorm, a global layer every third and sliding-window layers between, no biases) and
the recipe ModernBERT's (configs/tiny_modern_recipe.py explains each part): masked LM only at
a 30% rate (evaluated at 15%), whole documents packed into rows that attend each to itself,
StableAdamW, warmup-stable-decay and batch-size warmup.

Sized for the same budget as configs/tiny.py, the BERT demo (600 steps of 32 rows of 128
tokens on the built-in demo corpus, a 4,000-piece tokenizer trained on it).
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.family = "modernbert"
    config.model.preset = "tiny"
    config.model.hidden_size = 128
    config.model.intermediate_size = 256
    config.model.num_layers = 4  # layers 0 and 3 global, 1 and 2 local
    config.model.num_heads = 4
    config.model.local_attention = 64  # token i sees j when |i - j| <= 32
    config.model.hidden_dropout = 0.0
    config.model.attention_dropout = 0.0
    config.model.initializer_range = 0.05

    config.objective = "mlm"
    config.data.layout = "packed"
    config.data.dupe_factor = 1
    config.data.vocab_size = 4000
    config.data.eval_fraction = 0.05
    config.data.masked_lm_prob = 0.3
    config.data.eval_masked_lm_prob = 0.15
    config.data.max_predictions_per_seq = 40  # room for 30% of 128 tokens

    config.optimizer.name = "stable_adamw"
    config.optimizer.learning_rate = 2e-3
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 1e-5
    config.optimizer.lr_decoupled_weight_decay = True
    config.optimizer.max_grad_norm = None  # update clipping replaces it
    config.optimizer.schedule = "wsd"
    config.optimizer.warmup_steps = 60
    config.optimizer.decay_steps = 120
    config.optimizer.end_learning_rate = 0.0
    config.batch_warmup_start = 8
    config.batch_warmup_steps = 100

    config.num_train_steps = 600
    config.batch_size = 32
    config.log_every_steps = 50
    config.eval_every_steps = 200
    config.eval_batches = 20
    config.checkpoint_every_steps = 200
    return config
