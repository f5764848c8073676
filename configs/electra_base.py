"""ELECTRA-Base: hidden 768 (embeddings 768), 12 layers, 12 heads, FFN 3072; lr 2e-4, batch
256, sequence 512, 766k steps, mask rate 15%, lambda 50 (Clark et al. 2020, Table 6;
google-research/electra's configure_pretraining.py for model_size "base"). The generator is a
third of the discriminator's width (hidden 256, 4 heads), as configure_pretraining.py gives it
for base (generator_hidden_size=0.33333), where the paper's general advice is 1/4 to 1/2.

    python train.py --config configs/electra_base.py --workdir gs://bucket/electra_base \\
        --config.data.input='gs://bucket/corpus/*.txt'
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.family = "electra"
    config.model.preset = "base"
    config.model.dtype = "bfloat16"
    config.objective = "rtd"
    config.generator_hidden_fraction = 1 / 3
    config.rtd_weight = 50.0
    config.data.vocab_size = 30522
    config.data.max_seq_length = 512
    config.data.masked_lm_prob = 0.15
    config.data.max_predictions_per_seq = 80  # ELECTRA's slots: int(0.155 * 512) = 79
    config.data.layout = "packed"
    config.data.dupe_factor = 1
    config.optimizer.learning_rate = 2e-4
    config.optimizer.warmup_steps = 10_000
    config.num_train_steps = 766_000
    config.batch_size = 256
    return config
