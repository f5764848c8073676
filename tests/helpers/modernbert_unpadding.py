"""ModernBERT's token packing checked against the padded rows: the small config, the batches
(full, nearly empty and one-token rows) and every capability's head, shared by the unit and
integration tests of the unpadded path."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.encoders.modernbert import model as mb_model
from bertjax.tasks.embed import model as embed_model
from bertjax.tasks.labels import model as label_model
from bertjax.tasks.qa import model as qa_model
from tests.helpers.batches import padded_batch
from tests.helpers.modernbert import SMALL

ATOL = 2e-5

# 2 layers: 0 global, 1 local (a window of +-4): each kind of layer once.
CONFIG = dataclasses.replace(SMALL, num_layers=2, global_attn_every_n_layers=2)
# Rows of 32 (local layers banded: longer than 3 windows) and of 10 (one whole-row mask);
# a full row, a nearly empty one, a one-token one and one in between.
SHAPES = {"banded": (32, (32, 2, 1, 19)), "whole_row": (10, (10, 2, 1, 7))}


def batch(seq, lengths, seed=0):
    """(ids, mask) [len(lengths), seq]: [CLS] and random tokens, then padding."""
    ids, mask = padded_batch(
        lengths,
        seq,
        vocab_size=CONFIG.vocab_size,
        first_word=3,
        cls_id=CONFIG.cls_token_id,
        seed=seed,
    )
    return jnp.asarray(ids), jnp.asarray(mask)


def packed_length(mask) -> int:
    """A multiple of 8 that holds every real token, checked to pack (packing_pays)."""
    length = -(-int(mask.sum()) // 8) * 8
    assert mb_model.packing_pays(*mask.shape, length, 1)
    return length


def models(config=CONFIG):
    """name -> every capability's head model on `config`."""
    return {
        "classification_cls": label_model.SequenceClassifier(config, 3),
        "classification_mean": label_model.SequenceClassifier(
            dataclasses.replace(config, classifier_pooling="mean"), 3
        ),
        "token_labels": label_model.TokenClassifier(config, 5),
        "qa": qa_model.QuestionAnswering(config),
        "embed_mean": embed_model.BiEncoder(config, embed_model.MEAN),
        "embed_cls": embed_model.BiEncoder(config, embed_model.CLS),
        "masked_lm": mb_model.MaskedLM(config),
    }


def real_outputs(name, out, mask):
    """What a loss reads: the row's outputs for pooled heads, real tokens' for the others."""
    if name == "qa":
        out = jnp.stack(out, axis=-1)  # [b, s, 2]
    elif name == "masked_lm":
        out = out.mlm_logits  # [b, s, v]
    elif out.ndim == 2:
        return out  # [b, c]
    return jnp.where(mask[..., None].astype(bool), out, 0.0)  # [b, s, c]


def check_packed_equals_padded(name, shape):
    """Outputs, a loss over them and its gradients: packed == padded (to float32 rounding)."""
    seq, lengths = SHAPES[shape]
    ids, mask = batch(seq, lengths)
    model = models()[name]
    params = jax.jit(lambda key: model.init({"params": key}, ids, None, mask))(jax.random.key(1))[
        "params"
    ]
    length = packed_length(mask)
    assert length < mask.size  # packing really runs
    shape_of = jax.eval_shape(
        lambda p: real_outputs(name, model.apply({"params": p}, ids, None, mask), mask), params
    ).shape
    weights = jax.random.normal(jax.random.key(2), shape_of)

    def loss(params, packed_length):
        out = model.apply({"params": params}, ids, None, mask, packed_length=packed_length)
        return jnp.sum(real_outputs(name, out, mask) * weights), out

    grad = jax.value_and_grad(loss, has_aux=True)
    (padded_loss, padded), padded_grads = jax.jit(lambda p: grad(p, None))(params)
    (packed_loss, packed), packed_grads = jax.jit(lambda p: grad(p, length))(params)
    np.testing.assert_allclose(
        real_outputs(name, packed, mask), real_outputs(name, padded, mask), atol=ATOL, rtol=1e-5
    )
    np.testing.assert_allclose(packed_loss, padded_loss, atol=ATOL * 10, rtol=1e-5)
    flat_padded = jax.tree.leaves(padded_grads)
    flat_packed = jax.tree.leaves(packed_grads)
    assert len(flat_packed) == len(flat_padded)
    for a, b in zip(flat_packed, flat_padded):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
