"""Pooling an encoder's token outputs into one vector per row, whatever the family."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mean(sequence: jax.Array, input_mask: jax.Array) -> jax.Array:
    """The mean of `sequence` [batch, seq, hidden] over the tokens `input_mask` [batch, seq]
    marks: float32 [batch, hidden]. A row without tokens (padding a batch) pools to zeros."""
    weights = input_mask[..., None].astype(jnp.float32)  # [b, s, 1]
    total = jnp.sum(sequence.astype(jnp.float32) * weights, axis=1)  # [b, h]
    return total / jnp.maximum(jnp.sum(weights, axis=1), 1.0)  # [b, h]
