"""ModernBERT-base pretrained from scratch with its recipe, phase 1 (sequence length 1,024).

The published sizes (answerdotai/ModernBERT-base: H 768, I 1152, 22 layers, 12 heads, a
global layer every third, windows of 128, mean pooling for classifiers) and recipe
(configs/modern_recipe.py; arXiv 2412.13663 as we read it): StableAdamW at 8e-4, batches
warming up from 768 to 4,608 sequences of 1,024 tokens over the first 50B tokens, whole
documents packed into rows, 1.7T tokens (about 360k steps) at the stable rate. Phase 1's
global rotary theta is 10,000; configs/modernbert_base_context.py continues from this run at
8,192 tokens with theta 160,000, and its decay phase ends the run.

    python train.py --config configs/modernbert_base.py --workdir runs/modernbert_base
"""

from configs import default, modern_recipe


def get_config():
    config = modern_recipe.apply(default.get_config(), learning_rate=8e-4)
    config.model.family = "modernbert"
    config.model.preset = "base"
    config.model.global_rope_theta = 10_000.0  # phase 1's; the context phase sets 160,000
    config.model.dtype = "bfloat16"  # parameters stay float32
    config.model.remat_policy = "dots"
    config.model.scan_layers = True  # over the repeating group of three layers
    config.model.hidden_dropout = 0.0  # ModernBERT pretrains without dropout
    config.model.attention_dropout = 0.0
    config.data.layout = "packed"
    config.data.dupe_factor = 1  # masking is drawn per batch; a second pass repeats rows
    config.data.vocab_size = 50368  # for a tokenizer trained here; ModernBERT's has 50,368
    config.data.max_seq_length = 1024
    config.data.max_predictions_per_seq = 320  # room for 30% of 1,024
    config.data.eval_fraction = 0.001
    config.optimizer.warmup_steps = 2_000  # about 3B tokens, during the batch warmup
    config.optimizer.decay_steps = 0  # stable; decayed by a later phase
    config.batch_size = 4608
    config.batch_warmup_start = 768  # 768, 1536, ... 4608 rows
    config.batch_warmup_steps = 18_000  # about 50B tokens
    config.num_train_steps = 360_000
    config.log_every_steps = 100
    config.eval_every_steps = 5_000
    config.eval_batches = 20
    config.checkpoint_every_steps = 2_000
    return config
