"""ModernBERT's rotary position embeddings (NeoX style, as transformers' ModernBERT applies
them): each layer rotates its queries and keys by the tables of its kind of layer (global or
local, each with its own theta)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """(cos, sin), each [batch, seq, head_dim] float32, for NeoX-style rotary embeddings:
    dimension k and k + head_dim / 2 rotate together at frequency theta ** (-2k / head_dim)."""
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim  # [d / 2]
    inv_freq = 1.0 / (jnp.float32(theta) ** exponents)  # [d / 2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, s, d / 2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [b, s, d]
    return jnp.cos(angles), jnp.sin(angles)


def apply(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [batch, seq, heads, head_dim] by the tables [batch, seq, head_dim] in float32;
    returns x's dtype."""
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)  # [b, s, n, d / 2] each
    rotated = jnp.concatenate([-second, first], axis=-1)  # [b, s, n, d]
    return (x32 * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)
