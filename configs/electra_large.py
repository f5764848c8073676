"""ELECTRA-Large: hidden 1024 (embeddings 1024), 24 layers, 16 heads, FFN 4096; mask rate 25%,
generator 1/4 of the discriminator's width, lambda 50, lr 2e-4 (the 1.75M-step "ELECTRA-1.75M"
run), batch 2048, sequence 512 (Clark et al. 2020, Table 7; google-research/electra's
configure_pretraining.py for model_size "large": mask_prob 0.25, learning_rate 2e-4,
train_batch_size 2048, num_train_steps 1.75M, generator_hidden_size 0.25).

    python train.py --config configs/electra_large.py --workdir gs://bucket/electra_large \\
        --config.data.input='gs://bucket/corpus/*.txt'
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.family = "electra"
    config.model.preset = "large"
    config.model.dtype = "bfloat16"
    config.objective = "rtd"
    config.generator_hidden_fraction = 0.25
    config.rtd_weight = 50.0
    config.data.vocab_size = 30522
    config.data.max_seq_length = 512
    config.data.masked_lm_prob = 0.25
    config.data.eval_masked_lm_prob = 0.25
    config.data.max_predictions_per_seq = 130  # ELECTRA's slots: int(0.255 * 512) = 130
    config.data.layout = "packed"
    config.data.dupe_factor = 1
    config.optimizer.learning_rate = 2e-4
    config.optimizer.warmup_steps = 10_000
    config.num_train_steps = 1_750_000
    config.batch_size = 2048
    return config
