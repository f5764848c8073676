"""Logical axis vocabulary, mesh building and the rules that map one onto the other.

The model names every parameter dimension and every activation it constrains with the
logical names below; only this module knows the mesh axes (data, fsdp, tensor). Changing
how the model is laid out on devices means changing ``LOGICAL_RULES``, nothing else.

Mesh axes:
  data    pure data parallelism (parameters replicated along it)
  fsdp    data parallelism with parameters' embed dimension sharded along it (ZeRO-3 style)
  tensor  tensor (Megatron-style) parallelism: attention heads and the FFN intermediate
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Mesh axis names.
DATA = "data"
FSDP = "fsdp"
TENSOR = "tensor"
MESH_AXES = (DATA, FSDP, TENSOR)

# Logical axis names of parameters.
VOCAB = "vocab"  # rows of the word-embedding table, the MLM output bias
EMBED = "embed"  # the hidden size on the input side of a kernel / the table width
HIDDEN = "hidden"  # a hidden-size dimension kept whole: biases, LayerNorm, H->H outputs
HEADS = "heads"  # attention heads
KV = "kv"  # size of one attention head
MLP = "mlp"  # the FFN intermediate size
POSITION = "position"  # rows of the position-embedding table
TOKEN_TYPE = "token_type"  # rows of the segment-embedding table
CLASSES = "classes"  # the two NSP classes
LABELS = "labels"  # the outputs of a fine-tuning head (classes, or 1 for regression)
LAYERS = "layers"  # the stacked-layer axis added by nn.scan

# Logical axis names of activations (HEADS, KV, MLP and VOCAB are shared with parameters).
BATCH = "batch"
LENGTH = "length"  # sequence positions, or masked-LM prediction slots
ACTIVATION_EMBED = "activation_embed"  # hidden size of activations: never sharded

# Rules are tried in order; a mesh axis is used at most once per array (flax semantics).
LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    (BATCH, (DATA, FSDP)),
    (LENGTH, None),
    (ACTIVATION_EMBED, None),
    (EMBED, FSDP),
    (HEADS, TENSOR),
    (KV, None),
    (MLP, TENSOR),
    # A vocabulary of 30522 does not divide a typical device count; the table is sharded by
    # its embed dimension instead.
    (VOCAB, None),
    (HIDDEN, None),
    (POSITION, None),
    (TOKEN_TYPE, None),
    (CLASSES, None),
    (LABELS, None),
    (LAYERS, None),
)


def current_rules() -> tuple[tuple[str, Any], ...]:
    """The rules set by an enclosing ``nn.logical_axis_rules`` context, else ``LOGICAL_RULES``."""
    return tuple(nn.get_logical_axis_rules()) or LOGICAL_RULES


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """Sharding constraint by logical names; a no-op unless a mesh is set (jax.set_mesh)."""
    return nn.with_logical_constraint(x, names, rules=current_rules())


def logical_to_spec(names: Sequence[str | None], rules=None) -> PartitionSpec:
    """PartitionSpec over mesh axes for an array whose dimensions have these logical names."""
    return nn.logical_to_mesh_axes(tuple(names), rules if rules is not None else current_rules())


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh with Auto axis types; one -1 takes the remaining devices."""
    shape = tuple(shape)
    if len(shape) != len(MESH_AXES) or not all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape
    ):
        raise ValueError(
            f"mesh shape must be {len(MESH_AXES)} integers for axes {MESH_AXES}, got {shape!r}"
        )
    if any(s == 0 or s < -1 for s in shape) or shape.count(-1) > 1:
        raise ValueError(
            f"mesh shape {shape} is invalid: sizes must be positive, with at most one -1 "
            "to fill in the device count"
        )
    devices = list(jax.devices() if devices is None else devices)
    count = len(devices)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if count % known:
            raise ValueError(
                f"mesh shape {shape}: the fixed axes (product {known}) do not divide the "
                f"{count} devices"
            )
        shape = tuple(count // known if s == -1 else s for s in shape)
    elif known != count:
        raise ValueError(
            f"mesh shape {shape} has {known} devices but {count} are available; give a shape "
            "whose product is the device count, or use -1 for one axis"
        )
    return jax.make_mesh(
        shape,
        MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
        devices=devices,
    )


def is_box(x: Any) -> bool:
    """Whether x is a parameter boxed with its logical axis names (nn.Partitioned)."""
    return isinstance(x, nn.Partitioned)


def logical_shardings(boxed_abstract_tree: Any, mesh: Mesh, rules=LOGICAL_RULES) -> Any:
    """NamedSharding per leaf: boxed leaves by their logical names, other leaves replicated.

    The result has the structure of the *unboxed* tree (each box becomes one sharding).
    """

    def one(leaf):
        if is_box(leaf):
            return NamedSharding(mesh, nn.logical_to_mesh_axes(leaf.names, rules))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, boxed_abstract_tree, is_leaf=is_box)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of [batch, ...] arrays: the batch over (data, fsdp), the rest replicated."""
    return NamedSharding(mesh, PartitionSpec((DATA, FSDP)))


def shards(name: str, mesh: Mesh | None = None) -> int:
    """Into how many pieces ``mesh`` (default: the current one, jax.set_mesh) splits the
    logical axis ``name``; 1 without a mesh."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    axes = logical_to_spec((name,))[0]
    if mesh.empty or axes is None:
        return 1
    names = axes if isinstance(axes, tuple) else (axes,)
    return math.prod(mesh.shape[n] for n in names)


def data_parallel_size(mesh: Mesh) -> int:
    """How many ways the batch is split: data * fsdp."""
    return mesh.shape[DATA] * mesh.shape[FSDP]
