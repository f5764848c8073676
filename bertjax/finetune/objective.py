"""What a fine-tuning step minimises, and the jitted steps and state layout of a run.

`HeadObjective` is the `TaskObjective` of the heads of bertjax.heads: the head's summed loss
over the examples of a (micro-)batch, divided by the count of the whole batch; its
`evaluate` returns the loss sums and what the metrics need (probabilities, values or token
labels) in one pass. `build_finetuning` asks the run's task (bertjax.finetune.task) for its
objective and gives it to the engine (bertjax.steps.build).

Batch features: input_ids, input_mask, segment_ids [batch, seq]; labels ([batch] ids or
values, [batch, labels] 0/1, or [batch, seq] token ids with heads.IGNORE_LABEL); weights
[batch] (0 for rows that only pad an evaluation batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from bertjax import heads, optim, sharding, steps
from bertjax.finetune import task as task_lib
from bertjax.heads import HeadSpec
from bertjax.model import BertConfig


class HeadObjective(task_lib.TaskObjective):
    """A fine-tuning head's loss as sums over examples (see steps.Objective)."""

    eval_outputs = True

    def __init__(self, model_config: BertConfig, head: HeadSpec):
        self.model = heads.make_model(model_config, head)
        self.head = head

    def init_params(self, rng: jax.Array) -> Any:
        return heads.init_params(self.model, rng)

    def evaluate(self, params, batch):
        logits = self.logits(params, batch, rng=None, deterministic=True)
        return heads.head_sums(self.head.task, logits, batch), heads.outputs(self.head.task, logits)

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
    """A run's model, objective and built steps (nothing allocated)."""

    model_config: BertConfig
    head: HeadSpec
    objective: task_lib.TaskObjective
    steps: steps.Steps

    @property
    def mesh(self) -> jax.sharding.Mesh:
        return self.steps.mesh

    @property
    def state(self) -> steps.StateFactory:
        return self.steps.state

    @property
    def batch_sharding(self) -> jax.sharding.NamedSharding:
        return self.steps.batch_sharding

    @property
    def train_step(self) -> Callable:
        return self.steps.train_step

    @property
    def eval_step(self) -> Callable:
        """(params, batch) -> (sums, outputs) (the task objective's evaluate)."""
        return self.steps.eval_step


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
    objective = task_lib.get(head.task).objective(model_config, head)
    built = steps.build(
        objective,
        objective.init_params,
        optimizer,
        mesh,
        grad_accum_steps=grad_accum_steps,
        packed_length=steps.packed_length(micro_batch_size, max_seq_length, token_capacity, mesh),
    )
    return Finetuning(model_config, head, objective, built)
