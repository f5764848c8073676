"""ModernBERT's token packing (``packed_length``): the rule that skips it where it cannot
pay, and one head against the padded rows (tests/integration/test_modernbert_unpadded_runs.py
checks every capability's head, both row shapes, documents, scan and remat)."""

import jax

from bertjax.encoders.modernbert import model as mb_model
from tests.helpers import modernbert_unpadding as unpadding


def test_mean_embeddings_packed_equal_padded_with_global_and_banded_local_layers():
    unpadding.check_packed_equals_padded("embed_mean", "banded")


def test_packing_is_skipped_where_it_cannot_pay():
    """A packed length near the rows' slots runs the padded rows (the same program as
    without packing: no gathers), a small one packs."""
    ids, mask = unpadding.batch(16, (16, 16, 16, 15))
    model = mb_model.ModernBertModel(unpadding.CONFIG)
    params = jax.eval_shape(lambda: model.init({"params": jax.random.key(0)}, ids, mask))
    params = params["params"]  # shapes only: the programs are compared, not run
    assert not mb_model.packing_pays(4, 16, 64, 1)
    assert mb_model.packing_pays(4, 16, 32, 1)

    def jaxpr(packed_length):
        return str(
            jax.make_jaxpr(
                lambda p: model.apply({"params": p}, ids, mask, packed_length=packed_length)
            )(params)
        )

    assert jaxpr(64) == jaxpr(None)
    assert jaxpr(32) != jaxpr(None)
