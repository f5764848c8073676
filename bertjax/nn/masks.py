"""The masks attention applies: which keys a query sees (padding, documents, a window) and
which attention weights dropout keeps (a counter-based hash, the same on every path).

Logit masks broadcast against [batch, heads, q_seq, kv_seq] logits: a hidden key's logit
becomes MASK_VALUE. Dropout masks are drawn from a key's two 32-bit seeds and each element's
flat index, so a block of a larger mask (the CPU kernels draw theirs block by block) equals
that mask's elements there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Large negative logit for padded keys: finite, so a fully padded row softmaxes to uniform
# weights instead of NaN, and far enough below any real score to contribute exactly 0.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


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


def logit_mask(attention_mask, document_ids, query_document_ids, local_window=None, seq_len=0):
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


def _mix32(x: jax.Array) -> jax.Array:
    """A 32-bit integer mixer (lowbias32): every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def dropout_keep_mask(rng: jax.Array, keep_prob: float, shape: tuple[int, ...]) -> jax.Array:
    """A Bernoulli(keep_prob) bool mask: a counter-based hash of each element's index.

    jax.random.bernoulli runs threefry (20 rounds) for every element: on CPU an attention
    dropout mask drawn that way takes longer than the layer's attention itself (torch draws
    its masks with a cheaper generator). Here the key gives two 32-bit seeds (one threefry
    call), and each element's 32 random bits are two rounds of a 32-bit mixer over its flat
    index and the seeds: a dozen integer operations that XLA fuses into the kernel using the
    mask.
    The indices are computed per axis, so a sharded activation gets a sharded mask. keep_prob
    is rounded to a multiple of 2^-32.
    """
    return hashed_keep(dropout_seeds(rng), keep_prob, shape)


def dropout_seeds(rng: jax.Array) -> jax.Array:
    """The two 32-bit seeds of a dropout mask (dropout_keep_mask)."""
    return jax.random.bits(rng, (2,), jnp.uint32)


def hashed_keep(seeds: jax.Array, keep_prob: float, shape: tuple[int, ...], offset=0):
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
