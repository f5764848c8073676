"""A fine-tuning run's settings, read once from its ConfigDict (configs/finetune.py).

`FinetuneSettings.from_config(config)` is the edge; the task named by config.task must be
registered (bertjax.finetune.task), and its metrics are the ones config.metric may name.
The optimizer has the shape pretraining's has (`optim.OptimizerSettings`); only its warmup
is given as a fraction of the steps, resolved by `FinetuneSettings.optimizer_for` once the
data says how many steps there are.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import ml_collections

from bertjax import encoders
from bertjax.engine import optim
from bertjax.engine.settings import (
    ConfigError,
    check_mesh,
    fail,
    positive_int,
    read_optimizer,
    require,
    token_capacity,
)
from bertjax.finetune import distill as distill_lib
from bertjax.finetune import glue_tasks, layouts
from bertjax.finetune import task as task_lib
from bertjax.nn import sharding
from bertjax.storage import fs

# Encoder config fields a fine-tuning run may change (BERT's names, which every family's
# with_overrides reads in its own terms); the rest come from the checkpoint.
FINETUNE_MODEL_FIELDS = (
    "dtype",
    "matmul_dtype",
    "attention_impl",
    "remat_policy",
    "hidden_dropout",
    "attention_dropout",
)


@dataclasses.dataclass(frozen=True)
class FinetuneDataSettings:
    """Where a fine-tuning task's examples come from and how they are laid out."""

    train: str  # a file; with glue_task, the file in dir
    validation: tuple[tuple[str, str], ...]  # (split name, file): GLUE's MNLI has two
    test: tuple[tuple[str, str], ...]  # (split name, file); may be empty
    layouts: tuple[tuple[str, Any], ...]  # (file, finetune.layouts.Layout) for every file
    glue_task: str  # a GLUE task (finetune.glue_tasks.glue_task), or empty
    labels: tuple[str, ...] | None  # GLUE's label set; None: those found in training
    max_seq_length: int
    # What a task reads from its own config fields or block (its optional Task.read_options:
    # seq2seq's source and target fields, config.embedding), or None.
    task_options: Any = None
    # A task's own settings (Task.read_settings of its config section), e.g. question
    # answering's windowing and decoding.
    task_settings: Any = None
    # The config field max_seq_length was read from (a task may read its own), for messages.
    max_seq_length_field: str = "data.max_seq_length"
    # Examples without labels in the training file's format, for distillation to learn from
    # the teacher alone (bertjax.finetune.distill); empty: none.
    unlabeled: str = ""


REGRESSION_BIAS_INITS = ("mean", "zero")
# config.batch_order: "shuffled" draws each batch from the whole epoch at random (google's
# run_classifier); "by_length" makes batches of examples of similar length
# (finetune.batches.epoch_order).
BATCH_ORDERS = ("shuffled", "by_length")


@dataclasses.dataclass(frozen=True)
class FinetuneRunSettings:
    """The shape of a fine-tuning run: epochs, batches, seeds, mesh and intervals."""

    num_epochs: int
    batch_size: int  # global
    grad_accum_steps: int
    eval_batch_size: int  # global
    seeds: tuple[int, ...]  # one run per seed; several report the median
    metric: str  # the best checkpoint is kept by it (higher is better, except mse)
    mesh_shape: tuple[int, ...]
    token_capacity: float  # 0: chosen from the training data (finetune.widths.fitting_capacity)
    # Each training batch is cut to a multiple of this many positions that holds its longest
    # example, one of the few the run's lengths need (finetune.widths.training_widths; 0: always
    # max_seq_length); one compile per width.
    length_bucket: int
    # With grad_accum_steps > 1: each batch's micro-batches hold examples of similar length,
    # each cut to its own length bucket (finetune.batches.train_micro_batches). False: micro-batch
    # k holds rows k, k + A, ... at the batch's width, in one compiled step.
    group_by_length: bool
    log_every_steps: int
    checkpoint_every_steps: int
    # A fresh regression head's bias: "mean" of the training targets, or "zero" (google's).
    regression_bias_init: str = "mean"
    # Threads that compile the run's programs ahead, while it trains (bertjax.engine.compile_ahead;
    # 0: each program is compiled when a step first meets its shape).
    compile_ahead: int = 1
    # "shuffled": each batch a random draw from the epoch; "by_length": batches of examples of
    # similar length (finetune.batches.epoch_order), so they carry little padding.
    batch_order: str = "shuffled"

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps

    @property
    def micro_batches_by_length(self) -> bool:
        return self.group_by_length and self.grad_accum_steps > 1


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    """Everything a fine-tuning run needs to know, validated."""

    init_from: str  # a bertjax workdir, a bertjax export or a Hugging Face BERT directory
    task: str  # a registered task (bertjax.finetune.task.names())
    model_overrides: dict  # FINETUNE_MODEL_FIELDS given by config.model
    # AdamW with BERT's decay mask and a linear schedule; its warmup_steps and total_steps
    # are placeholders until optimizer_for knows the run's length.
    optimizer: optim.OptimizerSettings
    warmup_fraction: float  # of the run's steps, warming up (google's 0.1)
    data: FinetuneDataSettings
    run: FinetuneRunSettings
    config: dict  # the config as given, kept in checkpoint meta for the record
    # A checkpoint step of an init_from work directory (None: its newest, or a fine-tuning
    # run's best); set by programs that compare checkpoints (bertjax.glue), not by a field.
    init_step: int | None = None
    # config.distill: the teacher the model learns from besides the labels (None: the labels
    # alone).
    distill: distill_lib.DistillSettings | None = None

    @classmethod
    def from_config(
        cls,
        config: ml_collections.ConfigDict,
        *,
        devices: list[jax.Device] | None = None,
        process_count: int = 1,
    ) -> FinetuneSettings:
        """Reads and validates a fine-tuning config (see configs/finetune.py for the fields)."""
        return _read_finetune(config, devices=devices, process_count=process_count)

    def optimizer_for(self, total_steps: int) -> optim.OptimizerSettings:
        """The optimizer of a run of total_steps: warmup over warmup_fraction of them, then
        linear decay to 0 at the last step (google-research/bert's run_classifier)."""
        return dataclasses.replace(
            self.optimizer,
            warmup_steps=int(round(self.warmup_fraction * total_steps)),
            total_steps=total_steps,
        )

    def model_config(self, checkpoint_config: Any) -> Any:
        """The checkpoint's architecture with this run's numerics and dropout (in the terms
        of the checkpoint's encoder family)."""
        family = encoders.family_of(checkpoint_config)
        overrides = {**family.finetune_dropout, **self.model_overrides}
        try:
            model = family.with_overrides(checkpoint_config, overrides)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"config.model: {e}") from e
        if self.data.max_seq_length > model.max_position_embeddings:
            raise ConfigError(
                f"config.{self.data.max_seq_length_field}={self.data.max_seq_length}: "
                "exceeds the "
                f"max_position_embeddings={model.max_position_embeddings} of "
                f"config.init_from={self.init_from!r}"
            )
        return model


def _read_finetune(
    config: ml_collections.ConfigDict, *, devices, process_count: int
) -> FinetuneSettings:
    config = apply_task_defaults(config)
    require_ = functools.partial(require, config)
    for field in (
        "num_epochs",
        "batch_size",
        "grad_accum_steps",
        "eval_batch_size",
        "log_every_steps",
        "checkpoint_every_steps",
        "data.max_seq_length",
    ):
        positive_int(config, field)
    distill = read_distill(config)
    if distill is not None:
        require_(
            _is(distill.teacher, "directory", "distill.teacher"),
            "distill.teacher",
            "no such directory",
        )
    from_teacher = distill is not None and bool(distill.student_layers)
    if from_teacher:
        require_(
            not config.init_from,
            "init_from",
            "distill.student_layers starts the student from the teacher's layers; leave "
            "init_from empty (or drop student_layers to start from init_from)",
        )
    else:
        require_(
            config.init_from is not None and config.init_from != "",
            "init_from",
            "set it to the model to fine-tune: a bertjax work directory, a directory written "
            "by Model.save_hf, or a Hugging Face BERT directory (config.json, weights, "
            "tokenizer)",
        )
        require_(_is(config.init_from, "directory", "init_from"), "init_from", "no such directory")
    glue = glue_tasks.glue_task(config.data.glue_task) if config.data.glue_task else None
    require_(
        not config.data.glue_task or glue is not None,
        "data.glue_task",
        f"must be one of {sorted(glue_tasks.GLUE_TASKS)} (or empty for your own files)",
    )
    task = config.task or (glue.task if glue else "")
    require_(
        task in task_lib.names(),
        "task",
        f"must be one of {task_lib.names()}"
        + ("" if config.task else " (empty only with data.glue_task, which implies one)"),
    )
    if glue is not None:
        require_(
            task == glue.task,
            "task",
            f"GLUE's {config.data.glue_task} is a {glue.task} task; set --config.task="
            f"{glue.task} or leave it empty",
        )
    require_(3 <= config.data.max_seq_length, "data.max_seq_length", "must be at least 3")
    spec = task_lib.get(task)
    if distill is not None:
        able = [name for name in task_lib.names() if task_lib.get(name).distills]
        require_(
            spec.distills,
            "distill.teacher",
            f"a {task} run does not distil; tasks that do: {able}",
        )
    unlabeled = config.data.get("unlabeled", "")
    if unlabeled:
        require_(
            distill is not None,
            "data.unlabeled",
            "examples without labels teach only through a teacher: set config.distill.teacher",
        )
        require_(_is(unlabeled, "file", "data.unlabeled"), "data.unlabeled", "no such file")
    # A task with settings of its own reads (and checks) them itself.
    inputs = spec.read_options(config)
    if glue:
        data = _read_finetune_glue(config, glue)
    else:
        data = _read_finetune_files(config, task, inputs)
    if inputs is not None:
        data = dataclasses.replace(
            data,
            task_options=inputs.options,
            max_seq_length=inputs.max_seq_length or data.max_seq_length,
            max_seq_length_field=(
                inputs.max_seq_length_field if inputs.max_seq_length else "data.max_seq_length"
            ),
        )
    metric = config.metric or (glue.metric if glue else spec.default_metric)
    require_(
        metric in spec.metrics,
        "metric",
        f"must be one of {spec.metrics} for a {task} task (or empty: "
        f"{glue.metric if glue else spec.default_metric})",
    )
    seeds = config.seeds if isinstance(config.seeds, (tuple, list)) else (config.seeds,)
    require_(
        bool(seeds)
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        and len(set(seeds)) == len(seeds),
        "seeds",
        "must be distinct integers >= 0, e.g. --config.seeds=1,2,3",
    )
    capacity = token_capacity(config, zero_means="chooses from the training data")
    bucket = config.length_bucket
    require_(
        isinstance(bucket, int) and not isinstance(bucket, bool) and bucket >= 0,
        "length_bucket",
        "must be an integer >= 0 (0 pads every batch to data.max_seq_length)",
    )
    require_(
        isinstance(config.group_by_length, bool),
        "group_by_length",
        "must be True or False",
    )
    batch_order = config.get("batch_order", "shuffled")
    require_(
        batch_order in BATCH_ORDERS,
        "batch_order",
        f"must be one of {BATCH_ORDERS} (by_length: batches of examples of similar length)",
    )
    compile_threads = config.get("compile_ahead", 1)
    require_(
        isinstance(compile_threads, int)
        and not isinstance(compile_threads, bool)
        and compile_threads >= 0,
        "compile_ahead",
        "must be an integer >= 0 (threads compiling the run's programs ahead; 0: off)",
    )
    require_(
        config.regression_bias_init in REGRESSION_BIAS_INITS,
        "regression_bias_init",
        f"valid values are {REGRESSION_BIAS_INITS}",
    )
    run = FinetuneRunSettings(
        num_epochs=config.num_epochs,
        batch_size=config.batch_size,
        grad_accum_steps=config.grad_accum_steps,
        eval_batch_size=config.eval_batch_size,
        seeds=tuple(seeds),
        metric=metric,
        mesh_shape=tuple(config.mesh_shape),
        token_capacity=capacity,
        length_bucket=bucket,
        group_by_length=config.group_by_length,
        log_every_steps=config.log_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
        regression_bias_init=config.regression_bias_init,
        compile_ahead=compile_threads,
        batch_order=batch_order,
    )
    mesh = check_mesh(config, run, devices, process_count)
    data_parallel = sharding.data_parallel_size(mesh)
    require_(
        run.eval_batch_size % data_parallel == 0,
        "eval_batch_size",
        f"must be divisible by the data-parallel size {data_parallel} (mesh data x fsdp of "
        f"{tuple(mesh.shape.values())})",
    )

    # Unset dropouts are the family's (EncoderFamily.finetune_dropout), resolved once
    # init_from's family is known (model_config).
    model_overrides = {k: v for k, v in dict(config.model).items() if v is not None}
    unknown = sorted(set(model_overrides) - set(FINETUNE_MODEL_FIELDS))
    require_(not unknown, "model", f"fields {unknown} cannot change: valid {FINETUNE_MODEL_FIELDS}")
    # Their values are checked by the checkpoint's family, once init_from is open
    # (model_config), before any data is read.

    warmup_fraction = config.optimizer.warmup_fraction
    require_(
        isinstance(warmup_fraction, (int, float)) and 0.0 <= warmup_fraction <= 1.0,
        "optimizer.warmup_fraction",
        "must be in [0, 1] (google's 0.1: warm up over the first 10% of the steps)",
    )
    fields = {k: v for k, v in config.optimizer.items() if k != "warmup_fraction"}
    # The fields checked on a stand-in length; the real one follows from the data.
    optimizer = read_optimizer(
        ml_collections.ConfigDict({"optimizer": fields}),
        name="adamw",
        schedule="linear",
        warmup_steps=0,
        total_steps=1,
    )
    if unlabeled:
        data = _with_unlabeled(config, data, unlabeled)
    return FinetuneSettings(
        init_from=config.init_from or (distill.teacher if from_teacher else ""),
        task=task,
        model_overrides=model_overrides,
        optimizer=optimizer,
        warmup_fraction=float(warmup_fraction),
        data=data,
        run=run,
        config=config.to_dict(),
        distill=distill,
    )


def _with_unlabeled(config, data: FinetuneDataSettings, unlabeled: str) -> FinetuneDataSettings:
    """`data` with config.data.unlabeled: laid out as the training file is, without labels
    (a GLUE task's: as its test files are)."""
    layout = dict(data.layouts).get(data.train)
    layouts_ = data.layouts
    if data.glue_task:
        glue = glue_tasks.glue_task(data.glue_task)
        layout = glue.test[0][1].layout if glue.test else layout
        layouts_ = (*layouts_, (unlabeled, dataclasses.replace(layout, label_field=None)))
    elif layout is not None:
        kind = layout.format
        if not config.data.format and layout.format != layouts.CONLL:
            kind = layouts.EXTENSIONS.get(fs.path(unlabeled).suffix.lower(), layout.format)
        require(
            config,
            kind == layout.format,
            "data.unlabeled",
            f"is read as {kind}, the training file as {layout.format}: examples without "
            "labels come in the training file's format",
        )
        layouts_ = (*layouts_, (unlabeled, dataclasses.replace(layout, label_field=None)))
    return dataclasses.replace(data, unlabeled=unlabeled, layouts=layouts_)


# Fields configs/finetune.py leaves unset, so that a task's own default (Task.config_defaults)
# applies only where the user gave no value: these are the values of every other task.
UNSET_DEFAULTS = {
    "optimizer.learning_rate": 2e-5,
    "num_epochs": 3,
    "data.max_seq_length": 128,
}


def apply_task_defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config with each unset field (None) at the named task's own default, or else at
    UNSET_DEFAULTS'; a value the user gave is never replaced."""
    task = config.get("task")
    defaults = dict(UNSET_DEFAULTS)
    if task in task_lib.names():
        defaults.update(task_lib.get(task).config_defaults)
    config = ml_collections.ConfigDict(config.to_dict())
    for field, value in defaults.items():
        *parents, name = field.split(".")
        node = functools.reduce(lambda c, key: c[key], parents, config)
        if node.get(name) is None:
            node[name] = value
    return config


def _is(path: str, kind: str, field: str) -> bool:
    """Whether `path` (local or gs://) is a "file" or a "directory"; a bucket that is missing
    or refused, or a scheme this library cannot reach, fails naming the field."""
    try:
        return fs.kind(path) == kind
    except fs.StorageError as err:
        raise ConfigError(f"config.{field}: {err}") from None


def _read_finetune_glue(config, glue) -> FinetuneDataSettings:
    require_ = functools.partial(require, config)
    d = config.data
    require_(bool(d.dir), "data.dir", f"set it to GLUE's {d.glue_task} directory (train.tsv, ...)")
    require_(_is(d.dir, "directory", "data.dir"), "data.dir", "no such directory")
    for field in ("train", "validation", "test"):
        require_(
            not d[field],
            f"data.{field}",
            f"data.glue_task={d.glue_task!r} reads GLUE's files in data.dir; leave it empty",
        )

    def path(name: str) -> str:
        return fs.join(d.dir, name)

    required = [glue.train, *(f for _, f in glue.validation)]
    for file in required:
        require_(
            _is(path(file.name), "file", "data.dir"),
            "data.dir",
            f"has no {file.name}: GLUE's {d.glue_task} directory holds "
            f"{[f.name for f in required]}",
        )
    test = tuple(
        (name, path(f.name)) for name, f in glue.test if _is(path(f.name), "file", "data.dir")
    )
    files = [glue.train, *(f for _, f in glue.validation), *(f for _, f in glue.test)]
    return FinetuneDataSettings(
        train=path(glue.train.name),
        validation=tuple((name, path(f.name)) for name, f in glue.validation),
        test=test,
        layouts=tuple((path(f.name), f.layout) for f in files),
        glue_task=d.glue_task,
        labels=glue.labels,
        max_seq_length=d.max_seq_length,
    )


def _read_task_files(config, spec) -> FinetuneDataSettings:
    """config.data's files for a task that reads them itself, and its config section
    (spec.settings_section) as spec.read_settings makes it."""
    require_ = functools.partial(require, config)
    d = config.data
    require_(bool(d.train), "data.train", f"set it to the {spec.name} training file")
    require_(
        bool(d.validation),
        "data.validation",
        "set it to a validation file: each epoch is scored on it to keep the best checkpoint",
    )
    for field in ("train", "validation", "test"):
        if d[field]:
            require_(_is(d[field], "file", f"data.{field}"), f"data.{field}", "no such file")
    section = spec.settings_section
    values = config[section].to_dict() if section in config else {}
    try:
        task_settings = spec.read_settings(values, d.max_seq_length)
    except ValueError as err:
        # A task's message that names the config field itself is kept as it is.
        message = str(err) if str(err).startswith("config.") else f"config.{section}: {err}"
        raise ConfigError(message) from None
    return FinetuneDataSettings(
        train=d.train,
        validation=((layouts.VALIDATION, d.validation),),
        test=((layouts.TEST, d.test),) if d.test else (),
        layouts=(),
        glue_task="",
        labels=None,
        max_seq_length=d.max_seq_length,
        task_settings=task_settings,
    )


def _read_finetune_files(config, task: str, inputs=None) -> FinetuneDataSettings:
    """`inputs`: what the task's read_options read (its own text and label fields)."""
    spec = task_lib.get(task)
    if spec.settings_section:  # files and settings of its own (SQuAD's)
        return _read_task_files(config, spec)
    require_ = functools.partial(require, config)
    d = config.data
    require_(
        bool(d.train),
        "data.train",
        "set it to the training file (CSV, TSV, JSON Lines or CoNLL), or set data.glue_task",
    )
    require_(
        bool(d.validation),
        "data.validation",
        "set it to a validation file: each epoch is evaluated on it to keep the best checkpoint",
    )
    require_(
        d.format in ("", *layouts.FORMATS),
        "data.format",
        f"must be one of {layouts.FORMATS} (or empty: by each file's extension)",
    )
    text_fields = tuple(f.strip() for f in d.text_fields.split(",") if f.strip())
    token_task = task_lib.get(task).conll_files
    label_field = d.label_field
    if inputs is not None and inputs.fields is not None:
        text_fields, label_field = inputs.fields
    # A task that reads its own options (Task.read_options) checks its text fields there.
    elif not token_task and inputs is None:
        require_(
            len(text_fields) in (1, 2),
            "data.text_fields",
            "must name one text field, or two for sentence pairs (e.g. sentence1,sentence2)",
        )
        require_(bool(d.label_field), "data.label_field", "must name the label field")
    require_(
        not d.label_separator or task_lib.get(task).label_separator,
        "data.label_separator",
        "applies to multi_label tasks only; leave it empty",
    )
    layout_of = []
    for field in ("train", "validation", "test"):
        file = d[field]
        if not file:
            continue
        require_(_is(file, "file", f"data.{field}"), f"data.{field}", "no such file")
        kind = d.format or layouts.EXTENSIONS.get(fs.path(file).suffix.lower())
        if kind is None and token_task:
            kind = layouts.CONLL  # CoNLL files come as .txt, .conll, .iob ...
        require_(
            kind is not None,
            f"data.{field}",
            f"its extension does not say its format; set data.format to one of {layouts.FORMATS}",
        )
        require_(
            (kind == layouts.CONLL) == token_task,
            f"data.{field}" if not d.format else "data.format",
            f"is read as {kind}; "
            + (
                "token_classification reads CoNLL files (token TAG lines)"
                if token_task
                else f"CoNLL files are for token_classification, not {task}"
            ),
        )
        layout_of.append(
            (
                file,
                layouts.Layout(
                    kind,
                    text_fields if kind != layouts.CONLL else (),
                    label_field if kind != layouts.CONLL else None,
                    label_separator=d.label_separator,
                ),
            )
        )
    return FinetuneDataSettings(
        train=d.train,
        validation=((layouts.VALIDATION, d.validation),),
        test=((layouts.TEST, d.test),) if d.test else (),
        layouts=tuple(layout_of),
        glue_task="",
        labels=None,
        max_seq_length=d.max_seq_length,
    )


def read_distill(config: ml_collections.ConfigDict) -> distill_lib.DistillSettings | None:
    """config.distill, checked (None without a teacher)."""
    section = config.get("distill")
    if section is None:
        return None
    if not section.get("teacher"):
        unset = distill_lib.DistillSettings(teacher="")
        for field in ("alpha", "temperature", "student_layers"):
            value = section.get(field)
            if value not in (None, "") and value != getattr(unset, field):
                raise fail(
                    f"distill.{field}", value, "applies to distillation: set distill.teacher"
                )
        return None

    require_ = functools.partial(require, config)
    alpha, temperature = section.get("alpha", 0.5), section.get("temperature", 2.0)
    number = (int, float)
    require_(
        isinstance(alpha, number) and not isinstance(alpha, bool) and 0.0 <= alpha <= 1.0,
        "distill.alpha",
        "must be in [0, 1]: the teacher's share of the loss (1: the teacher alone)",
    )
    require_(
        isinstance(temperature, number)
        and not isinstance(temperature, bool)
        and 0.0 < temperature <= 100.0,
        "distill.temperature",
        "must be in (0, 100]: the softening of both networks' logits (DistilBERT: 2)",
    )
    layers = section.get("student_layers", "")
    try:
        layers = distill_lib.parse_layers(layers)
    except ValueError as err:
        raise fail("distill.student_layers", layers, str(err)) from None
    return distill_lib.DistillSettings(
        teacher=str(section.teacher),
        alpha=float(alpha),
        temperature=float(temperature),
        student_layers=layers,
    )
