"""ELECTRA-Small: embedding 128 -> hidden 256, 12 layers, 4 heads, FFN 1024; lr 5e-4, batch
128, sequence 128, 1M steps, mask rate 15%, lambda 50 (Clark et al. 2020, "ELECTRA:
Pre-training Text Encoders as Discriminators Rather Than Generators", Table 6, and
google-research/electra's configure_pretraining.py for model_size "small").

    python train.py --config configs/electra_small.py --workdir gs://bucket/electra_small \\
        --config.data.input='gs://bucket/corpus/*.txt'

The generator is a quarter of the discriminator's width, the paper's recommendation
(Section 3.2: generators 1/4-1/2 the discriminator's size work best); the released
ELECTRA-Small used a generator as wide as the discriminator
(configure_pretraining.py's generator_hidden_size=1.0 for "small"): set
--config.generator_hidden_fraction=1.0 to match it.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.family = "electra"
    config.model.preset = "small"  # E128 -> H256, L12, A4, FFN 1024
    config.objective = "rtd"
    config.generator_hidden_fraction = 0.25
    config.rtd_weight = 50.0
    config.data.vocab_size = 30522
    config.data.max_seq_length = 128
    config.data.masked_lm_prob = 0.15
    config.data.max_predictions_per_seq = 20
    config.data.layout = "packed"  # ELECTRA trains on whole documents, no sentence pairs
    config.data.dupe_factor = 1
    config.optimizer.learning_rate = 5e-4
    config.optimizer.warmup_steps = 10_000
    config.optimizer.weight_decay = 0.01
    config.num_train_steps = 1_000_000
    config.batch_size = 128
    return config
