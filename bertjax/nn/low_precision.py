"""The encoders' products: low-precision operands, products summed in float32, both ways.

A bfloat16 product given to XLA's CPU compiler as such, `einsum(x, w)` with a bfloat16
result, runs as a float32 product of the widened operands, at float32's speed or below;
asked for a float32 result of the same operands it runs the host's bfloat16 dot
instructions, about twice as fast on a host with AVX512-BF16 (docs/benchmarks.md).
Accelerators sum bfloat16 products in float32 anyway. jax's
own gradient of such a product multiplies the float32 cotangent by a bfloat16 operand,
which XLA's CPU compiler runs as a float32 product; `einsum` here computes both backward
products as the forward one (operands in the low precision, sums in float32), so training
runs at that rate too. float32 operands take jnp.einsum unchanged, bit for bit.

A model's `matmul_dtype` (BertConfig, ModernBertConfig, ElectraConfig) rounds the operands of
its products to that dtype (`operand_dtype` here) while everything else stays in its `dtype`:
a float32 model whose products run at the host's bfloat16 rate, its activations, norms,
softmax and residuals in float32.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import string

import jax
import jax.numpy as jnp
import jaxlib

logger = logging.getLogger(__name__)

# Operand dtypes whose products are summed in float32.
_LOW_PRECISION = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Before jaxlib 0.10, a product narrower than this (m or n) multiplies in float32 on CPU: cut
# into chunks that XNNPACK takes, its sums would be short calls (of at most 5 x its width each).
_NARROWEST = 64


def einsum(spec: str, x: jax.Array, y: jax.Array, out_dtype=None, operand_dtype=None) -> jax.Array:
    """jnp.einsum of two operands, the result in `out_dtype` (default: x's dtype).

    Operands of one low-precision dtype: the products are summed in float32, and the
    gradient's two products are computed the same way from the cotangent cast to that dtype.
    `operand_dtype` (a model's matmul_dtype; None: as given) rounds both operands to it
    first; their gradients come back in the operands' own dtypes. `spec` is explicit
    ("bsh,hnd->bsnd"), every index of an operand in the other or in the result (a
    contraction, as dense layers and attention are).
    """
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    x, y = rounded(operand_dtype, x, y)
    if x.dtype != y.dtype or x.dtype not in _LOW_PRECISION:
        return jnp.einsum(spec, x, y).astype(out_dtype)
    return _summed_in_float32(spec.replace(" ", ""), out_dtype, x, y)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _summed_in_float32(spec: str, out_dtype, x: jax.Array, y: jax.Array) -> jax.Array:
    return _float32_sums(spec, x, y).astype(out_dtype)


def _forward(spec, out_dtype, x, y):
    return _summed_in_float32(spec, out_dtype, x, y), (x, y)


def _backward(spec, out_dtype, residuals, grad):
    x, y = residuals
    x_axes, y_axes, out_axes = _axes(spec)
    grad = grad.astype(x.dtype)
    dx = _float32_sums(f"{out_axes},{y_axes}->{x_axes}", grad, y)
    dy = _float32_sums(f"{x_axes},{out_axes}->{y_axes}", x, grad)
    return dx.astype(x.dtype), dy.astype(y.dtype)


_summed_in_float32.defvjp(_forward, _backward)


def rounded(operand_dtype, *arrays: jax.Array) -> tuple[jax.Array, ...]:
    """`arrays` cast to `operand_dtype` (a model's matmul_dtype), or as given when it is None."""
    if operand_dtype is None:
        return arrays
    return tuple(a.astype(operand_dtype) for a in arrays)


def _axes(spec: str) -> tuple[str, str, str]:
    """The axes of an explicit two-operand spec: (x's, y's, the result's)."""
    operands, out_axes = spec.split("->")
    x_axes, y_axes = operands.split(",")
    return x_axes, y_axes, out_axes


def _float32_sums(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """The float32 result of `spec` on two low-precision operands, summed in float32."""
    if jax.default_backend() != "cpu":
        return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32)
    x_axes, y_axes, out_axes = _axes(spec)
    sizes = dict(zip(x_axes, x.shape)) | dict(zip(y_axes, y.shape))
    batch = [a for a in x_axes if a in y_axes and a in out_axes]
    summed = [a for a in x_axes if a in y_axes and a not in out_axes]
    x_kept = [a for a in x_axes if a not in y_axes]
    y_kept = [a for a in y_axes if a not in x_axes]
    m, k, n = (math.prod(sizes[a] for a in group) for group in (x_kept, summed, y_kept))
    # jaxlib 0.10's CPU runtime takes any row-major [g, m, k] x [g, k, n] bfloat16 product
    # with a float32 result (YNNPACK's bfloat16 dots on a host with AVX512-BF16; without that
    # library it widens them to float32), narrow ones (attention's head_dim 32) and long
    # sums (a weight's gradient over a batch's tokens) alike faster than float32. Earlier
    # runtimes ran one with XNNPACK only for k below 6m and 6n and failed on any other
    # ("Unsupported element type for DotThunk"): for them a longer sum is cut into chunks
    # that XNNPACK takes, their products added in float32, and a narrow product (m or n
    # under 64) multiplies in float32. Any host without AVX512-BF16 multiplies in float32.
    if not _bfloat16_dots() or x.dtype != jnp.bfloat16:
        if x.dtype == jnp.bfloat16:  # the host, not the dtype, sends it here
            _note_float32_products()
        return jnp.einsum(spec, x.astype(jnp.float32), y.astype(jnp.float32))
    if _any_bfloat16_dot():
        chunks = 1
    elif min(m, n) < _NARROWEST:
        return jnp.einsum(spec, x.astype(jnp.float32), y.astype(jnp.float32))
    else:
        chunks = -(-k // (5 * min(m, n)))  # ceil

    def merged(operand, axes, groups):
        order = [axes.index(a) for group in groups for a in group]
        shape = [math.prod(sizes[a] for a in group) for group in groups]
        return jnp.transpose(operand, order).reshape(shape)

    lhs = merged(x, x_axes, (batch, x_kept, summed))  # [g, m, k]
    rhs = merged(y, y_axes, (batch, summed, y_kept))  # [g, k, n]
    if chunks > 1:  # [g * chunks, m, width] x [g * chunks, width, n]
        width = -(-k // chunks)
        pad = chunks * width - k  # zeros add nothing to a sum
        lhs = jnp.pad(lhs, ((0, 0), (0, 0), (0, pad))).reshape(-1, m, chunks, width)
        lhs = jnp.transpose(lhs, (0, 2, 1, 3)).reshape(-1, m, width)
        rhs = jnp.pad(rhs, ((0, 0), (0, pad), (0, 0))).reshape(-1, width, n)
    # The barrier keeps XLA from folding a transpose into the product (a transposed
    # left-hand side is not XNNPACK's).
    product = jax.lax.dot_general(
        jax.lax.optimization_barrier(lhs),
        rhs,
        (((2,), (1,)), ((0,), (0,))),
        preferred_element_type=jnp.float32,
    )  # [g * chunks, m, n]
    product = product.reshape(-1, chunks, m, n).sum(axis=1)  # [g, m, n]
    axes = batch + x_kept + y_kept
    product = product.reshape([sizes[a] for a in axes])
    order = [axes.index(a) for a in out_axes]
    if order != sorted(order):
        # Nor a transposed result: XLA would fold it in by swapping the operands, the new
        # left-hand side transposed (an embedding table's gradient in a train step did).
        product = jax.lax.optimization_barrier(product)
    return jnp.transpose(product, order)


@functools.cache
def _any_bfloat16_dot() -> bool:
    """Whether XLA's CPU runtime takes every bfloat16 product with a float32 result (jaxlib
    0.10 on; see `_float32_sums`)."""
    version = tuple(int(part) for part in re.findall(r"\d+", jaxlib.__version__)[:2])
    return version >= (0, 10)


@functools.cache
def _bfloat16_dots() -> bool:
    """Whether this host's CPU has AVX512-BF16's dot instructions (Linux's cpuinfo says)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in f)
    except OSError:
        return False


@functools.cache
def _note_float32_products() -> None:
    """Says once that bfloat16 operands buy no speed on this host: a user who set
    matmul_dtype (or dtype) to bfloat16 for speed keeps its rounding and not its rate."""
    logger.warning(
        "this CPU has no AVX512-BF16 dot instructions: bfloat16 products multiply as float32 "
        "(their operands still rounded to bfloat16), at float32's speed: here a bfloat16 "
        "matmul_dtype (or dtype) changes the numbers but not the time"
    )


def dot_general(
    lhs,
    rhs,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    operand_dtype=None,
):
    """lax.dot_general's signature (flax's `nn.Dense(dot_general=...)`) through `einsum`:
    low-precision operands summed in float32 both ways, anything else lax.dot_general.
    `operand_dtype` as `einsum`'s (bind it with functools.partial); the result keeps lhs's
    dtype unless preferred_element_type says otherwise."""
    if operand_dtype is not None:
        out_dtype = preferred_element_type or lhs.dtype
        return einsum(
            _spec(dimension_numbers, lhs.ndim, rhs.ndim), lhs, rhs, out_dtype, operand_dtype
        )
    if lhs.dtype != rhs.dtype or lhs.dtype not in _LOW_PRECISION:
        return jax.lax.dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
        )
    return einsum(_spec(dimension_numbers, lhs.ndim, rhs.ndim), lhs, rhs, preferred_element_type)


def _spec(dimension_numbers, lhs_ndim: int, rhs_ndim: int) -> str:
    """The einsum spec of a dot_general: batch axes, then lhs's free axes, then rhs's."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    letters = iter(string.ascii_letters)
    lhs = [next(letters) for _ in range(lhs_ndim)]
    rhs = [next(letters) for _ in range(rhs_ndim)]
    for i, j in zip(lhs_contract, rhs_contract):
        rhs[j] = lhs[i]
    for i, j in zip(lhs_batch, rhs_batch):
        rhs[j] = lhs[i]
    batch = [lhs[i] for i in lhs_batch]
    free_lhs = [a for i, a in enumerate(lhs) if i not in lhs_contract and i not in lhs_batch]
    free_rhs = [a for j, a in enumerate(rhs) if j not in rhs_contract and j not in rhs_batch]
    return f"{''.join(lhs)},{''.join(rhs)}->{''.join(batch + free_lhs + free_rhs)}"
