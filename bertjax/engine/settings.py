"""Settings both runs share, and the helpers of the one way a ConfigDict is read.

A run's settings are frozen, typed dataclasses read from its ConfigDict once, at the edge:
`bertjax.pretrain.settings.PretrainSettings.from_config` and
`bertjax.finetune.settings.FinetuneSettings.from_config`. Both read their shared parts with
the functions here (the optimizer, the mesh and its batch checks, token packing), and fail
with a `ConfigError` whose message names the field, its value and what would be valid,
before any data is read or anything is compiled. Everything below the edge takes settings
(or the plain values in them), never a ConfigDict.
"""

from __future__ import annotations

import difflib
from typing import Any, Protocol

import jax
import ml_collections

from bertjax.encoders.family import EncoderConfig
from bertjax.engine import optim
from bertjax.nn import sharding


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field."""


def config_value(config: ml_collections.ConfigDict, dotted: str) -> Any:
    """The value of a dotted field, e.g. "optimizer.learning_rate"; KeyError if absent."""
    value = config
    for part in dotted.split("."):
        value = value[part]
    return value


def fail(field: str, value: Any, message: str) -> ConfigError:
    """The error for config.<field>=<value>, saying what is wrong or what would be valid."""
    return ConfigError(f"config.{field}={value!r}: {message}")


def require(config: ml_collections.ConfigDict, ok: bool, field: str, message: str) -> None:
    """Fails with `fail` (naming the field's value) unless `ok`."""
    if not ok:
        raise fail(field, config_value(config, field), message)


def positive_int(config: ml_collections.ConfigDict, field: str) -> int:
    """A dotted field that must hold a positive integer, checked."""
    value = config_value(config, field)
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    require(config, ok, field, "must be a positive integer")
    return value


def token_capacity(config: ml_collections.ConfigDict, zero_means: str = "") -> float:
    """token_capacity in (0, 1]; also 0 where `zero_means` says what 0 does."""
    value = config.token_capacity
    ok = isinstance(value, (int, float)) and (value >= 0 if zero_means else value > 0)
    ok = ok and value <= 1.0
    allowed = f"[0, 1] (0 {zero_means}, " if zero_means else "(0, 1] ("
    require(config, ok, "token_capacity", f"must be in {allowed}1 turns token packing off)")
    return float(value)


class BatchShape(Protocol):
    """What the mesh checks read of a run's settings (both runs' RunSettings have it)."""

    mesh_shape: tuple[int, ...]
    batch_size: int
    grad_accum_steps: int

    @property
    def micro_batch_size(self) -> int: ...


def read_optimizer(config: ml_collections.ConfigDict, **fields: Any) -> optim.OptimizerSettings:
    """config.optimizer's fields (with `fields` added or replaced) as OptimizerSettings."""
    try:
        return optim.OptimizerSettings(**{**dict(config.optimizer), **fields})
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.optimizer: {e}") from e


def check_mesh(config, run: BatchShape, devices, process_count: int) -> jax.sharding.Mesh:
    """The mesh the run asks for, with the batch checks that depend on it."""
    try:
        mesh = sharding.make_mesh(run.mesh_shape, devices=devices)
    except ValueError as e:
        raise ConfigError(f"config.mesh_shape={run.mesh_shape}: {e}") from e
    mesh_shape = tuple(mesh.shape.values())
    data_parallel = sharding.data_parallel_size(mesh)
    require(
        config,
        run.batch_size % run.grad_accum_steps == 0,
        "batch_size",
        f"must be divisible by grad_accum_steps={run.grad_accum_steps}",
    )
    require(
        config,
        run.micro_batch_size % data_parallel == 0,
        "batch_size",
        f"each micro-batch ({run.micro_batch_size} = batch_size / grad_accum_steps) must be "
        f"divisible by the data-parallel size {data_parallel} (mesh data x fsdp of {mesh_shape})",
    )
    require(
        config,
        run.batch_size % process_count == 0,
        "batch_size",
        f"must be divisible by the number of processes ({process_count})",
    )
    # Each process feeds its own rows, so the batch must be split across processes.
    require(
        config,
        data_parallel % process_count == 0,
        "mesh_shape",
        f"the data-parallel size {data_parallel} (data x fsdp) must be a multiple of the "
        f"{process_count} processes, so that every process holds its own batch rows",
    )
    return mesh


# The model dimensions that the sharding rules split over mesh axes, by logical axis name.
_SHARDED_DIMENSIONS = (
    (sharding.EMBED, "hidden_size"),
    (sharding.HEADS, "num_heads"),
    (sharding.MLP, "intermediate_size"),
    (sharding.VOCAB, "vocab_size"),
)


def check_mesh_fits(
    model: EncoderConfig, mesh: jax.sharding.Mesh, check_vocab: bool = True
) -> None:
    """Fails, naming the dimension and the mesh axes, unless every sharded dimension of the
    model divides evenly over the mesh axes it is split along."""
    for logical, field in _SHARDED_DIMENSIONS:
        if field == "vocab_size" and not check_vocab:
            continue
        size, pieces = getattr(model, field), sharding.shards(logical, mesh)
        if size % pieces:
            axes = sharding.logical_to_spec((logical,))[0]
            raise ConfigError(
                f"config.mesh_shape={tuple(mesh.shape.values())}: model.{field}={size} does "
                f"not divide into the {pieces} shards of mesh axis {axes!r}; choose a mesh "
                f"whose {axes!r} size divides {size}"
            )


def suggest_field(config: ml_collections.ConfigDict, dotted: str) -> str | None:
    """The existing config field closest to a misspelt dotted name, if any is close."""
    fields = list(_dotted_fields(config))
    matches = difflib.get_close_matches(dotted, fields, n=1, cutoff=0.6)
    return matches[0] if matches else None


def _dotted_fields(config: ml_collections.ConfigDict, prefix: str = ""):
    for key, value in config.items():
        name = prefix + key
        if isinstance(value, ml_collections.ConfigDict):
            yield from _dotted_fields(value, name + ".")
        else:
            yield name
