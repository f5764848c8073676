"""Every attention implementation against a plain einsum reference, with padding."""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bertjax.nn import attention, cpu_attention, sharding
from bertjax.nn.masks import dropout_keep_mask
from tests.helpers.attention_reference import reference_attention

B, S, N, D = 2, 128, 2, 16  # splash needs the sequence to be a multiple of 128
LENGTHS = (100, 128)  # one padded example, one full


def _inputs(dtype=jnp.float32, seq=S, lengths=LENGTHS):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((B, seq, N, D)), dtype) for _ in range(3))
    mask = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    return q, k, v, jnp.asarray(mask)


def _real_rows(x, mask):
    # Padded query rows may hold anything (finite); compare only real ones.
    return np.asarray(x)[np.asarray(mask).astype(bool)]


def _masked_loss(fn, mask):
    shape = (B, mask.shape[1], N, D)
    weights = np.random.default_rng(5).standard_normal(shape) * mask[:, :, None, None]

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v, mask).astype(jnp.float32) * weights)

    return loss


_attend = jax.jit(
    attention.dot_product_attention,
    static_argnames=("implementation", "dropout_rate", "deterministic", "local_window"),
)
_reference = jax.jit(reference_attention, static_argnames=("local_window",))


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch):
    # Fallback reasons are logged once per process; each test wants to see its own.
    monkeypatch.setattr(attention, "_logged", set())


def test_reference_masks_padded_keys():
    q, k, v, mask = _inputs()
    out = _reference(q, k, v, mask)
    # Changing padded keys/values must not change anything.
    k2 = k.at[0, 100:].set(7.0)
    v2 = v.at[0, 100:].set(-3.0)
    out2 = _reference(q, k2, v2, mask)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out2))
    # And the reference is softmax(QK^T/sqrt(d))V on the real keys of example 0.
    qe, ke, ve = (np.asarray(t[0, :, 0], np.float64) for t in (q, k[:, :100], v[:, :100]))
    logits = qe @ ke.T / np.sqrt(D)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(out[0, :, 0]), w @ ve, atol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "blocked", "splash"])
def test_forward_and_grads_match_reference(impl):
    q, k, v, mask = _inputs()
    fn = functools.partial(attention.dot_product_attention, implementation=impl)
    out = jax.jit(fn)(q, k, v, mask)
    ref = _reference(q, k, v, mask)
    assert np.abs(_real_rows(out, mask) - _real_rows(ref, mask)).max() <= 1e-5
    assert np.isfinite(np.asarray(out)).all()
    grads = jax.jit(jax.grad(_masked_loss(fn, mask), argnums=(0, 1, 2)))(q, k, v)
    ref_grads = jax.jit(jax.grad(_masked_loss(reference_attention, mask), argnums=(0, 1, 2)))(
        q, k, v
    )
    for g, r in zip(grads, ref_grads):
        assert np.isfinite(np.asarray(g)).all()
        assert np.abs(np.asarray(g) - np.asarray(r)).max() <= 1e-5


def test_fully_padded_example_is_finite():
    q, k, v, mask = _inputs(lengths=(0, 128))
    for impl in ("xla", "blocked", "splash"):
        out = _attend(q, k, v, mask, implementation=impl)
        assert np.isfinite(np.asarray(out)).all(), impl


def test_splash_under_mesh_uses_shard_map_and_matches():
    q, k, v, mask = _inputs()
    mesh = sharding.make_mesh((2, 1, 2), jax.devices()[:4])
    fn = functools.partial(attention.dot_product_attention, implementation="splash")
    spec = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor")
    )
    with jax.set_mesh(mesh):
        assert "shard_map" in str(jax.make_jaxpr(fn)(q, k, v, mask))
        qs, ks, vs = (jax.device_put(t, spec) for t in (q, k, v))
        out = jax.jit(fn)(qs, ks, vs, mask)
    assert out.sharding.spec[2] == "tensor"  # heads stayed sharded
    ref = _reference(q, k, v, mask)
    assert np.abs(_real_rows(out, mask) - _real_rows(ref, mask)).max() <= 1e-5


def test_dropout_path_drops_weights_and_falls_back(caplog):
    q, k, _, mask = _inputs(seq=16, lengths=(10, 16))
    # One-hot values (head_dim == seq) make the output equal the dropped attention weights.
    v = jnp.broadcast_to(jnp.eye(16)[None, :, None, :], (B, 16, N, D))
    rate = 0.25
    dropped = functools.partial(
        _attend, implementation="splash", dropout_rate=rate, deterministic=False
    )
    with caplog.at_level(logging.INFO, logger="bertjax.nn.attention"):
        out = np.asarray(dropped(q, k, v, mask, dropout_rng=jax.random.PRNGKey(3)))
    assert "attention dropout is active" in caplog.text  # splash cannot drop: xla path

    weights = np.asarray(_reference(q, k, v, mask))  # [b, s, n, t] = softmax weights
    real_key = np.broadcast_to(np.asarray(mask).astype(bool)[:, None, None, :], out.shape)
    assert np.all(out[~real_key] == 0.0)  # padded keys: zero weight
    ratio = out[real_key] / weights[real_key]
    kept = np.isclose(ratio, 1.0 / (1.0 - rate), rtol=1e-4)
    assert np.all(kept | (ratio == 0.0))  # each weight is dropped or rescaled by 1/(1-rate)
    assert 0.65 < kept.mean() < 0.85
    other = np.asarray(dropped(q, k, v, mask, dropout_rng=jax.random.PRNGKey(4)))
    assert np.any((other == 0) != (out == 0))
    # Deterministic calls ignore the rate.
    det = _attend(q, k, v, mask, implementation="xla", dropout_rate=rate)
    np.testing.assert_allclose(np.asarray(det), weights, atol=1e-6)
    with pytest.raises(ValueError, match="dropout_rng"):
        _attend(q, k, v, mask, dropout_rate=rate, deterministic=False)


def test_cudnn_on_cpu_falls_back_to_xla_with_logged_reason(caplog):
    q, k, v, mask = _inputs(dtype=jnp.bfloat16, seq=16, lengths=(10, 16))
    with caplog.at_level(logging.WARNING, logger="bertjax.nn.attention"):
        out = _attend(q, k, v, mask, implementation="cudnn")
    assert "'cudnn' falls back to xla" in caplog.text and "NVIDIA GPU" in caplog.text
    # The xla path itself, bit for bit (the xla path against the reference is tested above).
    np.testing.assert_array_equal(out, _attend(q, k, v, mask, implementation="xla"))


def test_resolution_rules(caplog):
    kw = dict(batch=2, num_heads=2, head_dim=64)
    assert jax.default_backend() == "cpu"
    for dtype in (jnp.float32, jnp.bfloat16):
        # One CPU device: blocked, with or without dropout, with documents or a window;
        # documents or a window with dropout need the xla path.
        for dropout in (False, True):
            assert attention.resolve_implementation(
                "auto", dtype=dtype, seq_len=128, dropout_active=dropout, **kw
            ) == ("blocked")
        for masks in (dict(document_mask=True), dict(local_window=4)):
            assert (
                attention.resolve_implementation("auto", dtype=dtype, seq_len=128, **masks, **kw)
                == "blocked"
            )
            assert (
                attention.resolve_implementation(
                    "auto", dtype=dtype, seq_len=128, dropout_active=True, **masks, **kw
                )
                == "xla"
            )
    # On a mesh of several devices the blocks would not follow the shards: xla.
    with jax.set_mesh(sharding.make_mesh((2, 1, 1), jax.devices()[:2])):
        assert attention.resolve_implementation("auto", dtype=jnp.float32, seq_len=128, **kw) == (
            "xla"
        )
    with jax.set_mesh(sharding.make_mesh((1, 1, 1), jax.devices()[:1])):
        assert attention.resolve_implementation("auto", dtype=jnp.float32, seq_len=128, **kw) == (
            "blocked"
        )
    assert attention.resolve_implementation("xla", dtype=jnp.float32, seq_len=128, **kw) == "xla"
    # Splash serves multiples of 128 only; other lengths fall back with a logged reason.
    with caplog.at_level(logging.WARNING, logger="bertjax.nn.attention"):
        assert (
            attention.resolve_implementation("splash", dtype=jnp.float32, seq_len=100, **kw)
            == "xla"
        )
    assert "not a multiple of 128" in caplog.text
    assert attention.resolve_implementation("splash", dtype=jnp.float32, seq_len=256, **kw) == (
        "splash"
    )
    assert (
        attention.resolve_implementation(
            "splash", dtype=jnp.float32, seq_len=256, dropout_active=True, **kw
        )
        == "xla"
    )
    with pytest.raises(ValueError, match="'flash'.*auto"):
        attention.resolve_implementation("flash", dtype=jnp.float32, seq_len=128, **kw)


def test_splash_falls_back_when_heads_do_not_divide_mesh(caplog):
    mesh = sharding.make_mesh((1, 1, 4), jax.devices()[:4])
    with jax.set_mesh(mesh), caplog.at_level(logging.WARNING, logger="bertjax.nn.attention"):
        impl = attention.resolve_implementation(
            "splash", dtype=jnp.float32, batch=2, seq_len=128, num_heads=2, head_dim=16
        )
    assert impl == "xla"
    assert "head shards" in caplog.text


@pytest.mark.parametrize("shape", [(64, 128, 33), (8, 4, 128, 128)])
def test_dropout_keep_mask_rate_and_independence(shape):
    keep = np.asarray(dropout_keep_mask(jax.random.PRNGKey(0), 0.9, shape))
    assert keep.shape == shape and keep.dtype == bool
    assert abs(keep.mean() - 0.9) < 0.005
    # Neighbours along every axis are independent (the bits hash consecutive indices).
    for axis in range(len(shape)):
        first = np.take(keep, range(0, shape[axis] - 1), axis=axis).ravel()
        second = np.take(keep, range(1, shape[axis]), axis=axis).ravel()
        assert abs(np.corrcoef(first, second)[0, 1]) < 0.02
    # Another key draws another mask, as independent of the first.
    other = np.asarray(dropout_keep_mask(jax.random.PRNGKey(1), 0.9, shape))
    assert abs(np.corrcoef(keep.ravel(), other.ravel())[0, 1]) < 0.02
    # Rates at the edges, as the threshold rounds them.
    assert np.asarray(dropout_keep_mask(jax.random.PRNGKey(2), 1.0, shape)).mean() > 0.999
    assert np.asarray(dropout_keep_mask(jax.random.PRNGKey(2), 0.5, shape)).mean() == (
        pytest.approx(0.5, abs=0.005)
    )


@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_blocked_attention_in_many_blocks_equals_the_xla_path(monkeypatch, rate):
    # A budget of one (example, head) pair per block: 4 blocks, each through the loop.
    monkeypatch.setattr(cpu_attention, "_BLOCK_ELEMENTS", S * S)
    assert cpu_attention._block_rows(B * N, S, S) == 1
    q, k, v, mask = _inputs()
    rng = jax.random.PRNGKey(7)

    def path(impl):
        def fn(q, k, v, mask):
            return attention.dot_product_attention(
                q,
                k,
                v,
                mask,
                implementation=impl,
                dropout_rate=rate,
                dropout_rng=rng,
                deterministic=rate == 0.0,
            )

        return fn

    # With dropout, the xla path's weights dropped by the same mask, block by block.
    blocked, xla = path("blocked"), path("xla")
    out, expected = jax.jit(blocked)(q, k, v, mask), jax.jit(xla)(q, k, v, mask)
    np.testing.assert_allclose(_real_rows(out, mask), _real_rows(expected, mask), atol=1e-5)
    grads = jax.jit(jax.grad(_masked_loss(blocked, mask), argnums=(0, 1, 2)))(q, k, v)
    expected_grads = jax.jit(jax.grad(_masked_loss(xla, mask), argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(grads, expected_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)


def test_blocked_attention_takes_keys_of_another_length():
    q, _, _, _ = _inputs(seq=16, lengths=(10, 16))
    _, k, v, mask = _inputs(seq=40, lengths=(33, 40))
    out = _attend(q, k, v, mask, implementation="blocked")
    np.testing.assert_allclose(out, _reference(q, k, v, mask), atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Sliding windows (ModernBERT's local layers): query i sees key j only when |i - j| <= w.

WINDOW = 16
# Row 0: three documents filling the row; row 1: two documents, then padding (document 0).
DOCUMENT_LENGTHS = ((40, 50, 38), (60, 30))


def _documents():
    ids = np.zeros((B, S), np.int32)
    for row, lengths in enumerate(DOCUMENT_LENGTHS):
        ids[row, : sum(lengths)] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
    return ids


def _keep(mask, document_ids, window):
    """[b, s, t] bool, built in numpy: what each query may see."""
    index = np.arange(S)
    near = np.abs(index[:, None] - index[None, :]) <= window  # [s, t]
    if document_ids is not None:
        return (document_ids[:, :, None] == document_ids[:, None, :]) & near
    return np.asarray(mask).astype(bool)[:, None, :] & near


def _numpy_attention(q, k, v, keep):
    """softmax(QK^T / sqrt(d)) V over the visible keys, in float64 numpy: [b, s, n, d]."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    logits = np.einsum("bsnd,btnd->bnst", q, k) / np.sqrt(D)
    logits = np.where(keep[:, None], logits, -1e30)  # a row that sees nothing: uniform
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnst,btnd->bsnd", weights, v)


def _einsum_attention(q, k, v, keep):
    """The same in jax (float32), differentiable: the gradients' yardstick."""
    logits = jnp.einsum("bsnd,btnd->bnst", q, k) / np.sqrt(D)
    logits = jnp.where(keep[:, None], logits, -1e30)
    return jnp.einsum("bnst,btnd->bsnd", jax.nn.softmax(logits, axis=-1), v)


@pytest.mark.parametrize("masking", ["padding", "documents"])
@pytest.mark.parametrize("impl", ["xla", "splash", "blocked"])
def test_local_window_matches_a_numpy_reference(impl, masking):
    q, k, v, mask = _inputs()
    document_ids = _documents() if masking == "documents" else None
    if document_ids is not None:
        mask = jnp.asarray((document_ids > 0).astype(np.int32))
    keep = _keep(mask, document_ids, WINDOW)

    def fn(q, k, v, mask):
        return attention.dot_product_attention(
            q, k, v, mask, implementation=impl, document_ids=document_ids, local_window=WINDOW
        )

    out = jax.jit(fn)(q, k, v, mask)
    assert np.isfinite(np.asarray(out)).all()
    expected = _numpy_attention(q, k, v, keep)
    assert np.abs(_real_rows(out, mask) - _real_rows(expected, mask)).max() <= 1e-5
    # The window matters: without it the outputs differ.
    whole = _attend(q, k, v, mask, implementation="xla", document_ids=document_ids)
    assert np.abs(_real_rows(whole, mask) - _real_rows(expected, mask)).max() > 1e-2
    # reference_attention agrees too (the yardstick the other tests use).
    ref = _reference(q, k, v, mask, document_ids, local_window=WINDOW)
    assert np.abs(_real_rows(ref, mask) - _real_rows(expected, mask)).max() <= 1e-5

    grads = jax.jit(jax.grad(_masked_loss(fn, mask), argnums=(0, 1, 2)))(q, k, v)
    einsum = functools.partial(lambda q, k, v, mask: _einsum_attention(q, k, v, keep))
    ref_grads = jax.jit(jax.grad(_masked_loss(einsum, mask), argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(grads, ref_grads):
        assert np.isfinite(np.asarray(g)).all()
        assert np.abs(np.asarray(g) - np.asarray(r)).max() <= 1e-5


@pytest.mark.parametrize(
    "seq, window, lengths",
    [(128, None, (128, 1)), (128, 16, (2, 1)), (24, 16, (24, 1)), (24, 5, (3, 24))],
    ids=["global", "banded_nearly_empty", "whole_row_window", "window_one_token_docs"],
)
def test_blocked_documents_and_windows_equal_the_reference_forward_and_backward(
    seq, window, lengths
):
    """The blocked path with documents (and windows: banded where rows are longer than three
    windows, whole rows otherwise) against the float32 einsum reference, outputs and
    gradients, with full, nearly empty and one-token rows and one-token documents."""
    q, k, v, mask = _inputs(seq=seq, lengths=lengths)
    # Row 0: documents of 1, 3 and the rest; row 1 as the mask says (one document).
    documents = np.asarray(mask).copy()
    documents[0, 1:4] = 2
    documents[0, 4 : lengths[0]] = 3
    documents = jnp.asarray(documents)

    def path(impl):
        return lambda q, k, v, mask: attention.dot_product_attention(
            q, k, v, mask, implementation=impl, document_ids=documents, local_window=window
        )

    def reference(q, k, v, mask):
        return _reference(q, k, v, mask, documents, local_window=window)

    out = jax.jit(path("blocked"))(q, k, v, mask)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(
        _real_rows(out, mask), _real_rows(reference(q, k, v, mask), mask), atol=1e-5
    )
    grads = jax.jit(jax.grad(_masked_loss(path("blocked"), mask), argnums=(0, 1, 2)))(q, k, v)
    expected = jax.jit(jax.grad(_masked_loss(reference, mask), argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(grads, expected):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)


# Rows long enough (>= cpu_attention._SPLIT_MIN_SEQ) that each block is cut to its last real
# query.
CUT_SEQ, CUT_ROWS = 320, 4


@functools.cache
def _cut_paths(window):
    """Jitted outputs and gradients of the blocked path and the reference on [4, 320] rows."""

    def blocked(q, k, v, ids):
        return attention.dot_product_attention(
            q, k, v, implementation="blocked", document_ids=ids, local_window=window
        )

    def reference(q, k, v, ids):
        return reference_attention(q, k, v, document_ids=ids, local_window=window)

    def with_grads(fn):
        def loss(q, k, v, ids, weights):
            return jnp.sum(fn(q, k, v, ids) * weights)

        return jax.jit(lambda *a: (fn(*a[:4]), jax.grad(loss, argnums=(0, 1, 2))(*a)))

    return with_grads(blocked), with_grads(reference)


@settings(max_examples=12, deadline=None)
@given(
    lengths=st.lists(st.integers(0, CUT_SEQ), min_size=CUT_ROWS, max_size=CUT_ROWS),
    cuts=st.lists(st.integers(1, CUT_SEQ - 1), max_size=3),
    window=st.sampled_from([None, 16, 100]),
)
@example(lengths=[80, 1, 0, 33], cuts=[2, 3], window=None)
@example(lengths=[80, 1, 0, 33], cuts=[2, 3], window=16)
@example(lengths=[0, 160, 1, 17], cuts=[], window=100)
@example(lengths=[CUT_SEQ, 0, 1, 250], cuts=[100, 101, 260], window=16)
def test_blocked_rows_cut_at_their_last_real_query_equal_the_reference(lengths, cuts, window):
    """Long rows padded anywhere from nothing to everything (one-token and empty rows too),
    row 0 holding documents: the blocked path, which computes a block's first half only when
    that holds its real queries and nothing when it has none (on whole rows, or chunk by
    chunk in a window's band: 16 and 100 are banded, 320 > 3 windows), equals the float32
    reference on real tokens, outputs and gradients; padded queries past the half get
    zeros."""
    rng = np.random.default_rng(sum(lengths))
    q, k, v = (
        jnp.asarray(rng.standard_normal((CUT_ROWS, CUT_SEQ, N, D)), jnp.float32) for _ in range(3)
    )
    real = np.arange(CUT_SEQ)[None, :] < np.asarray(lengths)[:, None]  # [b, s]
    ids = real.astype(np.int32)
    for cut in cuts:  # documents 1, 2, ... in row 0, padding stays 0
        ids[0, cut:] += ids[0, cut:] > 0
    weights = rng.standard_normal(q.shape) * real[:, :, None, None]
    blocked, reference = _cut_paths(window)
    out, grads = blocked(q, k, v, jnp.asarray(ids), weights)
    expected, expected_grads = reference(q, k, v, jnp.asarray(ids), weights)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(expected)[real], atol=1e-5)
    for g, r in zip(grads, expected_grads):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)
    assert np.isfinite(np.asarray(out)).all()
    if max(lengths) <= CUT_SEQ // 2:  # every block is cut to its first half (2 chunks of 100)
        assert not np.asarray(out)[:, 200:].any()


def test_local_window_splash_under_mesh_matches():
    q, k, v, mask = _inputs()
    mesh = sharding.make_mesh((2, 1, 2), jax.devices()[:4])
    fn = functools.partial(
        attention.dot_product_attention, implementation="splash", local_window=WINDOW
    )
    spec = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor")
    )
    with jax.set_mesh(mesh):
        qs, ks, vs = (jax.device_put(t, spec) for t in (q, k, v))
        out = jax.jit(fn)(qs, ks, vs, mask)
    expected = _numpy_attention(q, k, v, _keep(mask, None, WINDOW))
    assert np.abs(_real_rows(out, mask) - _real_rows(expected, mask)).max() <= 1e-5


def test_local_window_with_dropout_drops_inside_the_window_only():
    q, k, _, mask = _inputs(seq=16, lengths=(10, 16))
    v = jnp.broadcast_to(jnp.eye(16)[None, :, None, :], (B, 16, N, D))  # output = weights
    out = np.asarray(
        _attend(
            q,
            k,
            v,
            mask,
            implementation="xla",
            dropout_rate=0.25,
            deterministic=False,
            dropout_rng=jax.random.PRNGKey(3),
            local_window=2,
        )
    )  # [b, s, n, t]
    index = np.arange(16)
    outside = np.abs(index[:, None] - index[None, :]) > 2  # [s, t]
    real_queries = np.asarray(mask).astype(bool)[:, :, None]  # [b, s, 1]
    hidden = np.broadcast_to((outside[None] & real_queries)[:, :, None, :], out.shape)
    assert np.all(out[hidden] == 0.0)  # a real query's weights outside its window
    assert np.all(out[0, :10, :, 10:] == 0.0)  # padded keys
    assert 0.5 < (out[~hidden] > 0).mean() < 1.0  # dropped, but not all, inside


def test_blocked_cannot_drop_weights_with_a_window_and_falls_back_with_the_reason(caplog):
    q, k, v, mask = _inputs()
    with caplog.at_level(logging.INFO, logger="bertjax.nn.attention"):
        out = _attend(
            q,
            k,
            v,
            mask,
            implementation="blocked",
            local_window=WINDOW,
            dropout_rate=0.5,
            dropout_rng=jax.random.key(0),
            deterministic=False,
        )
    assert "'blocked' falls back to xla" in caplog.text and "windows" in caplog.text
    assert np.isfinite(np.asarray(out)).all()
    kw = dict(dtype=jnp.float32, batch=B, seq_len=S, num_heads=N, head_dim=D)
    assert attention.resolve_implementation("auto", **kw) == "blocked"
    assert attention.resolve_implementation("auto", local_window=WINDOW, **kw) == "blocked"


def test_cudnn_on_nvidia_serves_padding_but_not_a_window_or_documents(monkeypatch, caplog):
    monkeypatch.setattr(attention, "_platform", lambda: "nvidia")
    kw = dict(dtype=jnp.bfloat16, batch=B, seq_len=S, num_heads=N, head_dim=64)
    assert attention.resolve_implementation("cudnn", **kw) == "cudnn"
    assert attention.resolve_implementation("auto", **kw) == "cudnn"
    with caplog.at_level(logging.INFO, logger="bertjax.nn.attention"):
        assert attention.resolve_implementation("cudnn", local_window=WINDOW, **kw) == "xla"
        assert "'cudnn' falls back to xla" in caplog.text
        assert "two-sided window |i - j| <= 16" in caplog.text
        caplog.clear()
        assert attention.resolve_implementation("auto", local_window=WINDOW, **kw) == "xla"
        assert "'auto' uses xla, not cudnn" in caplog.text
        caplog.clear()
        assert (
            attention.resolve_implementation("cudnn", local_window=WINDOW, document_mask=True, **kw)
            == "xla"
        )
        assert "each token's document" in caplog.text
        caplog.clear()
        # Logged once: the same reason again says nothing.
        assert attention.resolve_implementation("cudnn", local_window=WINDOW, **kw) == "xla"
        assert caplog.text == ""


def test_jax_cudnn_attention_refuses_a_two_sided_window():
    # Why a window is no request for cuDNN (attention._cudnn_problem): jax passes cuDNN a
    # left window only. If a jax release lifts this, the window can go to cuDNN.
    q, k, v, _ = _inputs(dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="right window"):
        jax.nn.dot_product_attention(
            q, k, v, local_window_size=(WINDOW, WINDOW), implementation="cudnn"
        )


def test_local_window_is_validated():
    q, k, v, mask = _inputs()
    with pytest.raises(ValueError, match="local_window=-1 is invalid"):
        attention.dot_product_attention(q, k, v, mask, local_window=-1)
    with pytest.raises(ValueError, match="as many queries as keys"):
        attention.dot_product_attention(q[:, :1], k, v, mask, local_window=4)
