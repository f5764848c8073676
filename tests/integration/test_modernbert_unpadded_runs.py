"""ModernBERT's token packing (``packed_length``) against the padded rows, for every
capability's head: outputs, losses and gradients on real tokens, global and local layers
(banded and whole-row local masks), full, nearly empty and one-token rows; and packed
pretraining documents through the scanned, rematerialised stack."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.encoders.modernbert import model as mb_model
from tests.helpers import modernbert_unpadding as unpadding


@pytest.mark.parametrize("shape", unpadding.SHAPES)
@pytest.mark.parametrize("name", list(unpadding.models()))
def test_packed_equals_padded_outputs_and_gradients(name, shape):
    unpadding.check_packed_equals_padded(name, shape)


def test_packed_with_documents_scanned_and_rematerialised():
    """Packed pretraining rows (documents, restarting positions) through the scanned and
    rematerialised stack: the packed encoder equals the padded one on real tokens."""
    # Layer 0, then two scanned groups of a global and a local layer.
    config = dataclasses.replace(unpadding.CONFIG, num_layers=5, scan_layers=True)
    config = dataclasses.replace(config, remat_policy="full")
    ids, mask = unpadding.batch(32, (32, 30, 5, 1))
    documents = jnp.asarray(np.where(np.arange(32)[None] < 14, 1, 2) * np.asarray(mask))
    positions = jnp.asarray(np.where(np.arange(32) < 14, np.arange(32), np.arange(32) - 14))
    positions = jnp.broadcast_to(positions, ids.shape) * mask
    model = mb_model.Encoder(config)
    params = model.init({"params": jax.random.key(0)}, ids, None, mask)["params"]

    def run(packed_length):
        return model.apply(
            {"params": params},
            ids,
            None,
            mask,
            document_ids=documents,
            positions=positions,
            packed_length=packed_length,
            token_head=True,
        )  # (sequence [b, s, h], pooled [b, h])

    padded, packed = run(None), run(unpadding.packed_length(mask))
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(
        np.asarray(packed[0])[real], np.asarray(padded[0])[real], atol=unpadding.ATOL
    )
    np.testing.assert_allclose(packed[1], padded[1], atol=unpadding.ATOL)
