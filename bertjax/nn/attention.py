"""Scaled dot-product attention on every backend: xla, cuDNN (NVIDIA GPU), splash (TPU).

All implementations take query/key/value as [batch, seq, heads, head_dim] in the compute
dtype and a key padding mask [batch, seq] (1 = real token, 0 = padding), and return
[batch, seq, heads, head_dim]. Scores are scaled by 1/sqrt(head_dim); padded keys get zero
weight; the softmax runs in float32. Rows of padded *queries* carry no meaning but are always
finite, so nothing NaN can leak into a loss through them.

Choosing an implementation (``resolve_implementation``):
  "auto"   TPU -> splash when the shapes allow; NVIDIA GPU with bf16/fp16 -> cudnn; CPU ->
           blocked (one device; documents or a window only without attention dropout);
           else xla.
  "xla"    jax.nn.dot_product_attention(implementation="xla"); with attention dropout active,
           an einsum path that drops attention weights explicitly.
  "blocked" CPU: attention block by block of (example, head) pairs, each block's scores kept
           in cache and recomputed in the backward pass (flash attention's scheme, in XLA);
           with attention dropout too (the same mask as xla's). One device. Documents and
           windows (ModernBERT's layers) run a blocked path of their own, without dropout:
           the mask is made inside each block from the ids and positions, and a window's
           rows attend by chunks against their band of keys, so neither the [seq, seq]
           probabilities nor a [seq, seq] mask ever exist whole; a block whose real queries
           all lie in the first half of its rows computes that half only (padded queries
           past it get zeros).
  "cudnn"  the fused cuDNN flash-attention kernel. Padding is passed as key/value sequence
           lengths (the count of ones in the mask), so the mask must be a prefix of ones, as
           BERT's input_mask always is.
  "splash" the Pallas TPU splash-attention kernel, called inside jax.shard_map so batch and
           heads stay sharded; padding is expressed as segment ids. Off TPU it runs in Pallas
           interpret mode (correct but slow; meant for tests).
Packed rows of several documents pass ``document_ids`` [batch, seq] (1.. per document, 0 for
padding) instead of relying on the padding mask: a query then sees exactly the keys of its
own document (padded queries see padded keys, so rows stay finite). xla builds that mask;
splash takes the ids as its segment ids; blocked compares them inside each block; cuDNN
(padding as sequence lengths) cannot express it, so such a request runs the xla path, the
reason logged once.
A sliding window (``local_window`` w, ModernBERT's local layers: query i sees key j only when
|i - j| <= w) combines with the padding or document mask. xla builds the band mask; splash
gives each head a LocalMask((seq, seq), window_size=(w, w)) and skips the blocks outside the
band; blocked computes chunks of w queries against their 3w keys; cuDNN cannot serve it:
jax's cuDNN attention takes only a one-sided (causal) window and refuses a two-sided one, so
such a request runs the xla path, the reason logged once.
An explicit "cudnn" or "splash" request is served when the kernel can serve it; otherwise
the xla path runs and the reason is logged once (python logging, WARNING). The fused
kernels cannot drop attention weights, so while attention dropout is active (training with
attention_dropout > 0) every request runs the xla path (logged once at INFO).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from bertjax.nn import low_precision, sharding

logger = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "xla", "blocked", "cudnn", "splash")

# Large negative logit for padded keys: finite, so a fully padded row softmaxes to uniform
# weights instead of NaN, and far enough below any real score to contribute exactly 0.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

_logged: set[str] = set()


def _log_once(level: int, message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.log(level, message)


def _platform() -> str:
    """'tpu', 'nvidia' (CUDA GPU), 'gpu' (other GPU) or 'cpu'."""
    backend = jax.default_backend()
    if backend == "gpu":
        version = jax.devices()[0].client.platform_version.lower()
        return "nvidia" if "cuda" in version else "gpu"
    return backend


def _splash_problem(seq_len: int, batch: int, num_heads: int) -> str | None:
    """Why splash cannot serve these shapes under the current mesh, or None."""
    if seq_len % 128:
        return f"sequence length {seq_len} is not a multiple of 128 (splash block size)"
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        batch_shards = sharding.shards(sharding.BATCH)
        head_shards = sharding.shards(sharding.HEADS)
        if batch % batch_shards or num_heads % head_shards:
            return (
                f"batch {batch} / heads {num_heads} do not divide the mesh's "
                f"{batch_shards} batch shards / {head_shards} head shards"
            )
    return None


def _cudnn_problem(
    dtype, head_dim: int, document_mask: bool = False, local_window: int | None = None
) -> str | None:
    """Why cuDNN flash attention cannot serve this dtype/shape/mask, or None."""
    if document_mask:
        return (
            "cuDNN flash attention takes padding as sequence lengths and cannot restrict "
            "attention to each token's document (packed rows)"
        )
    if local_window is not None:
        # jax.nn.dot_product_attention(implementation="cudnn") passes cuDNN one left window
        # length and raises "cuDNN doesn't support right window" for a two-sided window
        # without a causal mask (jax 0.10): an encoder's |i - j| <= w is not expressible.
        return (
            "jax's cuDNN flash attention takes only a one-sided (causal) sliding window, not "
            f"the two-sided window |i - j| <= {local_window}"
        )
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN flash attention needs bfloat16 or float16, got {jnp.dtype(dtype).name}"
    if head_dim % 8 or head_dim > 128:
        return f"cuDNN flash attention needs head_dim a multiple of 8 and <= 128, got {head_dim}"
    return None


def _blocked_problem(
    document_mask: bool, local_window: int | None = None, dropout_active: bool = False
) -> str | None:
    if dropout_active and (document_mask or local_window is not None):
        return "it drops attention weights with a padding mask only, not documents or windows"
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        return f"it runs on one device, the mesh has {mesh.size}"
    return None


def resolve_implementation(
    requested: str,
    *,
    dtype,
    batch: int,
    seq_len: int,
    num_heads: int,
    head_dim: int,
    dropout_active: bool = False,
    document_mask: bool = False,
    local_window: int | None = None,
) -> str:
    """The implementation that will actually run ("xla", "blocked", "cudnn" or "splash").

    ``document_mask``: attention is restricted to each token's document (document_ids).
    ``local_window``: attention is restricted to a sliding window (|i - j| <= local_window).
    """
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {requested!r} is not one of {IMPLEMENTATIONS}")
    platform = _platform()
    if requested in ("auto", "blocked") and platform == "cpu":
        problem = _blocked_problem(document_mask, local_window, dropout_active)
        if problem is None:
            return "blocked"
        if requested == "blocked":
            _log_once(logging.INFO, f"attention 'blocked' falls back to xla: {problem}")
        return "xla"
    if dropout_active:
        if requested != "xla":
            _log_once(
                logging.INFO,
                f"attention {requested!r}: attention dropout is active and the fused kernels "
                "cannot apply it; using the xla path with explicit dropout on the weights",
            )
        return "xla"
    if requested == "auto":
        if platform == "tpu":
            problem = _splash_problem(seq_len, batch, num_heads)
            if problem is None:
                return "splash"
            _log_once(logging.INFO, f"attention 'auto' uses xla, not splash: {problem}")
        elif platform == "nvidia":
            problem = _cudnn_problem(dtype, head_dim, document_mask, local_window)
            if problem is None:
                return "cudnn"
            _log_once(logging.INFO, f"attention 'auto' uses xla, not cudnn: {problem}")
        return "xla"
    if requested == "cudnn":
        problem = (
            f"cuDNN needs an NVIDIA GPU, the backend is {platform!r}"
            if platform != "nvidia"
            else _cudnn_problem(dtype, head_dim, document_mask, local_window)
        )
        if problem:
            _log_once(logging.WARNING, f"attention 'cudnn' falls back to xla: {problem}")
            return "xla"
        return "cudnn"
    if requested == "splash":
        problem = _splash_problem(seq_len, batch, num_heads)
        if problem:
            _log_once(logging.WARNING, f"attention 'splash' falls back to xla: {problem}")
            return "xla"
        if platform != "tpu":
            _log_once(
                logging.WARNING,
                f"attention 'splash' on {platform!r} runs in Pallas interpret mode (slow)",
            )
        return "splash"
    return "xla"


def document_mask(document_ids: jax.Array, query_document_ids: jax.Array | None = None):
    """[batch, 1, q_seq, kv_seq] bool: a query sees the keys of its own document.

    Padding (document 0) sees padding, so no row is empty.
    """
    queries = document_ids if query_document_ids is None else query_document_ids
    return queries[:, None, :, None] == document_ids[:, None, None, :]  # [batch, 1, s, t]


def window_mask(seq_len: int, local_window: int) -> jax.Array:
    """[1, 1, seq, seq] bool: query i sees key j when |i - j| <= local_window.

    Built from iotas on the device (not a numpy constant, which would be embedded in the
    program at seq x seq bytes).
    """
    shape = (seq_len, seq_len)
    query = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    key = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return (jnp.abs(query - key) <= local_window)[None, None]  # [1, 1, s, t]


def _logit_mask(attention_mask, document_ids, query_document_ids, local_window=None, seq_len=0):
    """The mask broadcast against [batch, heads, q_seq, kv_seq] logits, or None."""
    if document_ids is not None:
        keep = document_mask(document_ids, query_document_ids)  # [batch, 1, s, t]
    elif attention_mask is not None:
        keep = attention_mask.astype(bool)[:, None, None, :]  # [batch, 1, 1, kv_seq]
    else:
        keep = None
    if local_window is not None:
        near = window_mask(seq_len, local_window)  # [1, 1, s, t]
        keep = near if keep is None else keep & near  # [batch, 1, s, t]
    return keep


def reference_attention(
    query,
    key,
    value,
    attention_mask=None,
    document_ids=None,
    query_document_ids=None,
    local_window=None,
):
    """Plain einsum attention in float32, the yardstick for every implementation."""
    scale = 1.0 / math.sqrt(query.shape[-1])
    logits = (
        jnp.einsum("bsnd,btnd->bnst", query.astype(jnp.float32), key.astype(jnp.float32)) * scale
    )  # [batch, heads, q_seq, kv_seq]
    keep = _logit_mask(
        attention_mask, document_ids, query_document_ids, local_window, query.shape[1]
    )
    if keep is not None:
        logits = jnp.where(keep, logits, _MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bnst,btnd->bsnd", weights, value.astype(jnp.float32)).astype(query.dtype)


def _mix32(x: jax.Array) -> jax.Array:
    """A 32-bit integer mixer (lowbias32): every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def dropout_keep_mask(rng: jax.Array, keep_prob: float, shape: tuple[int, ...]) -> jax.Array:
    """A Bernoulli(keep_prob) bool mask: a counter-based hash of each element's index.

    jax.random.bernoulli runs threefry (20 rounds) for every element. On CPU the attention
    dropout mask of one [8, 12, 384, 384] micro-batch took about 360 ms a layer that way,
    more than the layer's attention itself; torch draws its masks with a cheaper generator.
    Here the key gives two 32-bit seeds (one threefry call), and each element's 32 random
    bits are two rounds of a 32-bit mixer over its flat index and the seeds: a dozen integer
    operations that XLA fuses into the kernel using the mask (about 20 ms for that shape).
    The indices are computed per axis, so a sharded activation gets a sharded mask. keep_prob
    is rounded to a multiple of 2^-32.
    """
    return _hashed_keep(dropout_seeds(rng), keep_prob, shape)


def dropout_seeds(rng: jax.Array) -> jax.Array:
    """The two 32-bit seeds of a dropout mask (dropout_keep_mask)."""
    return jax.random.bits(rng, (2,), jnp.uint32)


def _hashed_keep(seeds: jax.Array, keep_prob: float, shape: tuple[int, ...], offset=0):
    """The keep mask of the elements of `shape` whose flat indices start at `offset`: a block
    of a larger mask, identical to that mask's elements there."""
    index = jnp.asarray(offset, jnp.uint32) + jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride = (stride * shape[axis]) % 2**32
    bits = _mix32(_mix32(index ^ seeds[0]) + seeds[1])
    threshold = min(round(keep_prob * 2**32), 2**32 - 1)
    return bits < jnp.uint32(threshold)


def _xla_dropout_attention(
    query,
    key,
    value,
    attention_mask,
    dropout_rate,
    dropout_rng,
    document_ids,
    query_document_ids,
    local_window=None,
):
    """Einsum attention that drops attention weights (what the fused kernels cannot do)."""
    scale = 1.0 / math.sqrt(query.shape[-1])
    logits = (
        jnp.einsum("bsnd,btnd->bnst", query, key, preferred_element_type=jnp.float32) * scale
    )  # [batch, heads, q_seq, kv_seq]
    keep = _logit_mask(
        attention_mask, document_ids, query_document_ids, local_window, query.shape[1]
    )
    if keep is not None:
        logits = jnp.where(keep, logits, _MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1)
    keep_prob = 1.0 - dropout_rate
    kept = dropout_keep_mask(dropout_rng, keep_prob, weights.shape)
    weights = jnp.where(kept, weights / keep_prob, 0.0).astype(value.dtype)
    return jnp.einsum("bnst,btnd->bsnd", weights, value)  # [batch, q_seq, heads, head_dim]


# Elements of one block's [heads, q_seq, kv_seq] scores: about 2.4 MB of float32, so that a
# block's logits, weights and their gradients stay in a CPU core's cache.
_BLOCK_ELEMENTS = 600_000


def _block_rows(rows: int, seq_len: int, kv_len: int) -> int:
    """Rows (batch x head pairs) per block: the largest divisor of `rows` within budget."""
    budget = max(1, _BLOCK_ELEMENTS // (seq_len * kv_len))
    return max(d for d in range(1, min(rows, budget) + 1) if rows % d == 0)


def _blocks(x: jax.Array, rows: int) -> jax.Array:
    return x.reshape((x.shape[0] // rows, rows) + x.shape[1:])


def _block_logits(q, k, bias, scale):
    return (
        jnp.einsum("gsd,gtd->gst", q, k, preferred_element_type=jnp.float32) * scale
        + (bias[:, None, :])
    )  # [rows, q_seq, kv_seq]


def _block_keep(seeds, keep_prob, block_index, shape):
    return _hashed_keep(seeds, keep_prob, shape, offset=block_index * math.prod(shape))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _blocked(q, k, v, bias, seeds, keep_prob, rows):
    return _blocked_forward(q, k, v, bias, seeds, keep_prob, rows)[0]


def _blocked_forward(q, k, v, bias, seeds, keep_prob, rows):
    scale = 1.0 / math.sqrt(q.shape[-1])

    def block(args):
        index, q, k, v, bias = args
        logits = _block_logits(q, k, bias, scale)
        top = jnp.max(logits, axis=-1, keepdims=True)
        exp = jnp.exp(logits - top)
        total = jnp.sum(exp, axis=-1, keepdims=True)
        weights = exp / total
        if keep_prob < 1.0:
            keep = _block_keep(seeds, keep_prob, index, weights.shape)
            weights = jnp.where(keep, weights / keep_prob, 0.0)
        out = low_precision.einsum("gst,gtd->gsd", weights.astype(v.dtype), v)
        return out, top + jnp.log(total)

    count = q.shape[0] // rows
    out, lse = jax.lax.map(block, (jnp.arange(count), *(_blocks(x, rows) for x in (q, k, v, bias))))
    out, lse = out.reshape(q.shape), lse.reshape(q.shape[:2] + (1,))
    return out, (q, k, v, bias, seeds, lse)


def _blocked_backward(keep_prob, rows, residuals, grad):
    q, k, v, bias, seeds, lse = residuals
    scale = 1.0 / math.sqrt(q.shape[-1])

    def block(args):
        index, q, k, v, bias, lse, grad = args
        weights = jnp.exp(_block_logits(q, k, bias, scale) - lse)  # the forward's softmax
        dweights = jnp.einsum("gsd,gtd->gst", grad, v, preferred_element_type=jnp.float32)
        if keep_prob < 1.0:
            keep = _block_keep(seeds, keep_prob, index, weights.shape)
            dropped = jnp.where(keep, weights / keep_prob, 0.0)
            dweights = jnp.where(keep, dweights / keep_prob, 0.0)
        else:
            dropped = weights
        dv = low_precision.einsum("gst,gsd->gtd", dropped.astype(grad.dtype), grad)
        # The softmax's backward: dlogits = w * (dw - sum(w * dw)).
        dlogits = weights * (dweights - jnp.sum(weights * dweights, axis=-1, keepdims=True))
        dlogits = (dlogits * scale).astype(q.dtype)
        dq = low_precision.einsum("gst,gtd->gsd", dlogits, k)
        dk = low_precision.einsum("gst,gsd->gtd", dlogits, q)
        return dq, dk, dv

    count = q.shape[0] // rows
    dq, dk, dv = jax.lax.map(
        block,
        (jnp.arange(count), *(_blocks(x, rows) for x in (q, k, v, bias, lse, grad))),
    )
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None, None


_blocked.defvjp(_blocked_forward, _blocked_backward)


def _blocked_attention(query, key, value, attention_mask, keep_prob=1.0, dropout_rng=None):
    """Attention computed block by block of (example, head) pairs, for CPUs.

    XLA runs the plain path as whole-array operations, each [batch, heads, seq, seq] array
    crossing main memory several times; on CPU that cost several times torch's fused kernel.
    Here each block's scores, softmax and weighted sum stay in cache, and the backward pass
    recomputes the block's weights from its saved log-sum-exp (as flash attention does)
    instead of keeping them. Dropout draws the same mask as the xla path
    (dropout_keep_mask over [batch, heads, q_seq, kv_seq]), block by block.
    """
    batch, seq_len, heads, head_dim = query.shape
    kv_len = key.shape[1]

    def rows_of(x):  # [batch, seq, heads, dim] -> [batch * heads, seq, dim]
        return x.transpose(0, 2, 1, 3).reshape(batch * heads, x.shape[1], head_dim)

    if attention_mask is None:
        bias = jnp.zeros((batch, kv_len), jnp.float32)
    else:
        bias = jnp.where(attention_mask.astype(bool), 0.0, _MASK_VALUE)
    bias = jnp.broadcast_to(bias[:, None, :], (batch, heads, kv_len)).reshape(-1, kv_len)
    seeds = dropout_seeds(dropout_rng) if keep_prob < 1.0 else jnp.zeros(2, jnp.uint32)
    rows = _block_rows(batch * heads, seq_len, kv_len)
    out = _blocked(rows_of(query), rows_of(key), rows_of(value), bias, seeds, keep_prob, rows)
    return out.reshape(batch, heads, seq_len, head_dim).transpose(0, 2, 1, 3)


# ---------------------------------------------------------------------------------------------
# Blocked attention with documents and windows (ModernBERT's layers on CPU): each query sees
# the keys of its own document (ids; padding is a document of its own) and, with a window,
# only keys within |i - j| <= window. A row is one (example, head) pair; a block is a few
# rows, whole, or with a window on rows longer than three windows, cut into chunks of
# `window` queries, each against the band of its own and its two neighbours' keys (built
# inside the block), so scores are seq x 3 window, never seq x seq. As `_blocked`, a block's
# scores stay in cache and the backward pass recomputes the weights from the saved
# log-sum-exp. Padding never reaches a real token, so a block computes only as far as its
# last real query needs: the first half of its rows when that holds every real query
# (a quarter of the work; for a band, half of the chunks), nothing when none is real.
# What padded queries past that point get is zeros.


class _Plan(NamedTuple):
    """How `_masked_blocked` cuts its rows: `rows` rows per block, whole, or (band) in
    chunks of `band` queries against their 3 x `band` keys; `spans` the query extents a
    block may be cut to, narrowest first (for a band, multiples of `band`)."""

    rows: int
    band: int | None
    spans: tuple[int, ...]


# Rows shorter than this are not cut: it saves too little to pay for the extra programs.
_SPLIT_MIN_SEQ = 256


def _spans(seq_len: int, unit: int) -> tuple[int, ...]:
    """Nothing, the first half (rounded up to a multiple of unit) or all of a row.

    Each extent is one more program per attention layer to compile: finer cuts (quarters)
    saved a little more per step but cost more compiling than a fine-tuning run won back
    (benchmarks/modernbert.py --finetune reviews).
    """
    if seq_len < _SPLIT_MIN_SEQ:
        return (0, seq_len)
    half = -(-seq_len // (2 * unit)) * unit
    return (0, half, seq_len) if half < seq_len else (0, seq_len)


def _span_index(q_ids, spans):
    """Index into `spans` of the narrowest extent holding every real query (id > 0) of a
    block's query ids [r, s]."""
    positions = jnp.arange(1, q_ids.shape[1] + 1, dtype=jnp.int32)
    extent = jnp.max(jnp.where(q_ids > 0, positions[None, :], 0))  # last real query + 1
    return jnp.minimum(jnp.sum(jnp.asarray(spans, jnp.int32) < extent), len(spans) - 1)


def _on_spans(plan, q_ids, fn, queries, keys, full_shapes):
    """fn(queries, keys) on the block's narrowest span (queries cut along axis 1 to the span,
    keys to the span and, banded, a chunk each side), each result padded back with zeros
    to its full shape (`full_shapes`: (shape, dtype) each)."""

    def run(width, queries, keys):
        if width == 0:
            return tuple(jnp.zeros(shape, dtype) for shape, dtype in full_shapes)
        key_width = width if plan.band is None else width + 2 * plan.band
        cut = fn(
            jax.tree.map(lambda x: x[:, :width], queries),
            jax.tree.map(lambda x: x[:, :key_width], keys),
        )
        return tuple(
            jnp.pad(x, [(0, 0), (0, shape[1] - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
            for x, (shape, _) in zip(cut, full_shapes)
        )

    branches = [functools.partial(run, width) for width in plan.spans]
    return jax.lax.switch(_span_index(q_ids, plan.spans), branches, queries, keys)


def _chunked(queries, keys, band):
    """Rows [r, c w, ...] of queries and [r, (c + 2) w, ...] of keys (a chunk of padding
    each side) -> [r c, w, ...] chunks of queries and [r c, 3 w, ...] their bands of keys."""

    def chunks(x):
        return x.reshape((-1, band) + x.shape[2:])

    def bands(x):
        rows, chunks = x.shape[0], x.shape[1] // band
        parts = x.reshape((rows, chunks, band) + x.shape[2:])  # [r, c + 2, w, ...]
        three = jnp.concatenate([parts[:, :-2], parts[:, 1:-1], parts[:, 2:]], axis=2)
        return three.reshape((-1, 3 * band) + x.shape[2:])  # [r c, 3 w, ...]

    return jax.tree.map(chunks, queries), jax.tree.map(bands, keys)


def _unchunked(x, rows):
    """[r c, w, ...] -> [r, c w, ...]."""
    return x.reshape((rows, -1) + x.shape[2:])


def _folded_bands(x, rows, band):
    """[r c, 3 w, ...] gradients of each chunk's band -> [r, (c + 2) w, ...]: each key's sum
    over the bands it belongs to (its own chunk's and both neighbours')."""
    per_chunk = x.reshape((rows, -1, 3, band) + x.shape[2:])  # [r, c, 3, w, ...]
    rest = [(0, 0)] * (per_chunk.ndim - 4)
    total = sum(
        jnp.pad(per_chunk[:, :, part], [(0, 0), (part, 2 - part), (0, 0)] + rest)
        for part in range(3)
    )  # [r, c + 2, w, ...]
    return total.reshape((rows, -1) + x.shape[2:])


def _masked_logits(q, k, ids, window, scale):
    """[r, s, t] float32 logits of a block (q [r, s, d], k [r, t, d]), masked by document
    and window."""
    q_ids, k_ids, q_pos, k_pos = ids
    logits = jnp.einsum("rsd,rtd->rst", q, k, preferred_element_type=jnp.float32) * scale
    keep = q_ids[:, :, None] == k_ids[:, None, :]  # [r, s, t]
    if window is not None:
        keep = keep & (jnp.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= window)
    return jnp.where(keep, logits, _MASK_VALUE)


def _key_rows(index, plan, arrays):
    """The rows of `arrays` (keys, values and their ids) that block `index` attends to."""
    return tuple(jax.lax.dynamic_slice_in_dim(x, index * plan.rows, plan.rows) for x in arrays)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _masked_blocked(q, k, v, ids, window, plan):
    return _masked_blocked_forward(q, k, v, ids, window, plan)[0]


def _masked_blocked_forward(q, k, v, ids, window, plan):
    scale = 1.0 / math.sqrt(q.shape[-1])
    q_ids, k_ids, q_pos, k_pos = ids

    def attend(queries, keys):
        rows = queries[0].shape[0]
        if plan.band is not None:
            queries, keys = _chunked(queries, keys, plan.band)
        (q, q_ids, q_pos), (k, v, k_ids, k_pos) = queries, keys
        logits = _masked_logits(q, k, (q_ids, k_ids, q_pos, k_pos), window, scale)
        top = jnp.max(logits, axis=-1, keepdims=True)  # [r, s, 1]
        exp = jnp.exp(logits - top)
        total = jnp.sum(exp, axis=-1, keepdims=True)
        out = low_precision.einsum("rst,rtd->rsd", (exp / total).astype(v.dtype), v)  # [r, s, d]
        lse = (top + jnp.log(total))[..., 0]  # [r, s]
        return _unchunked(out, rows), _unchunked(lse, rows)

    def block(args):
        index, q, q_ids, q_pos = args
        keys = _key_rows(index, plan, (k, v, k_ids, k_pos))
        shapes = ((q.shape, v.dtype), (q.shape[:2], jnp.float32))
        return _on_spans(plan, q_ids, attend, (q, q_ids, q_pos), keys, shapes)

    blocked = tuple(_blocks(x, plan.rows) for x in (q, q_ids, q_pos))
    out, lse = jax.lax.map(block, (jnp.arange(blocked[0].shape[0]), *blocked))
    return out.reshape(q.shape), (q, k, v, ids, out, lse)


def _masked_blocked_backward(window, plan, residuals, grad):
    q, k, v, ids, out, lse = residuals  # out and lse in blocks
    scale = 1.0 / math.sqrt(q.shape[-1])
    q_ids, k_ids, q_pos, k_pos = ids

    def gradients(queries, keys):
        rows = queries[0].shape[0]
        if plan.band is not None:
            queries, keys = _chunked(queries, keys, plan.band)
        (q, q_ids, q_pos, out, lse, grad), (k, v, k_ids, k_pos) = queries, keys
        logits = _masked_logits(q, k, (q_ids, k_ids, q_pos, k_pos), window, scale)
        weights = jnp.exp(logits - lse[..., None])  # [r, s, t]: the forward's softmax
        dv = low_precision.einsum("rst,rsd->rtd", weights.astype(grad.dtype), grad)
        dweights = jnp.einsum("rsd,rtd->rst", grad, v, preferred_element_type=jnp.float32)
        # The softmax's backward, with sum(w * dw) = sum(out * grad) over the head size
        # (flash attention's D), which needs no pass over the [s, t] block.
        delta = jnp.sum(out.astype(jnp.float32) * grad.astype(jnp.float32), -1, keepdims=True)
        dlogits = (weights * (dweights - delta) * scale).astype(q.dtype)  # [r, s, t]
        dq = low_precision.einsum("rst,rtd->rsd", dlogits, k)
        dk = low_precision.einsum("rst,rsd->rtd", dlogits, q)
        if plan.band is None:
            return dq, dk, dv
        return (
            _unchunked(dq, rows),
            _folded_bands(dk, rows, plan.band),
            _folded_bands(dv, rows, plan.band),
        )

    def block(args):
        index, q, q_ids, q_pos, out, lse, grad = args
        keys = _key_rows(index, plan, (k, v, k_ids, k_pos))
        shapes = ((q.shape, q.dtype), (keys[0].shape, k.dtype), (keys[1].shape, v.dtype))
        queries = (q, q_ids, q_pos, out, lse, grad)
        return _on_spans(plan, q_ids, gradients, queries, keys, shapes)

    q_blocks, q_ids_blocks, q_pos_blocks, grad_blocks = (
        _blocks(x, plan.rows) for x in (q, q_ids, q_pos, grad)
    )
    indices = jnp.arange(q_blocks.shape[0])
    dq, dk, dv = jax.lax.map(
        block, (indices, q_blocks, q_ids_blocks, q_pos_blocks, out, lse, grad_blocks)
    )
    no_ids = jax.tree.map(lambda _: None, ids)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), no_ids


_masked_blocked.defvjp(_masked_blocked_forward, _masked_blocked_backward)


def _masked_blocked_attention(query, key, value, document_ids, local_window=None):
    """Attention within documents (and a window), blocked for CPUs: [b, s, n, d].

    ``document_ids`` [b, s]: a query sees the keys of its own id only (padding's id 0 sees
    padding, so no row is empty). Rows longer than three windows attend by chunks of
    `local_window` queries against their band of keys (see the section's comment).
    """
    batch, seq, heads, dim = query.shape

    def rows_of(x):  # [b, s, n, d] -> [b n, s, d]: a row per (example, head)
        return x.transpose(0, 2, 1, 3).reshape(batch * heads, seq, dim)

    def per_head(x):  # [b, s] -> [b n, s]
        return jnp.broadcast_to(x[:, None], (batch, heads, seq)).reshape(batch * heads, seq)

    query, key, value = rows_of(query), rows_of(key), rows_of(value)
    document_ids = per_head(document_ids.astype(jnp.int32))
    positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), document_ids.shape)
    if local_window is not None and 0 < local_window and seq > 3 * local_window:
        w = local_window
        chunks = -(-seq // w)

        def padded(x, before, fill):  # [r, s, ...] -> [r, before + chunks w + ..., ...]
            after = chunks * w - seq + (w if before else 0)
            pad = [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2)
            return jnp.pad(x, pad, constant_values=fill)

        # Queries past the row's end are a document (-2) no key belongs to; keys outside
        # the row (a chunk's worth each side) are one (-1) no query belongs to.
        ids = (
            padded(document_ids, 0, -2),
            padded(document_ids, w, -1),
            padded(positions, 0, 0),
            padded(positions, w, 0),
        )
        rows = _block_rows(batch * heads, chunks * w, 3 * w)  # a block holds whole rows
        plan = _Plan(rows=rows, band=w, spans=_spans(chunks * w, w))
        out = _masked_blocked(
            padded(query, 0, 0), padded(key, w, 0), padded(value, w, 0), ids, w, plan
        )[:, :seq]
    else:
        plan = _Plan(_block_rows(batch * heads, seq, seq), band=None, spans=_spans(seq, 8))
        ids = (document_ids, document_ids, positions, positions)
        out = _masked_blocked(query, key, value, ids, local_window, plan)  # [b n, s, d]
    return out.reshape(batch, heads, seq, dim).transpose(0, 2, 1, 3)


def _xla_attention(
    query,
    key,
    value,
    attention_mask,
    document_ids=None,
    query_document_ids=None,
    local_window=None,
):
    mask = _logit_mask(
        attention_mask, document_ids, query_document_ids, local_window, query.shape[1]
    )
    return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")


def _cudnn_attention(query, key, value, attention_mask):
    lengths = None
    if attention_mask is not None:
        # At least one key per row: a fully padded example still gets finite outputs.
        lengths = jnp.maximum(jnp.sum(attention_mask.astype(jnp.int32), axis=-1), 1)  # [batch]
    return jax.nn.dot_product_attention(
        query, key, value, key_value_seq_lengths=lengths, implementation="cudnn"
    )


def _qkv_spec() -> PartitionSpec:
    return sharding.logical_to_spec((sharding.BATCH, sharding.LENGTH, sharding.HEADS, sharding.KV))


def _block_size(seq_len: int) -> int:
    for block in (512, 256, 128):
        if seq_len % block == 0:
            return block
    raise ValueError(f"splash attention needs a sequence length multiple of 128, got {seq_len}")


def _splash_local(query, key, value, segment_ids, *, interpret: bool, local_window=None):
    """Splash attention on one device's shard: [b, s, n, d] with segment ids [b, s]; with a
    local window, each head's mask is the band |i - j| <= local_window (the kernel skips the
    blocks outside it)."""
    _, seq_len, num_heads, head_dim = query.shape
    block = _block_size(seq_len)
    blocks = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    if local_window is None:
        head_mask = splash.FullMask((seq_len, seq_len))
    else:
        head_mask = splash.LocalMask(
            (seq_len, seq_len), window_size=(local_window, local_window), offset=0
        )
    mask = splash.MultiHeadMask([head_mask] * num_heads)
    kernel = splash.make_splash_mha(
        mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    # The kernel does not scale scores; scale the queries instead.
    query = query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype)
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))  # [b, heads, seq, head_dim]

    def one(q1, k1, v1, seg1):
        return kernel(q1, k1, v1, segment_ids=splash.SegmentIds(q=seg1, kv=seg1))

    out = jax.vmap(one)(q, k, v, segment_ids)  # [b, heads, seq, head_dim]
    return jnp.swapaxes(out, 1, 2)  # [b, seq, heads, head_dim]


def _splash_attention(query, key, value, attention_mask, document_ids=None, local_window=None):
    batch, seq_len = query.shape[:2]
    if document_ids is not None:
        # Each document is a segment; padding (0) is one more, as below.
        segment_ids = document_ids.astype(jnp.int32)  # [batch, seq]
    elif attention_mask is None:
        segment_ids = jnp.ones((batch, seq_len), jnp.int32)
    else:
        # Real tokens are segment 1, padding segment 0: real queries see only real keys, and
        # padded queries see only padded keys, so no row is empty (no NaN).
        segment_ids = attention_mask.astype(jnp.int32)  # [batch, seq]
    local = functools.partial(
        _splash_local, interpret=_platform() != "tpu", local_window=local_window
    )
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return local(query, key, value, segment_ids)
    qkv = _qkv_spec()
    seg = PartitionSpec(qkv[0], qkv[1])
    mapped = jax.shard_map(
        local, mesh=mesh, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv, check_vma=False
    )
    return mapped(query, key, value, segment_ids)


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    attention_mask: jax.Array | None = None,
    *,
    implementation: str = "auto",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    document_ids: jax.Array | None = None,
    query_document_ids: jax.Array | None = None,
    local_window: int | None = None,
) -> jax.Array:
    """Multi-head attention [batch, seq, heads, head_dim] with a key padding mask [batch, seq].

    ``dropout_rng`` is required when dropout is active (deterministic=False, rate > 0).
    ``document_ids`` [batch, kv_seq] (0 for padding) restrict each query to its own
    document's keys, in place of the padding mask; ``query_document_ids`` [batch, q_seq] are
    the queries' when there are fewer queries than keys (the xla path only).
    ``local_window`` (the half-width, as many queries as keys): query i sees key j only when
    |i - j| <= local_window, besides the padding or document mask.
    """
    dropout_active = (not deterministic) and dropout_rate > 0.0
    batch, seq_len, num_heads, head_dim = query.shape
    if local_window is not None:
        if not isinstance(local_window, (int, np.integer)) or local_window < 0:
            raise ValueError(
                f"local_window={local_window!r} is invalid: must be a non-negative int (the "
                "window's half-width) or None"
            )
        if key.shape[1] != seq_len:
            raise ValueError(
                f"local_window needs as many queries as keys, got {seq_len} queries and "
                f"{key.shape[1]} keys"
            )
        local_window = int(local_window)
    impl = resolve_implementation(
        implementation,
        dtype=query.dtype,
        batch=batch,
        seq_len=seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        dropout_active=dropout_active,
        document_mask=document_ids is not None,
        local_window=local_window,
    )
    if query_document_ids is not None and impl == "blocked":
        impl = "xla"  # the blocked path's documents have as many queries as keys
    if query_document_ids is not None and impl != "xla":
        raise ValueError("query_document_ids (fewer queries than keys) needs the xla path")
    if impl == "blocked" and (document_ids is not None or local_window is not None):
        if document_ids is None:
            document_ids = (
                jnp.ones((batch, seq_len), jnp.int32)
                if attention_mask is None
                else attention_mask.astype(jnp.int32)  # real tokens 1, padding 0
            )
        return _masked_blocked_attention(query, key, value, document_ids, local_window)
    if impl == "blocked":
        if dropout_active and dropout_rng is None:
            raise ValueError("attention dropout is active but no dropout_rng was given")
        keep_prob = 1.0 - dropout_rate if dropout_active else 1.0
        return _blocked_attention(query, key, value, attention_mask, keep_prob, dropout_rng)
    if dropout_active:
        if dropout_rng is None:
            raise ValueError("attention dropout is active but no dropout_rng was given")
        return _xla_dropout_attention(
            query,
            key,
            value,
            attention_mask,
            dropout_rate,
            dropout_rng,
            document_ids,
            query_document_ids,
            local_window,
        )
    if impl == "cudnn":  # never with a window: see _cudnn_problem
        return _cudnn_attention(query, key, value, attention_mask)
    if impl == "splash":
        return _splash_attention(query, key, value, attention_mask, document_ids, local_window)
    return _xla_attention(
        query, key, value, attention_mask, document_ids, query_document_ids, local_window
    )
