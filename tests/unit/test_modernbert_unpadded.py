"""ModernBERT's token packing (``packed_length``): every capability's head gives on real
tokens what the padded rows give (outputs, losses and gradients), for global and local
layers (banded and whole-row local masks), with full, nearly empty and one-token rows."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.encoders import modernbert as mb
from bertjax.encoders import modernbert_family as mf
from bertjax.tasks.embed import model as embed_model
from bertjax.tasks.labels import model as label_model
from bertjax.tasks.qa import model as qa_model

ATOL = 2e-5

# 4 layers: 0 and 3 global, 1 and 2 local (a window of +-4).
CONFIG = mb.ModernBertConfig(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=40,
    num_layers=4,
    num_heads=4,
    max_position_embeddings=64,
    local_attention=8,
    global_rope_theta=1000.0,
    local_rope_theta=100.0,
    pad_token_id=0,
    cls_token_id=1,
    sep_token_id=2,
    dtype="float32",
)
# Rows of 32 (local layers banded: longer than 3 windows) and of 10 (one whole-row mask);
# a full row, a nearly empty one, a one-token one and one in between.
SHAPES = {"banded": (32, (32, 2, 1, 19)), "whole_row": (10, (10, 2, 1, 7))}


def _batch(seq, lengths, seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None] < np.array(lengths)[:, None]).astype(np.int32)  # [b, s]
    ids = rng.integers(3, CONFIG.vocab_size, mask.shape)
    ids[:, 0] = CONFIG.cls_token_id
    return jnp.asarray(np.where(mask == 1, ids, 0), jnp.int32), jnp.asarray(mask)


def _packed_length(mask) -> int:
    length = -(-int(mask.sum()) // 8) * 8  # a multiple of 8 that holds every real token
    assert mb.packing_pays(*mask.shape, length, 1)
    return length


def _models(config):
    """name -> (module, what to compare: outputs -> [b, ...] float32 read on real tokens)."""
    return {
        "classification_cls": label_model.SequenceClassifier(config, 3),
        "classification_mean": label_model.SequenceClassifier(
            dataclasses.replace(config, classifier_pooling="mean"), 3
        ),
        "token_labels": label_model.TokenClassifier(config, 5),
        "qa": qa_model.QuestionAnswering(config),
        "embed_mean": embed_model.BiEncoder(config, embed_model.MEAN),
        "embed_cls": embed_model.BiEncoder(config, embed_model.CLS),
        "masked_lm": mf.MaskedLM(config),
    }


def _real(name, out, mask):
    """The outputs a loss reads: per-row for pooled heads, real tokens for per-token heads."""
    if name == "qa":
        out = jnp.stack(out, axis=-1)  # [b, s, 2]
    if name == "masked_lm":
        out = out.mlm_logits  # [b, s, v]
    if out.ndim == 2 and name != "qa":
        return out  # [b, c]
    return jnp.where(mask[..., None].astype(bool), out, 0.0)  # [b, s, c]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", list(_models(CONFIG)))
def test_packed_equals_padded_outputs_and_gradients(name, shape):
    seq, lengths = SHAPES[shape]
    ids, mask = _batch(seq, lengths)
    model = _models(CONFIG)[name]
    params = model.init({"params": jax.random.key(1)}, ids, None, mask)["params"]
    length = _packed_length(mask)
    assert length < mask.size  # packing really runs
    weights = jax.random.normal(jax.random.key(2), _real(name, model.apply(
        {"params": params}, ids, None, mask), mask).shape)

    def loss(params, packed_length):
        out = model.apply({"params": params}, ids, None, mask, packed_length=packed_length)
        return jnp.sum(_real(name, out, mask) * weights), out

    (padded_loss, padded), padded_grads = jax.value_and_grad(loss, has_aux=True)(params, None)
    (packed_loss, packed), packed_grads = jax.value_and_grad(loss, has_aux=True)(
        params, length
    )
    np.testing.assert_allclose(
        _real(name, packed, mask), _real(name, padded, mask), atol=ATOL, rtol=1e-5
    )
    np.testing.assert_allclose(packed_loss, padded_loss, atol=ATOL * 10, rtol=1e-5)
    flat_padded = jax.tree.leaves(padded_grads)
    flat_packed = jax.tree.leaves(packed_grads)
    assert len(flat_packed) == len(flat_padded)
    for a, b in zip(flat_packed, flat_padded):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_packed_with_documents_scanned_and_rematerialised():
    """Packed pretraining rows (documents, restarting positions) through the scanned and
    rematerialised stack: the packed encoder equals the padded one on real tokens."""
    config = dataclasses.replace(
        CONFIG, num_layers=7, scan_layers=True, remat_policy="full", attention_dropout=0.0
    )
    ids, mask = _batch(32, (32, 30, 5, 1))
    documents = jnp.asarray(np.where(np.arange(32)[None] < 14, 1, 2) * np.asarray(mask))
    positions = jnp.asarray(np.where(np.arange(32) < 14, np.arange(32), np.arange(32) - 14))
    positions = jnp.broadcast_to(positions, ids.shape) * mask
    model = mf.Encoder(config)
    params = model.init({"params": jax.random.key(0)}, ids, None, mask)["params"]

    def run(packed_length):
        sequence, pooled = model.apply(
            {"params": params},
            ids,
            None,
            mask,
            document_ids=documents,
            positions=positions,
            packed_length=packed_length,
            token_head=True,
        )
        return sequence, pooled

    padded, packed = run(None), run(_packed_length(mask))
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(packed[0])[real], np.asarray(padded[0])[real], atol=ATOL)
    np.testing.assert_allclose(packed[1], padded[1], atol=ATOL)


def test_packing_is_skipped_where_it_cannot_pay():
    """A packed length near the rows' slots runs the padded rows (the same program as
    without packing: no gathers), a small one packs."""
    config = CONFIG
    ids, mask = _batch(16, (16, 16, 16, 15))
    model = mb.ModernBertModel(config)
    params = model.init({"params": jax.random.key(0)}, ids, mask)["params"]
    assert not mb.packing_pays(4, 16, 64, 1)
    assert mb.packing_pays(4, 16, 32, 1)

    def jaxpr(packed_length):
        return str(
            jax.make_jaxpr(
                lambda p: model.apply({"params": p}, ids, mask, packed_length=packed_length)
            )(params)
        )

    assert jaxpr(64) == jaxpr(None)
    assert jaxpr(32) != jaxpr(None)
