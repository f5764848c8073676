"""A fine-tuning run made ready once for all its seeds: init_from and the task's data read, the
run's steps built, the widths its batches are cut to chosen (`prepare`)."""

from __future__ import annotations

import dataclasses

from bertjax import encoders
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError, check_mesh_fits
from bertjax.finetune import distill as distill_lib
from bertjax.finetune import task as task_lib
from bertjax.finetune.objective import Finetuning, build_finetuning
from bertjax.finetune.settings import FinetuneSettings
from bertjax.finetune.task import Examples, TaskData
from bertjax.finetune.warm_start import open_source
from bertjax.finetune.widths import (
    EVAL_PROGRAM_POSITIONS,
    evaluation_widths,
    fitting_capacity,
    training_widths,
)
from bertjax.nn import sharding
from bertjax.text.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """What every seed of a run shares: settings, the built steps, the data, the source model."""

    settings: FinetuneSettings
    ft: Finetuning
    task: TaskData
    source: rundir.Run
    tokenizer: Tokenizer
    steps_per_epoch: int
    # The widths training and evaluation cut batches to (None: as the length bucket says).
    train_widths: tuple[int, ...] | None = None
    eval_widths: tuple[int, ...] | None = None

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.settings.run.num_epochs


def prepare(settings: FinetuneSettings, devices=None) -> PreparedRun:
    """Reads init_from and the task's data, and builds the run's steps (shared by seeds); with
    a teacher (config.distill), opens it and has its outputs join every training batch."""
    distill = settings.distill
    teacher = distill_lib.open_teacher(distill) if distill is not None else None
    if teacher is not None and distill.student_layers:
        source = distill_lib.student_from_teacher(teacher, distill.student_layers)
        kept = ",".join(map(str, distill.student_layers))
        print(f"the student: the teacher's layers {kept} of {teacher.config.num_layers}")
    else:
        source = open_source(settings.init_from, settings.init_step)
    model_config = settings.model_config(source.config)
    kind = task_lib.get(settings.task)
    data = settings.data
    if teacher is not None:
        distill_lib.check_teacher(teacher, settings.task, source.tokenizer, settings.init_from)
        if teacher.head.labels and data.labels is None:
            # The student's labels are the teacher's, in its order (the data's are checked
            # against them as they are read).
            data = dataclasses.replace(data, labels=teacher.head.labels)
    task = kind.read(data, source.tokenizer)
    for note in task.notes:
        print(note)
    kind.check(task, settings.run.metric)
    if teacher is not None:
        distill_lib.check_labels(teacher.head, task.head)
        if task.unlabeled is not None:
            train = distill_lib.with_unlabeled(task.train, task.unlabeled)
            print(
                f"training on {len(task.train)} labelled and {len(task.unlabeled)} unlabeled "
                "examples (the latter from the teacher alone)"
            )
            task = dataclasses.replace(task, train=train)
    batch_size = settings.run.batch_size
    steps_per_epoch = len(task.train) // batch_size
    if steps_per_epoch == 0:
        raise ConfigError(
            f"config.batch_size={batch_size}: the training data {task.train.path} holds "
            f"{len(task.train)} examples, fewer than one batch"
        )
    capacity = settings.run.token_capacity
    if settings.run.micro_batches_by_length:
        capacity = 1.0  # micro-batches of similar length have little padding to skip
    elif capacity == 0.0:
        mesh = sharding.make_mesh(settings.run.mesh_shape, devices=devices)
        capacity = fitting_capacity(
            task.train,
            settings.run.seeds,
            settings.run.num_epochs,
            batch_size,
            settings.run.grad_accum_steps,
            sharding.shards(sharding.BATCH, mesh),
            settings.run.batch_order,
        )
        print(
            f"token packing: the encoder keeps {100 * capacity:.1f} % of each batch shard's "
            "slots, enough for the fullest of this run"
        )
    ft = build_finetuning(
        model_config,
        task.head,
        settings.optimizer_for(steps_per_epoch * settings.run.num_epochs),
        mesh_shape=settings.run.mesh_shape,
        grad_accum_steps=settings.run.grad_accum_steps,
        micro_batch_size=settings.run.micro_batch_size,
        max_seq_length=settings.data.max_seq_length,
        token_capacity=capacity,
        # A capacity chosen from the data (0) fits every batch of the run by construction.
        every_batch_fits=settings.run.token_capacity == 0.0,
        devices=devices,
        distill=distill,
    )
    check_mesh_fits(model_config, ft.mesh)
    if teacher is not None:
        ft = _with_teacher(ft, teacher, settings, kind, task.train)
    run = settings.run
    train_widths = training_widths(
        task.train,
        run.seeds,
        run.num_epochs,
        batch_size,
        run.grad_accum_steps if run.micro_batches_by_length else 1,
        run.length_bucket,
        batch_order=run.batch_order,
    )
    # Validation splits are evaluated after every epoch (their predictions, where the task
    # writes them, are the best evaluation's outputs), test splits predicted once, per seed.
    eval_widths = evaluation_widths(
        [*task.validation, *task.test],
        run.length_bucket,
        passes=[
            len(run.seeds) * n
            for n in [run.num_epochs] * len(task.validation) + [1] * len(task.test)
        ],
        program_positions=EVAL_PROGRAM_POSITIONS,
    )
    if train_widths is not None and eval_widths is not None:
        print(
            f"widths: training {', '.join(map(str, train_widths))}; evaluation "
            f"{', '.join(map(str, eval_widths))} (one program each)"
        )
    return PreparedRun(
        settings,
        ft,
        task,
        source,
        source.tokenizer,
        steps_per_epoch,
        train_widths,
        eval_widths,
    )


def _with_teacher(
    ft: Finetuning,
    teacher: rundir.Run,
    settings: FinetuneSettings,
    kind: task_lib.Task,
    train: Examples,
) -> Finetuning:
    """`ft` whose training batches carry the teacher's outputs, computed on ft's mesh from its
    parameters placed there (frozen: they never enter the train state)."""
    config = settings.model_config(teacher.config)
    objective = kind.objective(config, teacher.head)
    check_mesh_fits(config, ft.mesh)
    distill_lib.check_outputs(objective, ft.objective, train, ft.mesh)
    params = distill_lib.place_teacher(teacher, objective, ft.mesh)
    features = distill_lib.teacher_outputs_of(objective, params, ft.steps)
    print(f"distilling from {teacher.path} ({encoders.family_of(config).describe(config)})")
    return dataclasses.replace(ft, steps=dataclasses.replace(ft.steps, batch_features=features))
