"""ModernBERT's attention masks: global, sliding-window and banded, and the kernels' masks.

Local layers of rows longer than three windows attend by chunks (`banded_mask`,
`_banded_attention`): each chunk of a window's queries against its own and its two
neighbours' keys, seq x 3 window scores instead of seq x seq, with the same weights.

Attention kernels (``config.attention_impl``, bertjax.nn.attention; not a transformers
field): for each kind of layer (global, local) `layer_masks` asks
bertjax.nn.attention.resolve_implementation, once per forward. Where it picks a kernel,
those layers call bertjax.nn.attention.dot_product_attention with the padding mask, the segment
ids as document ids and, on local layers, the window, instead of building boolean masks:
blocked on one CPU device (both kinds of layer, documents and windows; "auto"'s choice
there), splash on TPUs (both kinds of layer: a LocalMask band
per head, documents as segment ids; sequences a multiple of 128), cuDNN on NVIDIA GPUs in
bf16/fp16 (global layers of rows without documents only: jax's cuDNN attention takes
neither a two-sided window nor documents; those layers keep the einsum path, the reason
logged once). Everything else runs
the einsum path above, bit for bit as without the option: "xla", several CPU devices,
attention dropout active (the kernels cannot drop weights). On real tokens both paths give
the same weights; a padded query's row differs (it sees padding on a kernel, nothing here),
and nothing reads it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.encoders.modernbert.config import KERNELS, ModernBertConfig
from bertjax.nn import attention as attention_lib
from bertjax.nn import low_precision

# Large negative logit for masked keys: finite, so a query with no visible key softmaxes to
# uniform weights instead of NaN, and far enough below any real score to weigh exactly 0.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def attention_masks(
    attention_mask: jax.Array, segment_ids: jax.Array | None, window: int
) -> tuple[jax.Array, jax.Array]:
    """(global, local) boolean masks: query s may attend to key t.

    A key must be a real token (attention_mask) of the query's segment; local layers also
    need |s - t| <= window. Positions within the row set the window: documents are
    contiguous, so a row distance within one document is that document's distance.

    The global mask is [batch, seq, seq]. The local one is too for short rows; for rows longer
    than three windows it is banded (`banded_mask`): [batch, chunks, window, 3 * window], each
    chunk of `window` queries against the keys of its own and its two neighbouring chunks, so
    that local layers compute seq x 3 window scores instead of seq x seq.
    """
    visible = global_mask(attention_mask, segment_ids)
    return visible, local_mask(attention_mask, segment_ids, window, visible)


def global_mask(attention_mask: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """[batch, seq, seq] bool: key t is a real token of query s's segment."""
    batch, seq = attention_mask.shape
    visible = jnp.broadcast_to(attention_mask.astype(bool)[:, None, :], (batch, seq, seq))
    if segment_ids is not None:
        visible = visible & (segment_ids[:, :, None] == segment_ids[:, None, :])  # [b, s, t]
    return visible


def local_mask(
    attention_mask: jax.Array,
    segment_ids: jax.Array | None,
    window: int,
    visible: jax.Array | None = None,
) -> jax.Array:
    """The local layers' mask (see attention_masks); ``visible``: global_mask's, if made."""
    seq = attention_mask.shape[1]
    if is_banded(seq, window):
        return banded_mask(attention_mask, segment_ids, window)
    if visible is None:
        visible = global_mask(attention_mask, segment_ids)
    index = np.arange(seq)
    near = np.abs(index[:, None] - index[None, :]) <= window  # [s, t]
    return visible & near[None]


class KernelMasks(NamedTuple):
    """What a layer on a fused kernel (bertjax.nn.attention's cudnn or splash) gets in place of
    a boolean mask: the padding mask and the document ids (1.. per document, 0 for padding;
    None without documents), both [batch, seq]. The kernels mask block by block from these
    (and the window, which the layer knows), so no [seq, seq] mask is made for them."""

    attention_mask: jax.Array
    document_ids: jax.Array | None


def attention_kernel(
    config: ModernBertConfig,
    batch: int,
    seq: int,
    *,
    deterministic: bool,
    documents: bool,
    local_window: int | None,
) -> str | None:
    """The kernel ("blocked", "cudnn" or "splash") one kind of layer runs on, or None for
    ModernBERT's own einsum path: bertjax.nn.attention.resolve_implementation's choice for
    config.attention_impl (which logs, once, why a requested kernel cannot serve)."""
    impl = attention_lib.resolve_implementation(
        config.attention_impl,
        dtype=jnp.dtype(config.dtype),
        batch=batch,
        seq_len=seq,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        dropout_active=not deterministic and config.attention_dropout > 0,
        document_mask=documents,
        local_window=local_window,
    )
    return impl if impl in KERNELS else None


def layer_masks(
    config: ModernBertConfig,
    attention_mask: jax.Array,
    segment_ids: jax.Array | None,
    deterministic: bool,
) -> tuple[Any, Any]:
    """(global, local) masks for the layers: for each kind of layer, KernelMasks where it runs
    on a fused kernel (`attention_kernel`), else the boolean mask of `attention_masks`.

    Made once per forward, outside nn.scan and remat, and handed to every layer: the layers
    then only choose their path by the mask's type, and the implementation (a string) never
    has to cross the scan or the rematerialised call as an argument.
    """
    batch, seq = attention_mask.shape
    kernels = [
        attention_kernel(
            config,
            batch,
            seq,
            deterministic=deterministic,
            documents=segment_ids is not None,
            local_window=window,
        )
        for window in (None, config.window)
    ]
    if not any(kernels):
        return attention_masks(attention_mask, segment_ids, config.window)
    document_ids = None
    if segment_ids is not None:
        # bertjax.nn.attention numbers documents 1.. and padding 0 (padded queries see padded
        # keys); segment ids may be any ints, padding's included: shift them to start at 1.
        real = attention_mask.astype(bool)
        first = jnp.min(segment_ids)
        document_ids = jnp.where(real, segment_ids - first + 1, 0).astype(jnp.int32)  # [b, s]
    on_kernel = KernelMasks(attention_mask, document_ids)
    return (
        on_kernel if kernels[0] else global_mask(attention_mask, segment_ids),
        on_kernel if kernels[1] else local_mask(attention_mask, segment_ids, config.window),
    )


def is_banded(seq: int, window: int) -> bool:
    """Whether local layers attend by chunks (`banded_mask`): rows longer than 3 windows."""
    return seq > 3 * window


def _chunks(seq: int, window: int) -> int:
    return -(-seq // window)


def banded_mask(attention_mask: jax.Array, segment_ids: jax.Array | None, window: int) -> jax.Array:
    """[batch, chunks, window, 3 * window] bool: query i of chunk c (position c * window + i)
    may attend to key j of the band (position (c - 1) * window + j)."""
    batch, seq = attention_mask.shape
    chunks = _chunks(seq, window)
    query = np.arange(chunks)[:, None] * window + np.arange(window)[None]  # [c, w]
    key = (np.arange(chunks)[:, None] - 1) * window + np.arange(3 * window)[None]  # [c, 3w]
    near = np.abs(query[:, :, None] - key[:, None, :]) <= window  # [c, w, 3w]
    inside = (key >= 0) & (key < seq)  # [c, 3w]
    key_index = np.clip(key, 0, seq - 1)  # [c, 3w]
    query_index = np.clip(query, 0, seq - 1)  # [c, w]
    real = attention_mask.astype(bool)[:, key_index] & inside[None]  # [b, c, 3w]
    mask = real[:, :, None, :] & near[None]  # [b, c, w, 3w]
    if segment_ids is not None:
        same = segment_ids[:, query_index][..., None] == segment_ids[:, key_index][:, :, None, :]
        mask = mask & same  # [b, c, w, 3w]
    return mask


def _band(x: jax.Array, window: int) -> jax.Array:
    """[b, s, n, d] keys or values -> [b, chunks, 3 * window, n, d]: each chunk's band (the
    chunk before, itself and the chunk after; zeros beyond the row)."""
    batch, seq, heads, dim = x.shape
    chunks = _chunks(seq, window)
    padded = jnp.pad(x, ((0, 0), (window, (chunks + 1) * window - seq), (0, 0), (0, 0)))
    blocks = padded.reshape(batch, chunks + 2, window, heads, dim)  # [b, c + 2, w, n, d]
    return jnp.concatenate([blocks[:, :-2], blocks[:, 1:-1], blocks[:, 2:]], axis=2)


def _banded_attention(q, k, v, mask, window: int, dropout) -> jax.Array:
    """Attention within the band of each chunk of `window` queries ([b, s, n, d] each, `mask`
    from `banded_mask`): the weights the dense local mask gives every real query (a padding
    query's differ, and nothing reads them), at seq x 3 window scores. `dropout` applies to
    the weights, drawing its masks on this layout."""
    batch, seq, heads, dim = q.shape
    chunks = _chunks(seq, window)
    q = jnp.pad(q, ((0, 0), (0, chunks * window - seq), (0, 0), (0, 0)))
    q = q.reshape(batch, chunks, window, heads, dim)  # [b, c, w, n, d]
    k, v = _band(k, window), _band(v, window)  # [b, c, 3w, n, d]
    logits = low_precision.einsum("bcqnd,bctnd->bcnqt", q, k, jnp.float32)  # [b, c, n, w, 3w]
    logits = jnp.where(mask[:, :, None], logits * np.float32(dim**-0.5), _MASK_VALUE)
    weights = dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype))  # [b, c, n, w, 3w]
    context = low_precision.einsum("bcnqt,bctnd->bcqnd", weights, v)  # [b, c, w, n, d]
    return context.reshape(batch, chunks * window, heads, dim)[:, :seq]
