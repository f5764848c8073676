"""CPU demo of replaced-token detection: a tiny ELECTRA (L2/H128/A2, embeddings 128) on the
built-in demo corpus, the BERT demo's (configs/tiny.py) data, vocabulary, batch and length.

    python train.py --config configs/electra_tiny.py --workdir /tmp/electra_tiny

Its summary shows the discriminator's accuracy beside "all original" (calling every token
original) and its recall on replaced tokens; docs/electra.md quotes a run's figures.
"""

from configs import default


def get_config():
    config = default.get_config()
    config.model.family = "electra"
    config.model.preset = "tiny"
    # As the BERT demo: no dropout and wider initial weights for a run this short.
    config.model.hidden_dropout = 0.0
    config.model.attention_dropout = 0.0
    config.model.initializer_range = 0.05
    config.objective = "rtd"
    # A generator half the discriminator's width (64, one head): ELECTRA's advice is 1/4 to
    # 1/2; a quarter of 128 would leave one 32-wide head.
    config.generator_hidden_fraction = 0.5
    config.data.vocab_size = 4000
    config.data.dupe_factor = 2
    config.data.eval_fraction = 0.05
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 60
    config.num_train_steps = 600
    config.batch_size = 32
    config.log_every_steps = 50
    config.eval_every_steps = 200
    config.eval_batches = 20
    config.checkpoint_every_steps = 200
    return config
