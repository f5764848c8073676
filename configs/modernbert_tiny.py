"""CPU demo of the modern encoder: a tiny ModernBERT pretrained with ModernBERT's recipe.

configs/modernbert_base.py (the architecture of bertjax.encoders.modernbert: rotary
positions, GeGLU, pre-LayerNorm, a global layer every third and sliding-window layers
between, no biases; the recipe of configs/modern_recipe.py: masked LM only at 30%, evaluated
at 15%, whole documents packed into rows that each attend to themselves, StableAdamW,
warmup-stable-decay, batch-size warmup) at the size of a laptop demo: L4/H128/A4, windows of
64 tokens in rows of 128, on the built-in demo corpus with a 4,000-piece tokenizer.

Sized to take no more wall time than configs/tiny.py, the BERT demo, and to end well above
the unigram baseline; the figures measured are in the README.

    python train.py --config configs/modernbert_tiny.py --workdir runs/modernbert_tiny
"""

from configs import modernbert_base


def get_config():
    config = modernbert_base.get_config()
    config.model.preset = "tiny"
    config.model.hidden_size = 128
    config.model.intermediate_size = 256
    config.model.num_layers = 4  # layers 0 and 3 global, 1 and 2 local
    config.model.num_heads = 4
    config.model.local_attention = 64  # token i sees j when |i - j| <= 32
    # A tiny model's weights drawn 2.5x wider, as configs/tiny.py does for BERT's.
    config.model.initializer_range = 0.05
    config.model.dtype = "float32"
    config.model.remat_policy = "none"
    config.model.scan_layers = False
    config.data.vocab_size = 4000
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 40  # room for 30% of 128
    config.data.eval_fraction = 0.05
    # A small model takes (and needs) a higher rate than the base's 8e-4.
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 25
    config.optimizer.decay_steps = 50
    config.batch_size = 32
    config.batch_warmup_start = 16  # 16 rows a step, then 32 from step 50
    config.batch_warmup_steps = 50
    config.num_train_steps = 250
    config.log_every_steps = 25
    config.eval_every_steps = 125
    config.eval_batches = 20
    config.checkpoint_every_steps = 125
    return config
