"""The sequence-to-sequence tests' tiny BERT, sources, random parameters, logits, the toy
decoding table and a half-trained reversal model."""

import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest

from bertjax.tasks.seq2seq import model as s2s
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.params import random_init
from tests.helpers.xla_env import optimized_compiles

VOCAB = 40


START, EOS = 2, 3  # [CLS] and [SEP] in this tiny vocabulary; words are 4..39


BERT = dataclasses.replace(
    SMALL_BERT,
    vocab_size=VOCAB,
    max_position_embeddings=32,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


CONFIG = s2s.Seq2SeqConfig(BERT, decoder_start_id=START, eos_id=EOS, init=s2s.RND2RND)


def random_params(config=CONFIG, seed=0):
    return random_init(lambda: s2s.init_params(config, jax.random.key(seed)), seed, std=0.02)


def sources(seed, n=4, length=8):
    """[CLS] w.. [SEP] rows of different lengths, and their masks."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, length), np.int32)
    for i in range(n):
        words = rng.integers(4, VOCAB, size=rng.integers(2, length - 1))
        row = [START, *words, EOS]
        ids[i, : len(row)] = row
    return ids, (ids > 0).astype(np.int32)


@functools.partial(jax.jit, static_argnums=4)
def _logits(params, ids, mask, decoder_ids, config):
    model = s2s.Seq2SeqModel(config)
    return model.apply({"params": s2s.full_params(config, params)}, ids, None, mask, decoder_ids)


def logits_of(params, ids, mask, decoder_ids, config=CONFIG):
    return np.asarray(_logits(params, ids, mask, decoder_ids, config))


# Hand-made next-token probabilities that depend on the last token only:
#   after [CLS]: a 0.5, b 0.4, [SEP] 0.1;  after a: [SEP] 0.4, a 0.3, b 0.3;
#   after b: [SEP] 0.9, a 0.05, b 0.05.
# Greedy reads a then [SEP] (p = 0.2); beam search finds b [SEP] (p = 0.36).
A, B = 4, 5


_TABLE = np.full((6, 6), 1e-9, np.float32)


_TABLE[START, [A, B, EOS]] = [0.5, 0.4, 0.1]


_TABLE[A, [EOS, A, B]] = [0.4, 0.3, 0.3]


_TABLE[B, [EOS, A, B]] = [0.9, 0.05, 0.05]


_TABLE[[0, 1, 3]] = 1.0 / 6


def reversal_batch(rng, n, src_len=8, tgt_len=8):
    """Sources [CLS] w1..wk [SEP] (k = 3..6 words), targets the words reversed."""
    ids = np.zeros((n, src_len), np.int32)
    targets = []
    for i in range(n):
        words = rng.integers(4, VOCAB, size=rng.integers(3, 7))
        row = [START, *words, EOS]
        ids[i, : len(row)] = row
        targets.append(words[::-1].tolist())
    features = s2s.target_features(targets, tgt_len, START, EOS)
    return dict(input_ids=ids, input_mask=(ids > 0).astype(np.int32), **features), targets


class Trainer:
    """Adam on the reversal task, from rnd2rnd; keeps the compiled step between tests."""

    def __init__(self):
        self.params = random_params()
        self.optimizer = optax.adamw(3e-3, weight_decay=0.01)
        self.state = self.optimizer.init(self.params)
        self.rng = np.random.default_rng(0)
        self.steps = 0

        def step(params, state, batch):
            def loss(p):
                sums = s2s.batch_loss_sums(CONFIG, p, batch)
                return sums.loss / sums.count

            grads = jax.grad(loss)(params)
            updates, state = self.optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        self._step = jax.jit(step)

    def train_to(self, steps):
        with optimized_compiles():  # hundreds of steps: running, not compiling, dominates
            while self.steps < steps:
                batch, _ = reversal_batch(self.rng, 64)
                self.params, self.state = self._step(self.params, self.state, batch)
                self.steps += 1
        return self.params


@pytest.fixture(scope="module")
def trainer():
    return Trainer()


@pytest.fixture(scope="module")
def half_trained(trainer):
    """Params 150 steps in: outputs vary in length and content, and still make mistakes."""
    return jax.tree.map(np.asarray, trainer.train_to(150))


SEARCHES = [
    dict(num_beams=1),
    dict(num_beams=1, no_repeat_ngram_size=2),
    dict(num_beams=3, length_penalty=1.0),
    dict(num_beams=4, length_penalty=2.0, early_stopping=True, no_repeat_ngram_size=3),
    dict(num_beams=4, length_penalty=0.6, early_stopping="never"),
]
