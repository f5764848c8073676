"""Plain einsum attention in float32: the yardstick the attention tests hold every
implementation of bertjax.nn.attention against."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from bertjax.nn.masks import MASK_VALUE, logit_mask


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
    keep = logit_mask(
        attention_mask, document_ids, query_document_ids, local_window, query.shape[1]
    )
    if keep is not None:
        logits = jnp.where(keep, logits, MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bnst,btnd->bsnd", weights, value.astype(jnp.float32)).astype(query.dtype)
