"""What a fine-tuning step minimises, and the jitted steps and state layout of a run.

`HeadObjective` is the `steps.Objective` of every head: the head's summed loss (bertjax.heads)
over the examples of a (micro-)batch, divided by the count of the whole batch. The train step
comes from `steps.make_train_step`; evaluation runs `eval_step`, which returns the loss sums
and what the metrics need (probabilities, values or token labels) in one pass.

Batch features: input_ids, input_mask, segment_ids [batch, seq]; labels ([batch] ids or
values, [batch, labels] 0/1, or [batch, seq] token ids with heads.IGNORE_LABEL); weights
[batch] (0 for rows that only pad an evaluation batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import heads, optim, sharding, steps
from bertjax.heads import HeadSpec
from bertjax.model import BertConfig


class HeadObjective(steps.Objective):
    """A fine-tuning head's loss as sums over examples (see steps.Objective)."""

    def __init__(self, model: nn.Module, head: HeadSpec):
        self.model = model
        self.head = head

    def logits(self, params, batch, *, rng, deterministic: bool, packed_length=None):
        return self.model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            deterministic=deterministic,
            packed_length=packed_length,
            rngs={"dropout": rng} if rng is not None else {},
        )

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> heads.HeadSums:
        logits = self.logits(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        return heads.head_sums(self.head.task, logits, batch)

    def zero_sums(self) -> heads.HeadSums:
        return heads.HeadSums(*(jnp.zeros((), jnp.float32) for _ in heads.HeadSums._fields))

    def denominators(self, batch) -> jax.Array:
        return heads.denominator(self.head.task, batch, self.head.num_outputs)

    def loss(self, sums: heads.HeadSums, denominators: jax.Array) -> jax.Array:
        # At least 1: a token batch could hold no labelled word at all.
        return sums.loss / jnp.maximum(denominators, 1.0)

    def metrics(self, sums: heads.HeadSums, prefix: str) -> dict[str, jax.Array]:
        return summary_metrics(self.head.task, sums, prefix)


def summary_metrics(task: str, sums: heads.HeadSums, prefix: str) -> dict[str, Any]:
    """Loss (and accuracy where it means something) from summed statistics."""
    count = jnp.maximum(sums.count, 1.0)
    out = {f"{prefix}/loss": sums.loss / count}
    if task == heads.MULTI_LABEL:
        out[f"{prefix}/label_accuracy"] = sums.correct / count
    elif task != heads.REGRESSION:
        out[f"{prefix}/accuracy"] = sums.correct / count
    return out


@dataclasses.dataclass(frozen=True)
class Finetuning:
    """A run's model, mesh, state layout and jitted steps, built once (nothing allocated)."""

    model_config: BertConfig
    head: HeadSpec
    model: nn.Module
    mesh: jax.sharding.Mesh
    state: steps.StateFactory
    batch_sharding: jax.sharding.NamedSharding
    train_step: Callable  # (state, batch, rng) -> (state, metrics)
    eval_step: Callable  # (params, batch) -> (HeadSums, outputs: heads.outputs)


def build_finetuning(
    model_config: BertConfig,
    head: HeadSpec,
    optimizer: optim.OptimizerSettings,
    *,
    mesh_shape: tuple[int, ...],
    grad_accum_steps: int,
    micro_batch_size: int,
    max_seq_length: int,
    token_capacity: float = 1.0,
    devices=None,
) -> Finetuning:
    """The mesh, the sharded state layout and the jitted train and eval steps of a run."""
    mesh = sharding.make_mesh(mesh_shape, devices=devices)
    model = heads.make_model(model_config, head)
    tx = optim.make_optimizer(optimizer)
    state = steps.make_state(lambda rng: heads.init_params(model, rng), tx, mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    batch_sharding = sharding.batch_sharding(mesh)
    micro_batch_sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, *batch_sharding.spec)
    )
    objective = HeadObjective(model, head)
    train_step = jax.jit(
        steps.make_train_step(
            objective,
            tx,
            optim.make_schedule(optimizer),
            grad_accum_steps,
            micro_batch_sharding,
            steps.packed_length(micro_batch_size, max_seq_length, token_capacity, mesh),
        ),
        in_shardings=(state.shardings, batch_sharding, replicated),
        out_shardings=(state.shardings, replicated),
        donate_argnums=(0,),
    )

    def eval_step(params, batch):
        logits = objective.logits(params, batch, rng=None, deterministic=True)
        return heads.head_sums(head.task, logits, batch), heads.outputs(head.task, logits)

    eval_step = jax.jit(
        eval_step,
        in_shardings=(state.shardings.params, batch_sharding),
        out_shardings=(replicated, batch_sharding),
    )
    return Finetuning(model_config, head, model, mesh, state, batch_sharding, train_step, eval_step)
