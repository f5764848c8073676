"""A frozen teacher network beside a trained one: its outputs on every batch, and a student
made of its layers. Distillation uses both, in fine-tuning (bertjax.finetune.distill) and in
pretraining (bertjax.pretrain.objectives.distill).

The teacher never enters the train state: it holds no optimizer state, is never saved with
the run, and its parameters are an argument of the program that computes its outputs (never
constants baked into it). Its outputs are computed on the student's mesh for each training
batch and join the batch under TEACHER_PREFIX (steps.Steps.batch_features).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import tempfile
from collections.abc import Callable
from typing import Any

import jax
from safetensors import numpy as safetensors_numpy

from bertjax import capability, encoders
from bertjax.engine import rundir, steps
from bertjax.engine.settings import ConfigError
from bertjax.storage import hf

# The batch features that hold the teacher's outputs: this prefix and the output's name.
TEACHER_PREFIX = "teacher_"
# The tensor names of an encoder layer in transformers' files, whatever the family:
# "bert.encoder.layer.3.", "electra.encoder.layer.3.", "model.layers.3.".
_LAYER_NAME = re.compile(r"(^|\.)(layers?)\.(\d+)\.")
# config.json's depth, in every family's transformers config.
_DEPTH_FIELD = "num_hidden_layers"


@dataclasses.dataclass(frozen=True)
class TeacherOutputs:
    """`(global batch) -> the teacher's outputs as batch features` (steps.Steps.batch_features):
    `program` (jitted for the student's mesh) of the teacher's frozen `params`, placed there,
    which it takes as an argument, never as constants in the program."""

    program: Callable  # (params, batch) -> {feature: array}
    params: Any

    def __call__(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return self.program(self.params, batch)

    def shapes(self, batch: dict[str, jax.ShapeDtypeStruct]) -> dict[str, jax.ShapeDtypeStruct]:
        """The features' shapes for a batch of `batch`'s shapes, with their sharding."""
        out = jax.eval_shape(self.program, self.params, batch)
        sharding = next(iter(batch.values())).sharding
        return {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in out.items()
        }


def frozen_outputs(
    outputs: Callable[[Any, dict], dict[str, jax.Array]], params: Any, built: steps.Steps
) -> TeacherOutputs:
    """The teacher's outputs as batch features: `outputs(params, batch) -> {name: array}`
    (run without dropout), jitted for the student's mesh (`built`), of `params` placed there,
    each output named TEACHER_PREFIX + its name."""

    def features(params, batch):
        return {TEACHER_PREFIX + name: value for name, value in outputs(params, batch).items()}

    param_shardings = jax.tree.map(lambda x: x.sharding, params)
    program = jax.jit(
        features,
        in_shardings=(param_shardings, built.batch_sharding),
        out_shardings=built.batch_sharding,
    )
    return TeacherOutputs(program, params)


def teacher_outputs(batch) -> dict[str, jax.Array]:
    """The teacher's outputs a batch carries, by name."""
    return {
        name[len(TEACHER_PREFIX) :]: value
        for name, value in batch.items()
        if name.startswith(TEACHER_PREFIX)
    }


def keep_layers(
    teacher: rundir.Run, layers: tuple[int, ...], field: str, mesh: jax.sharding.Mesh | None = None
) -> rundir.Run:
    """The teacher with only `layers` of its encoder, renumbered 0, 1, ...: its embeddings, the
    chosen layers and its head, as a run to start from (DistilBERT's initialisation);
    `field` is the config field that chose them (for messages); the teacher's parameters are
    read onto `mesh` (the run's, where one is in use) on their way to the host.

    Family-neutral: the teacher's family writes it in transformers' format (the whole model
    where its head travels there, else the encoder alone and the head's own parameters kept
    as they are), the chosen layers' tensors are renamed, the depth set, and the family reads
    the result back."""
    depth = teacher.config.num_layers
    missing = [layer for layer in layers if layer >= depth]
    if missing:
        raise ConfigError(
            f"config.{field}={','.join(map(str, layers))}: the teacher has "
            f"{depth} layers (0 to {depth - 1}), not {missing}"
        )
    family = encoders.family_of(teacher.config)
    params = jax.device_get(rundir.read_params(teacher, mesh)[1])
    head = teacher.head
    whole_model = head is None or capability.of(head).transformers_head(head) is not None
    with tempfile.TemporaryDirectory() as scratch:
        directory = pathlib.Path(scratch)
        if whole_model:
            family.write_transformers(teacher.config, params, directory / "teacher", head=head)
            tensors, _ = hf.read_weights(directory / "teacher")
            hf_config = hf.read_config(directory / "teacher" / hf.CONFIG_NAME)
        else:
            hf_config, tensors = family.encoder_files(teacher.config, params)
        renumbered = {layer: index for index, layer in enumerate(layers)}
        kept = {}
        for name, value in tensors.items():
            found = _LAYER_NAME.search(name)
            if found is None:
                kept[name] = value
            elif int(found.group(3)) in renumbered:
                new = f"{found.group(1)}{found.group(2)}.{renumbered[int(found.group(3))]}."
                kept[name[: found.start()] + new + name[found.end() :]] = value
        hf_config = {**hf_config, _DEPTH_FIELD: len(layers)}
        student = directory / "student"
        student.mkdir()
        (student / hf.CONFIG_NAME).write_text(json.dumps(hf_config, indent=2))
        safetensors_numpy.save_file(kept, str(student / hf.SAFE_WEIGHTS_NAME))
        config, student_params, _, fresh = family.read_transformers(
            student, hf_config, pretraining_heads=False
        )
    if not whole_model:
        student_params = {**params, capability.ENCODER: student_params[capability.ENCODER]}
    return rundir.Run(
        teacher.path,
        rundir.HUGGING_FACE,
        config,
        teacher.tokenizer,
        head,
        None,
        None,
        params=student_params,
        fresh=tuple(fresh),
    )
