"""Token packing: an encoder can skip padding, whatever its family.

The batch is cut into one group per batch shard of the mesh (so packing never moves tokens
between devices), and each group's real tokens are gathered into `packed_length` slots. Dense
layers, LayerNorms and dropout then run on [groups, packed_length, ...]; attention unpacks to
[batch, seq, ...] and back. Unused slots read a copy of some token, and whatever they compute
is dropped on unpacking, so it reaches neither outputs nor gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.nn import sharding
from bertjax.nn.sharding import BATCH, LENGTH


def packing_index(attention_mask: jax.Array, packed_length: int, groups: int) -> jax.Array:
    """[groups, packed_length] positions of each group's real tokens within the group.

    Positions are counted over the group's rows flattened ([rows * seq]); slots beyond the
    group's real tokens hold rows * seq, an out-of-range position. Real tokens beyond
    ``packed_length`` are not packed: callers check ``tokens_per_group`` first.
    """
    batch, seq = attention_mask.shape
    real = attention_mask.reshape(groups, batch // groups * seq).astype(bool)  # [g, n]
    size = real.shape[1]
    slot = jnp.cumsum(real, axis=1, dtype=jnp.int32) - 1  # [g, n]: slot of each real token
    slot = jnp.where(real, slot, packed_length)  # padding goes out of range: dropped
    positions = jnp.arange(size, dtype=jnp.int32)

    def one(group_slots):
        empty = jnp.full((packed_length,), size, jnp.int32)
        return empty.at[group_slots].set(positions, mode="drop")

    return sharding.constrain(jax.vmap(one)(slot), (BATCH, LENGTH))


def tokens_per_group(attention_mask: jax.Array, groups: int) -> jax.Array:
    """[groups] count of real tokens in each group of batch rows."""
    batch = attention_mask.shape[0]
    per_row = jnp.sum(attention_mask.astype(jnp.int32), axis=1)  # [b]
    return jnp.sum(per_row.reshape(groups, batch // groups), axis=1)


def first_tokens(x: jax.Array, attention_mask: jax.Array, index: jax.Array | None) -> jax.Array:
    """[batch, 1, ...]: each row's first token ([CLS]) from x, packed (index) or not.

    A row's first token is real (BERT's input_mask is a prefix of ones), so when packed it
    sits in the slot after all real tokens of the group's earlier rows.
    """
    if index is None:
        return x[:, :1]  # [b, 1, ...]
    batch = attention_mask.shape[0]
    groups = index.shape[0]
    per_row = jnp.sum(attention_mask.astype(jnp.int32), axis=1).reshape(groups, -1)  # [g, r]
    slots = jnp.cumsum(per_row, axis=1) - per_row  # [g, r]: real tokens before each row
    firsts = jax.vmap(lambda g, i: jnp.take(g, i, axis=0, mode="clip"))(x, slots)  # [g, r, ...]
    return firsts.reshape(batch, 1, *x.shape[2:])


def pack_tokens(x: jax.Array, index: jax.Array) -> jax.Array:
    """[batch, seq, ...] -> [groups, packed_length, ...] at ``index`` (packing_index)."""
    groups = index.shape[0]
    grouped = x.reshape(groups, -1, *x.shape[2:])  # [g, rows * seq, ...]
    return jax.vmap(lambda g, i: jnp.take(g, i, axis=0, mode="clip"))(grouped, index)


def unpack_tokens(packed: jax.Array, index: jax.Array, batch: int, seq: int) -> jax.Array:
    """[groups, packed_length, ...] -> [batch, seq, ...], zero where nothing was packed."""
    groups = index.shape[0]
    size = batch // groups * seq
    rest = packed.shape[2:]

    def one(group, group_index):
        return jnp.zeros((size, *rest), packed.dtype).at[group_index].set(group, mode="drop")

    return jax.vmap(one)(packed, index).reshape(batch, seq, *rest)
