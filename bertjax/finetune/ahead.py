"""A fine-tuning run's programs compiled ahead (bertjax.engine.compile_ahead): every training
shape in the order the run first meets it, then every evaluation and prediction shape."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from bertjax.engine import compile_ahead
from bertjax.finetune.batches import (
    fitting_width,
    per_position_features,
    train_batch,
    train_micro_batches,
    training_order,
)
from bertjax.finetune.evaluation import run_eval_batches
from bertjax.finetune.prepared import PreparedRun


def compiled_ahead(
    run: PreparedRun, compiler: compile_ahead.Compiler, training: bool = True
) -> PreparedRun:
    """`run` with its steps' programs compiled ahead by `compiler` (bertjax.engine.compile_ahead):
    every training shape, in the order the run first meets it (unless `training` is False: a
    run whose seeds have all finished training), then every evaluation and prediction shape
    (the batches run_eval will take). A step then runs the program compiled for its shape:
    the same jitted function's, so the run's results do not change."""
    ft, settings = run.ft, run.settings.run
    built = ft.steps
    abstract = built.state.abstract
    rng = jax.eval_shape(lambda: jax.random.key(0))  # the dropout key's shape and dtype
    train = run.task.train
    order = training_order(train, settings.seeds[0], 0, settings.batch_size, settings.batch_order)
    per_position = per_position_features(train)

    def shapes(local: dict[str, np.ndarray], width: int | None = None) -> dict:
        """The global batch of this process's `local` rows, at `width` positions."""
        out = {}
        for name, array in local.items():
            shape = (array.shape[0] * jax.process_count(),) + array.shape[1:]  # [rows, ...]
            if width is not None and name in per_position:
                shape = (shape[0], width) + shape[2:]  # [rows, width, ...]
            out[name] = jax.ShapeDtypeStruct(shape, array.dtype, sharding=built.batch_sharding)
        return out

    teacher = built.batch_features  # distillation's teacher outputs, or None
    teacher_program = compiler.ahead(teacher.program) if teacher is not None else None

    def with_teacher(batch: dict) -> dict:
        """A training batch's shapes with the features the teacher adds, whose program is
        compiled ahead too."""
        if teacher is None:
            return batch
        teacher_program.prepare(teacher.params, batch)
        return {**batch, **teacher.shapes(batch)}

    widths = _training_widths_in_use_order(run)
    train_step, micro_step = built.train_step, built.micro_batch_step
    # Without `training`, a step that runs after all compiles when it is first called.
    if training and settings.micro_batches_by_length:
        first = train_micro_batches(
            train,
            order,
            0,
            settings.batch_size,
            settings.grad_accum_steps,
            settings.length_bucket,
            run.train_widths,
        )[0]
        micro_step = dataclasses.replace(
            micro_step,
            denominators=compiler.ahead(micro_step.denominators),
            zeros=compiler.ahead(micro_step.zeros),
            accumulate=compiler.ahead(micro_step.accumulate),
            apply=compiler.ahead(micro_step.apply),
        )
        micro_step.zeros.prepare(abstract.params)
        grads, sums = jax.eval_shape(micro_step.zeros.function, abstract.params)
        for k, width in enumerate(widths):
            micro = with_teacher(shapes(first, width))
            micro_step.denominators.prepare(micro)
            denominators = jax.eval_shape(micro_step.denominators.function, micro)
            # The micro-batch's index is a traced Python int: one program for every index.
            micro_step.accumulate.prepare(
                abstract.params, grads, sums, micro, denominators, rng, abstract.step, 0
            )
            if k == 0:
                micro_step.apply.prepare(abstract, grads, sums, denominators)
    elif training:
        first = train_batch(
            train, order, 0, settings.batch_size, settings.length_bucket, run.train_widths
        )
        train_step = compiler.ahead(train_step)
        for width in widths:
            train_step.prepare(abstract, with_teacher(shapes(first, width)), rng)
    eval_step = compiler.ahead(built.eval_step)
    for examples in [*run.task.validation, *run.task.test]:
        batches = run_eval_batches(
            ft, examples, settings.eval_batch_size, settings.length_bucket, run.eval_widths
        )
        for _, local in batches:
            eval_step.prepare(abstract.params, shapes(local))
    ahead = dataclasses.replace(
        built,
        train_step=train_step,
        eval_step=eval_step,
        micro_batch_step=micro_step,
        batch_features=(
            dataclasses.replace(teacher, program=teacher_program) if teacher is not None else None
        ),
    )
    return dataclasses.replace(run, ft=dataclasses.replace(ft, steps=ahead))


def _training_widths_in_use_order(run: PreparedRun) -> list[int | None]:
    """The run's training widths (micro-batch widths when grouped by length) in the order its
    steps first meet them; [None] when every batch runs at max_seq_length."""
    if run.train_widths is None:
        return [None]
    settings = run.settings.run
    train = run.task.train
    lengths = train.features["input_mask"].sum(axis=1)
    seq = train.features["input_mask"].shape[1]
    groups = settings.grad_accum_steps if settings.micro_batches_by_length else 1
    size = settings.batch_size
    met: list[int | None] = []
    for seed in settings.seeds:
        for epoch in range(settings.num_epochs):
            order = training_order(train, seed, epoch, size, settings.batch_order)
            for index in range(run.steps_per_epoch):
                rows = order[index * size : (index + 1) * size]
                # [micro-batch, row], sorted as train_micro_batches groups them
                longest = np.sort(lengths[rows]).reshape(groups, -1)[:, -1]
                for n in longest:
                    width = fitting_width(run.train_widths, int(n), seq)
                    if width not in met:
                        met.append(width)
                if len(met) == len(run.train_widths):
                    return met
    return met + [w for w in run.train_widths if w not in met]
