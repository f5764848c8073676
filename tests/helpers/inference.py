"""A work directory bertjax trained (checkpoints at two steps), its model, held-out sentences,
and how two lists of fill-mask predictions are compared."""

import dataclasses
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import data as data_lib
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.inference import Model
from bertjax.nn import losses
from bertjax.pretrain import samples
from bertjax.text.tokenizer import Tokenizer
from tests.helpers.encoders import SMALL_BERT

ATOL = 1e-4


TRAIN_STEPS = 40


@pytest.fixture(scope="session")
def workdir(tmp_path_factory, synthetic_data) -> pathlib.Path:
    """A work directory holding a model bertjax trained: checkpoints at two steps."""
    data_dir = synthetic_data
    tokenizer = Tokenizer.load(data_dir / "tokenizer.model")
    config = dataclasses.replace(
        SMALL_BERT, vocab_size=tokenizer.vocab_size, num_heads=4, attention_impl="xla"
    )
    model = BertForPreTraining(config)
    init = jax.jit(lambda key: model.init(key, jnp.zeros((1, 8), jnp.int32))["params"])
    params = jax.tree.map(np.asarray, nn.meta.unbox(init(jax.random.key(0))))
    optimizer = optax.adamw(3e-3)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            out = model.apply(
                {"params": p},
                batch["input_ids"],
                batch["segment_ids"],
                batch["input_mask"],
                batch["masked_lm_positions"],
            )
            sums = losses.loss_sums(out.mlm_logits, out.nsp_logits, batch)
            return losses.total_loss(sums, sums.mlm_weight, sums.nsp_count)

        grads = jax.grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    directory = tmp_path_factory.mktemp("workdir")
    loader = data_lib.make_loader(data_dir, split="train", batch_size=16, seed=0)
    meta = {"model_config": config.to_dict(), "tokenizer_fingerprint": tokenizer.fingerprint}
    with checkpoint_lib.Checkpointer(
        directory / "checkpoints", save_interval_steps=TRAIN_STEPS // 2, async_save=False
    ) as checkpointer:
        for i in range(1, TRAIN_STEPS + 1):
            params, opt_state = step(params, opt_state, next(loader))
            checkpointer.save(i, params=params, opt_state=opt_state, meta=meta)
    tokenizer.save(directory / "tokenizer.model")
    return directory


@pytest.fixture(scope="session")
def trained(workdir) -> Model:
    return Model.load(workdir)


@pytest.fixture(scope="session")
def held_out(synthetic_data, trained) -> list[str]:
    """Sentences of the corpus's evaluation documents, which training never saw."""
    return samples.held_out_texts(synthetic_data, trained.tokenizer, count=6)


MASKED = [
    "Paris is the [MASK] of France.",
    "The quick brown [MASK] jumps over the lazy dog.",
    "[MASK] learning models learn patterns from data.",
    "A statement is executed once for each [MASK] in the sequence.",
]


def _assert_same_predictions(ours, theirs):
    """Lists (one per mask) of fill-mask predictions: same tokens, text, scores within 1e-4."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert [p["token"] for p in a] == [p["token"] for p in b]
        np.testing.assert_allclose(
            [p["score"] for p in a], [p["score"] for p in b], atol=ATOL, rtol=0
        )
        assert [p["token_str"] for p in a] == [p["token_str"] for p in b]
        # Up to spacing: sentencepiece trims the spaces a predicted lone "▁" leaves.
        assert [p["sequence"].split() for p in a] == [p["sequence"].split() for p in b]
