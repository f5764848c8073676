"""A pretraining run's steps: `build_pretraining` gives the engine (bertjax.engine.steps.build) what
the run's objective (bertjax.pretrain.objectives, config.objective) trains and minimises."""

from __future__ import annotations

import dataclasses
from typing import Any

from bertjax import encoders
from bertjax.engine import steps
from bertjax.nn import sharding
from bertjax.pretrain import objectives
from bertjax.pretrain.objectives.masked_lm import MaskedLmLoss
from bertjax.pretrain.settings import PretrainSettings

__all__ = ["MaskedLmLoss", "build_pretraining"]


def build_pretraining(
    settings: PretrainSettings, model_config: Any, tokenizer: Any = None, devices=None
) -> steps.Steps:
    """Creates the mesh, shardings and jitted functions of a run (nothing is allocated but a
    frozen network's parameters, for an objective that has one: a teacher's)."""
    run, data = settings.run, settings.data
    mesh = sharding.make_mesh(run.mesh_shape, devices=devices)
    family = encoders.family_of(model_config)
    objective = objectives.get(settings.objective)
    built = steps.build(
        objective.step(family, model_config, settings),
        objective.model_init(family, model_config, settings.objective_settings),
        settings.optimizer,
        mesh,
        grad_accum_steps=run.grad_accum_steps,
        packed_length=steps.packed_length_for_capacity(
            run.micro_batch_size, data.max_seq_length, run.token_capacity, mesh
        ),
    )
    features = objective.batch_features(model_config, settings.objective_settings, tokenizer, built)
    return dataclasses.replace(built, batch_features=features)
