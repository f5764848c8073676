"""The jitted steps and state layout of a fine-tuning run.

`build_finetuning` asks the run's task (bertjax.finetune.task) for its objective (what a step
minimises) and gives it to the engine (bertjax.engine.steps.build).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from bertjax.capability import HeadSpec
from bertjax.encoders.family import EncoderConfig
from bertjax.engine import optim, steps
from bertjax.finetune import distill as distill_lib
from bertjax.finetune import task as task_lib
from bertjax.nn import sharding


@dataclasses.dataclass(frozen=True)
class Finetuning:
    """A run's model, objective and built steps (nothing allocated)."""

    model_config: EncoderConfig
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
    model_config: EncoderConfig,
    head: HeadSpec,
    optimizer: optim.OptimizerSettings,
    *,
    mesh_shape: tuple[int, ...],
    grad_accum_steps: int,
    micro_batch_size: int,
    max_seq_length: int,
    token_capacity: float = 1.0,
    every_batch_fits: bool = False,
    devices=None,
    distill: distill_lib.DistillSettings | None = None,
) -> Finetuning:
    """The mesh, the sharded state layout and the jitted train and eval steps of a run.

    `every_batch_fits`: `token_capacity` was chosen so that every training batch of the run
    fits it (widths.fitting_capacity), so the train step packs without a conditional.
    `distill`: the loss mixes in a teacher's outputs, which the batches carry."""
    mesh = sharding.make_mesh(mesh_shape, devices=devices)
    objective = task_lib.get(head.task).objective(model_config, head)
    if distill is not None:
        objective = distill_lib.DistillationObjective(objective, distill.alpha, distill.temperature)
    built = steps.build(
        objective,
        objective.init_params,
        optimizer,
        mesh,
        grad_accum_steps=grad_accum_steps,
        packed_length=steps.packed_length_for_capacity(
            micro_batch_size, max_seq_length, token_capacity, mesh
        ),
        every_batch_fits=every_batch_fits,
    )
    return Finetuning(model_config, head, objective, built)
