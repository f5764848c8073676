"""Attention for CPUs, block by block: two custom-VJP kernels that keep each block's scores in
cache and recompute the weights from the saved log-sum-exp in the backward pass (flash
attention's scheme, in XLA). `blocked_attention` takes a padding mask and attention dropout
(the same mask as the xla path's); `masked_blocked_attention` takes documents and a sliding
window (ModernBERT's layers), without dropout. bertjax.nn.attention chooses them ("blocked").
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from bertjax.nn import low_precision
from bertjax.nn.masks import MASK_VALUE, dropout_seeds, hashed_keep

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
    return hashed_keep(seeds, keep_prob, shape, offset=block_index * math.prod(shape))


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


def blocked_attention(query, key, value, attention_mask, keep_prob=1.0, dropout_rng=None):
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
        bias = jnp.where(attention_mask.astype(bool), 0.0, MASK_VALUE)
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
    return jnp.where(keep, logits, MASK_VALUE)


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


def masked_blocked_attention(query, key, value, document_ids, local_window=None):
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
