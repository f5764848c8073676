"""bertjax.nn.low_precision: low-precision products summed in float32, forward and backward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.nn import low_precision

# Sums of hundreds of products, where one kept in bfloat16 would round on the way.
SPECS = [
    ("bsh,hnd->bsnd", (2, 64, 256), (256, 4, 32)),
    ("bsnd,ndh->bsh", (2, 64, 4, 32), (4, 32, 256)),
    ("bsnd,btnd->bnst", (2, 64, 4, 128), (2, 96, 4, 128)),
    ("bph,vh->bpv", (2, 48, 256), (300, 256)),
    # Two batch axes, and a gradient ("bcqnd,bcnqt->bctnd") summing over a left-hand axis
    # that is not its last: XLA's CPU runtime fails on such a bfloat16 product unless it is
    # laid out as [g, m, k] x [g, k, n] first.
    ("bcqnd,bctnd->bcnqt", (2, 3, 16, 2, 128), (2, 3, 48, 2, 128)),
    # A weight's gradient: a sum over 1,201 tokens (before jaxlib 0.10, cut into chunks, the
    # last padded).
    ("bsh,bsf->hf", (1, 1201, 64), (1, 1201, 96)),
    # Narrow products: attention's weighted sum at head_dim 32, a two-class head.
    ("gst,gtd->gsd", (8, 96, 96), (8, 96, 32)),
    ("bsh,hc->bsc", (2, 40, 64), (64, 2)),
]


@pytest.fixture(params=["any bfloat16 dot", "dots XNNPACK takes"])
def runtime(request, monkeypatch):
    """Both of `products`' rules: jaxlib 0.10's runtime, which takes every bfloat16 product,
    and the earlier one's chunks and float32 narrow products (which this runtime runs too)."""
    monkeypatch.setattr(
        low_precision, "_any_bfloat16_dot", lambda: request.param == "any bfloat16 dot"
    )
    return request.param


def _operands(x_shape, y_shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=x_shape).astype(np.float32), rng.normal(size=y_shape).astype(np.float32)


@pytest.mark.parametrize("spec, x_shape, y_shape", SPECS)
def test_float32_operands_take_jnp_einsum_bit_for_bit(spec, x_shape, y_shape):
    x, y = _operands(x_shape, y_shape)
    np.testing.assert_array_equal(low_precision.einsum(spec, x, y), jnp.einsum(spec, x, y))
    got = jax.grad(lambda x, y: jnp.sum(low_precision.einsum(spec, x, y) ** 2), (0, 1))(x, y)
    want = jax.grad(lambda x, y: jnp.sum(jnp.einsum(spec, x, y) ** 2), (0, 1))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _within_one_step(got, want):
    want = np.asarray(jnp.asarray(want, jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), want, rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("spec, x_shape, y_shape", SPECS)
def test_bfloat16_products_are_summed_in_float32_both_ways(
    spec, x_shape, y_shape, optimized, runtime
):
    """Forward and gradients are float32's sums of the same bfloat16-rounded operands (the
    cotangent rounded as it enters), rounded once to bfloat16: within one bfloat16 step (the
    host's bfloat16 dot instructions sum in another order, so a sum on a rounding boundary may
    round the other way). Compiled as a user's programs are (`optimized`): XLA's rewrites
    decide which layouts its CPU runtime is handed."""
    x, y = _operands(x_shape, y_shape, seed=1)
    x16, y16 = jnp.asarray(x, jnp.bfloat16), jnp.asarray(y, jnp.bfloat16)
    x32, y32 = x16.astype(jnp.float32), y16.astype(jnp.float32)
    out = low_precision.einsum(spec, x16, y16)
    assert out.dtype == jnp.bfloat16
    want = jnp.einsum(spec, x32, y32, precision="highest").astype(jnp.bfloat16)
    _within_one_step(out, want)
    assert low_precision.einsum(spec, x16, y16, jnp.float32).dtype == jnp.float32

    cotangent = jnp.asarray(np.random.default_rng(2).normal(size=out.shape), jnp.bfloat16)
    _, pullback = jax.vjp(lambda a, b: low_precision.einsum(spec, a, b), x16, y16)
    dx, dy = pullback(cotangent)
    _, reference = jax.vjp(lambda a, b: jnp.einsum(spec, a, b, precision="highest"), x32, y32)
    want_dx, want_dy = reference(cotangent.astype(jnp.float32))
    assert dx.dtype == dy.dtype == jnp.bfloat16
    _within_one_step(dx, want_dx)
    _within_one_step(dy, want_dy)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_through_products_equals_flax_dense(dtype):
    """nn.Dense(dot_general=low_precision.dot_general): float32 as flax's own, bit for bit;
    bfloat16 as flax's in float32 from the same rounded operands, the product rounded once to
    bfloat16 and the bias then added in bfloat16 (flax's Dense adds it in its dtype)."""
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 5, 8)), jnp.float32)
    plain = nn.Dense(6, dtype=dtype)
    params = plain.init(jax.random.key(0), x)
    got = nn.Dense(6, dtype=dtype, dot_general=low_precision.dot_general).apply(params, x)
    if dtype == jnp.float32:
        np.testing.assert_array_equal(got, plain.apply(params, x))
        return
    rounded = jax.tree.map(lambda a: a.astype(jnp.bfloat16).astype(jnp.float32), params)
    product = nn.Dense(6, use_bias=False, precision="highest").apply(
        {"params": {"kernel": rounded["params"]["kernel"]}},
        x.astype(jnp.bfloat16).astype(jnp.float32),
    )
    want = product.astype(jnp.bfloat16) + params["params"]["bias"].astype(jnp.bfloat16)
    assert got.dtype == jnp.bfloat16
    _within_one_step(got, want.astype(jnp.float32))


@pytest.mark.parametrize("spec, x_shape, y_shape", SPECS[:2] + SPECS[-1:])
def test_operand_dtype_rounds_float32_operands_and_keeps_float32_around_them(
    spec, x_shape, y_shape, optimized
):
    """A float32 model's products in bfloat16 (matmul_dtype): the result is float32's sum of
    the rounded operands, not rounded again; the gradients come back in float32, each the
    float32 sum of the rounded cotangent and the other rounded operand."""
    x, y = _operands(x_shape, y_shape, seed=4)
    x16, y16 = jnp.asarray(x, jnp.bfloat16), jnp.asarray(y, jnp.bfloat16)
    out = low_precision.einsum(spec, x, y, operand_dtype=jnp.bfloat16)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, low_precision.einsum(spec, x16, y16, jnp.float32))
    assert not np.array_equal(out, jnp.einsum(spec, x, y))  # the operands were rounded
    cotangent = jnp.asarray(np.random.default_rng(5).normal(size=out.shape), jnp.float32)
    _, pullback = jax.vjp(lambda a, b: low_precision.einsum(spec, a, b, None, jnp.bfloat16), x, y)
    dx, dy = pullback(cotangent)
    _, rounded_pullback = jax.vjp(
        lambda a, b: low_precision.einsum(spec, a, b, jnp.float32), x16, y16
    )
    want_dx, want_dy = rounded_pullback(cotangent)
    assert dx.dtype == dy.dtype == jnp.float32
    np.testing.assert_array_equal(dx, want_dx.astype(jnp.float32))
    np.testing.assert_array_equal(dy, want_dy.astype(jnp.float32))


def test_dense_with_an_operand_dtype_rounds_its_operands_only():
    x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 5, 96)), jnp.float32)
    plain = nn.Dense(80)
    params = plain.init(jax.random.key(0), x)
    dot = functools.partial(low_precision.dot_general, operand_dtype=jnp.bfloat16)
    got = nn.Dense(80, dot_general=dot).apply(params, x)
    assert got.dtype == jnp.float32
    rounded = jax.tree.map(lambda a: a.astype(jnp.bfloat16).astype(jnp.float32), params)
    rounded["params"]["bias"] = params["params"]["bias"]  # the bias is added, not multiplied
    want = nn.Dense(80, precision="highest").apply(
        rounded, x.astype(jnp.bfloat16).astype(jnp.float32)
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec, x_shape, y_shape", SPECS[-3:])
def test_products_run_in_bfloat16_whole_where_the_runtime_takes_them(spec, x_shape, y_shape):
    """On jaxlib 0.10 with the host's bfloat16 dot instructions, a narrow product and a long
    sum are one bfloat16 product each, neither widened to float32 nor cut into chunks."""
    x16, y16 = (jnp.asarray(a, jnp.bfloat16) for a in _operands(x_shape, y_shape))
    hlo = jax.jit(lambda a, b: low_precision.einsum(spec, a, b)).lower(x16, y16).as_text()
    dots = [line for line in hlo.splitlines() if "stablehlo.dot_general" in line]
    assert len(dots) == 1, dots
    takes_bfloat16 = low_precision._any_bfloat16_dot() and low_precision._bfloat16_dots()
    operands = dots[0].split(" : (")[1].split(") -> ")[0]  # "tensor<...>, tensor<...>"
    assert operands.count("xbf16>") == (2 if takes_bfloat16 else 0), dots[0]
    if takes_bfloat16:
        assert "stablehlo.pad" not in hlo  # not cut into chunks


def test_a_host_without_bfloat16_dots_multiplies_in_float32_and_says_so_once(monkeypatch, caplog):
    """Without AVX512-BF16, bfloat16 operands are widened to float32 (their rounding kept),
    and the log says once that the setting changes the numbers but not the speed."""
    monkeypatch.setattr(low_precision, "_bfloat16_dots", lambda: False)
    low_precision._note_float32_products.cache_clear()
    x, y = _operands((2, 40, 64), (64, 32))
    x16, y16 = jnp.asarray(x, jnp.bfloat16), jnp.asarray(y, jnp.bfloat16)
    with caplog.at_level("WARNING", logger=low_precision.__name__):
        for _ in range(2):
            hlo = jax.jit(lambda a, b: low_precision.einsum("bsh,hc->bsc", a, b)).lower(x16, y16)
            got = low_precision.einsum("bsh,hc->bsc", x16, y16, jnp.float32)
    assert "xbf16>" not in next(
        line for line in hlo.as_text().splitlines() if "stablehlo.dot_general" in line
    )
    want = np.einsum("bsh,hc->bsc", np.asarray(x16, np.float32), np.asarray(y16, np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    notes = [r for r in caplog.records if "AVX512-BF16" in r.getMessage()]
    assert len(notes) == 1, notes
    low_precision._note_float32_products.cache_clear()
