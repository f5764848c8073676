"""The one reader of a training ConfigDict: frozen, typed settings, each field validated once.

`PretrainSettings.from_config(config)` is the edge. Everything below it takes these settings
(or the plain values in them), never a ConfigDict, and nothing re-validates what was checked
here. A mistake fails with a `ConfigError` whose message names the field, its value and what
would be valid, before any data is read or anything is compiled.

Facts that only exist later are checked where they enter: the tokenizer's vocabulary when
the data is ready (`PretrainSettings.model_config`), the prepared data's sequence length and
eval split in `workdir.ensure_data`, an existing checkpoint's architecture in
`workdir.check_compatible`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import glob
import os
import pathlib
from typing import Any

import jax
import ml_collections

from bertjax import heads, optim, sharding
from bertjax.data import instances
from bertjax.data.masking import MaskingSettings
from bertjax.data.storage import MANIFEST_FILE
from bertjax.finetune import layouts, metrics
from bertjax.model import BertConfig
from bertjax.tokenizer import MODEL_TYPES


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field."""


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """Where the pretraining data comes from and how it is prepared and masked."""

    dir: str  # a prepared data directory; empty: <workdir>/data
    inputs: tuple[str, ...]  # raw text files, globs or directories to prepare
    max_seq_length: int
    vocab_size: int  # of a tokenizer trained here
    tokenizer_model_type: str
    tokenizer: str  # an existing sentencepiece model instead of training one
    lowercase: bool
    task: str  # nsp | sop
    dupe_factor: int
    short_seq_prob: float
    eval_fraction: float
    workers: int  # 0: one per CPU core
    masking: MaskingSettings


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The shape of the run: batch, steps, mesh and intervals."""

    seed: int
    num_train_steps: int
    batch_size: int  # global, over all processes and devices
    grad_accum_steps: int
    token_capacity: float
    mesh_shape: tuple[int, ...]
    log_every_steps: int
    eval_every_steps: int
    eval_batches: int  # 0: the whole eval split
    checkpoint_every_steps: int
    keep_checkpoints: int
    init_from: str  # a workdir or checkpoint directory whose params start the run
    peak_flops_per_device: float  # 0: look the device up
    fill_mask_samples: int  # held-out sentences shown with their fill-mask guesses at the end

    @property
    def micro_batch_size(self) -> int:
        """Rows per micro-batch; evaluation uses batches of this size too (they fit)."""
        return self.batch_size // self.grad_accum_steps


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """Everything a pretraining run needs to know, validated."""

    # The architecture; its vocab_size is provisional until the tokenizer is known.
    model: BertConfig
    requested_vocab_size: int  # config.model.vocab_size: 0 takes the tokenizer's
    optimizer: optim.OptimizerSettings
    data: DataSettings
    run: RunSettings
    config: dict  # the config as given, kept in checkpoints for the record

    @classmethod
    def from_config(
        cls,
        config: ml_collections.ConfigDict,
        *,
        devices: list[jax.Device] | None = None,
        process_count: int = 1,
    ) -> PretrainSettings:
        """Reads and validates a training config (see configs/default.py for the fields)."""
        return _read(config, devices=devices, process_count=process_count)

    def model_config(self, vocab_size: int) -> BertConfig:
        """The architecture with the tokenizer's vocabulary; fails if the config asked for
        another size."""
        if self.requested_vocab_size and self.requested_vocab_size != vocab_size:
            raise ConfigError(
                f"config.model.vocab_size={self.requested_vocab_size} does not match the "
                f"tokenizer's vocabulary of {vocab_size}; set it to 0 to take the tokenizer's size"
            )
        return dataclasses.replace(self.model, vocab_size=vocab_size)


def config_value(config: ml_collections.ConfigDict, dotted: str) -> Any:
    """The value of a dotted field, e.g. "optimizer.learning_rate"; KeyError if absent."""
    value = config
    for part in dotted.split("."):
        value = value[part]
    return value


def _fail(field: str, value: Any, message: str) -> ConfigError:
    return ConfigError(f"config.{field}={value!r}: {message}")


def _require(config: ml_collections.ConfigDict, ok: bool, field: str, message: str) -> None:
    if not ok:
        raise _fail(field, config_value(config, field), message)


def _positive_int(config: ml_collections.ConfigDict, field: str) -> int:
    value = config_value(config, field)
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    _require(config, ok, field, "must be a positive integer")
    return value


def _token_capacity(config: ml_collections.ConfigDict, zero_means: str = "") -> float:
    """token_capacity in (0, 1]; also 0 where `zero_means` says what 0 does."""
    value = config.token_capacity
    ok = isinstance(value, (int, float)) and (value >= 0 if zero_means else value > 0)
    ok = ok and value <= 1.0
    allowed = f"[0, 1] (0 {zero_means}, " if zero_means else "(0, 1] ("
    _require(config, ok, "token_capacity", f"must be in {allowed}1 turns token packing off)")
    return float(value)


def _read(config, *, devices, process_count: int) -> PretrainSettings:
    for field in (
        "num_train_steps",
        "batch_size",
        "grad_accum_steps",
        "log_every_steps",
        "eval_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "data.max_seq_length",
        "data.max_predictions_per_seq",
        "data.vocab_size",
        "data.dupe_factor",
    ):
        _positive_int(config, field)
    require = functools.partial(_require, config)
    require(config.eval_batches >= 0, "eval_batches", "must be >= 0 (0 evaluates the whole split)")
    require(
        isinstance(config.fill_mask_samples, int) and config.fill_mask_samples >= 0,
        "fill_mask_samples",
        "must be an integer >= 0 (0 shows none)",
    )
    require(
        config.peak_flops_per_device >= 0,
        "peak_flops_per_device",
        "must be >= 0 (0: look up the device)",
    )
    _token_capacity(config)

    run = RunSettings(
        seed=config.seed,
        num_train_steps=config.num_train_steps,
        batch_size=config.batch_size,
        grad_accum_steps=config.grad_accum_steps,
        token_capacity=float(config.token_capacity),
        mesh_shape=tuple(config.mesh_shape),
        log_every_steps=config.log_every_steps,
        eval_every_steps=config.eval_every_steps,
        eval_batches=config.eval_batches,
        checkpoint_every_steps=config.checkpoint_every_steps,
        keep_checkpoints=config.keep_checkpoints,
        init_from=config.init_from or "",
        peak_flops_per_device=float(config.peak_flops_per_device),
        fill_mask_samples=config.fill_mask_samples,
    )
    data = _read_data(config)
    model_fields = dict(config.model)
    preset = model_fields.pop("preset")
    requested_vocab = model_fields.pop("vocab_size")
    try:
        # Provisional until the tokenizer is known: the size the tokenizer will be trained to.
        model = BertConfig.preset(
            preset, vocab_size=requested_vocab or data.vocab_size, **model_fields
        )
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.model: {e}") from e
    require(
        data.max_seq_length <= model.max_position_embeddings,
        "data.max_seq_length",
        f"exceeds the model's max_position_embeddings={model.max_position_embeddings}",
    )
    try:
        optimizer = optim.OptimizerSettings(
            total_steps=config.num_train_steps, **dict(config.optimizer)
        )
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.optimizer: {e}") from e

    mesh = _check_mesh(config, run, devices, process_count)
    check_mesh_fits(model, mesh, check_vocab=bool(requested_vocab))
    require(
        config.init_from is not None,
        "init_from",
        "this recipe continues another run: set --config.init_from=<its workdir>",
    )
    if config.init_from:
        require(
            os.path.exists(config.init_from),
            "init_from",
            "no such workdir or checkpoint directory",
        )
    return PretrainSettings(
        model=model,
        requested_vocab_size=requested_vocab,
        optimizer=optimizer,
        data=data,
        run=run,
        config=config.to_dict(),
    )


def _read_data(config) -> DataSettings:
    require = functools.partial(_require, config)
    d = config.data
    require(0.0 < d.masked_lm_prob < 1.0, "data.masked_lm_prob", "must be in (0, 1)")
    require(
        d.max_predictions_per_seq <= d.max_seq_length,
        "data.max_predictions_per_seq",
        f"must be <= data.max_seq_length={d.max_seq_length}",
    )
    require(d.task in instances.TASKS, "data.task", f"must be one of {instances.TASKS}")
    require(
        d.tokenizer_model_type in MODEL_TYPES,
        "data.tokenizer_model_type",
        f"must be one of {MODEL_TYPES}",
    )
    require(
        0.0 < d.eval_fraction < 1.0,
        "data.eval_fraction",
        "must be in (0, 1): evaluation needs a held-out split",
    )
    inputs = tuple(path.strip() for path in d.input.split(",") if path.strip())
    for path in inputs:
        require(
            os.path.exists(path) or bool(glob.glob(path, recursive=True)),
            "data.input",
            f"{path!r} matches no file or directory",
        )
    if d.dir and not inputs:
        require(
            (pathlib.Path(d.dir) / MANIFEST_FILE).exists(),
            "data.dir",
            "holds no prepared data (no manifest) and data.input names nothing to prepare; "
            "run python -m bertjax.data.prepare or set data.input",
        )
    if d.tokenizer:
        require(os.path.isfile(d.tokenizer), "data.tokenizer", "no such file")
    return DataSettings(
        dir=d.dir,
        inputs=inputs,
        max_seq_length=d.max_seq_length,
        vocab_size=d.vocab_size,
        tokenizer_model_type=d.tokenizer_model_type,
        tokenizer=d.tokenizer,
        lowercase=d.lowercase,
        task=d.task,
        dupe_factor=d.dupe_factor,
        short_seq_prob=d.short_seq_prob,
        eval_fraction=d.eval_fraction,
        workers=d.workers,
        masking=MaskingSettings(
            masked_lm_prob=d.masked_lm_prob,
            max_predictions_per_seq=d.max_predictions_per_seq,
            whole_word_masking=d.whole_word_masking,
        ),
    )


def _check_mesh(config, run: RunSettings, devices, process_count: int) -> jax.sharding.Mesh:
    """The mesh the run asks for, with the batch checks that depend on it."""
    require = functools.partial(_require, config)
    try:
        mesh = sharding.make_mesh(run.mesh_shape, devices=devices)
    except ValueError as e:
        raise ConfigError(f"config.mesh_shape={run.mesh_shape}: {e}") from e
    mesh_shape = tuple(mesh.shape.values())
    data_parallel = sharding.data_parallel_size(mesh)
    require(
        run.batch_size % run.grad_accum_steps == 0,
        "batch_size",
        f"must be divisible by grad_accum_steps={run.grad_accum_steps}",
    )
    require(
        run.micro_batch_size % data_parallel == 0,
        "batch_size",
        f"each micro-batch ({run.micro_batch_size} = batch_size / grad_accum_steps) must be "
        f"divisible by the data-parallel size {data_parallel} (mesh data x fsdp of {mesh_shape})",
    )
    require(
        run.batch_size % process_count == 0,
        "batch_size",
        f"must be divisible by the number of processes ({process_count})",
    )
    # Each process feeds its own rows, so the batch must be split across processes.
    require(
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


def check_mesh_fits(model: BertConfig, mesh: jax.sharding.Mesh, check_vocab: bool = True) -> None:
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


# ---------------------------------------------------------------------------------------------
# Fine-tuning (finetune.py, configs/finetune.py)

# BertConfig fields a fine-tuning run may change; the rest come from the checkpoint.
FINETUNE_MODEL_FIELDS = (
    "dtype",
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
    glue_task: str  # a key of finetune.layouts.GLUE_TASKS, or empty
    labels: tuple[str, ...] | None  # GLUE's label set; None: those found in training
    max_seq_length: int


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
    token_capacity: float  # 0: chosen from the training data (finetune.loop.fitting_capacity)
    # Each training batch is cut to the smallest multiple of this many positions that holds
    # its longest example (0: always max_seq_length); one compile per width.
    length_bucket: int
    log_every_steps: int
    checkpoint_every_steps: int

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    """Everything a fine-tuning run needs to know, validated."""

    init_from: str  # a bertjax workdir, a bertjax export or a Hugging Face BERT directory
    task: str  # one of bertjax.heads.TASKS
    model_overrides: dict  # FINETUNE_MODEL_FIELDS given by config.model
    learning_rate: float
    warmup_fraction: float
    optimizer_fields: dict  # the rest of optim.OptimizerSettings (weight_decay, b1, ...)
    data: FinetuneDataSettings
    run: FinetuneRunSettings
    config: dict  # the config as given, kept in checkpoint meta for the record

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

    def optimizer(self, total_steps: int) -> optim.OptimizerSettings:
        """AdamW with BERT's decay mask: warmup over warmup_fraction of the steps, then linear
        decay to 0 at the last step (google-research/bert's run_classifier)."""
        return optim.OptimizerSettings(
            name="adamw",
            learning_rate=self.learning_rate,
            warmup_steps=int(round(self.warmup_fraction * total_steps)),
            total_steps=total_steps,
            schedule="linear",
            **self.optimizer_fields,
        )

    def model_config(self, checkpoint_config: BertConfig) -> BertConfig:
        """The checkpoint's architecture with this run's numerics and dropout."""
        model = dataclasses.replace(checkpoint_config, **self.model_overrides)
        if self.data.max_seq_length > model.max_position_embeddings:
            raise ConfigError(
                f"config.data.max_seq_length={self.data.max_seq_length}: exceeds the "
                f"max_position_embeddings={model.max_position_embeddings} of "
                f"config.init_from={self.init_from!r}"
            )
        return model


def _read_finetune(config, *, devices, process_count: int) -> FinetuneSettings:
    require = functools.partial(_require, config)
    for field in (
        "num_epochs",
        "batch_size",
        "grad_accum_steps",
        "eval_batch_size",
        "log_every_steps",
        "checkpoint_every_steps",
        "data.max_seq_length",
    ):
        _positive_int(config, field)
    require(
        config.init_from is not None and config.init_from != "",
        "init_from",
        "set it to the model to fine-tune: a bertjax work directory, a directory written by "
        "bertjax.hf.save, or a Hugging Face BERT directory (config.json, weights, tokenizer)",
    )
    require(os.path.isdir(config.init_from), "init_from", "no such directory")
    glue = layouts.glue_task(config.data.glue_task) if config.data.glue_task else None
    require(
        not config.data.glue_task or glue is not None,
        "data.glue_task",
        f"must be one of {sorted(layouts.GLUE_TASKS)} (or empty for your own files)",
    )
    task = config.task or (glue.task if glue else "")
    require(
        task in heads.TASKS,
        "task",
        f"must be one of {heads.TASKS}"
        + ("" if config.task else " (empty only with data.glue_task, which implies one)"),
    )
    if glue is not None:
        require(
            task == glue.task,
            "task",
            f"GLUE's {config.data.glue_task} is a {glue.task} task; set --config.task="
            f"{glue.task} or leave it empty",
        )
    require(3 <= config.data.max_seq_length, "data.max_seq_length", "must be at least 3")
    data = _read_finetune_glue(config, glue) if glue else _read_finetune_files(config, task)

    metric = config.metric or (glue.metric if glue else metrics.DEFAULT_METRIC[task])
    require(
        metric in metrics.METRIC_NAMES[task],
        "metric",
        f"must be one of {metrics.METRIC_NAMES[task]} for a {task} task (or empty: "
        f"{glue.metric if glue else metrics.DEFAULT_METRIC[task]})",
    )
    seeds = config.seeds if isinstance(config.seeds, (tuple, list)) else (config.seeds,)
    require(
        bool(seeds)
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        and len(set(seeds)) == len(seeds),
        "seeds",
        "must be distinct integers >= 0, e.g. --config.seeds=1,2,3",
    )
    capacity = _token_capacity(config, zero_means="chooses from the training data")
    bucket = config.length_bucket
    require(
        isinstance(bucket, int) and not isinstance(bucket, bool) and bucket >= 0,
        "length_bucket",
        "must be an integer >= 0 (0 pads every batch to data.max_seq_length)",
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
        log_every_steps=config.log_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
    )
    mesh = _check_mesh(config, run, devices, process_count)
    data_parallel = sharding.data_parallel_size(mesh)
    require(
        run.eval_batch_size % data_parallel == 0,
        "eval_batch_size",
        f"must be divisible by the data-parallel size {data_parallel} (mesh data x fsdp of "
        f"{tuple(mesh.shape.values())})",
    )

    model_overrides = dict(config.model)
    unknown = sorted(set(model_overrides) - set(FINETUNE_MODEL_FIELDS))
    require(not unknown, "model", f"fields {unknown} cannot change: valid {FINETUNE_MODEL_FIELDS}")
    try:  # the values checked now; the architecture comes with the checkpoint
        BertConfig(**model_overrides)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.model: {e}") from e

    optimizer_fields = dict(config.optimizer)
    learning_rate = optimizer_fields.pop("learning_rate")
    warmup_fraction = optimizer_fields.pop("warmup_fraction")
    require(
        isinstance(warmup_fraction, (int, float)) and 0.0 <= warmup_fraction <= 1.0,
        "optimizer.warmup_fraction",
        "must be in [0, 1] (google's 0.1: warm up over the first 10% of the steps)",
    )
    try:  # the fields checked on a stand-in length; the real one follows from the data
        optim.OptimizerSettings(
            name="adamw",
            learning_rate=learning_rate,
            warmup_steps=0,
            total_steps=1,
            **optimizer_fields,
        )
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.optimizer: {e}") from e
    return FinetuneSettings(
        init_from=config.init_from,
        task=task,
        model_overrides=model_overrides,
        learning_rate=learning_rate,
        warmup_fraction=float(warmup_fraction),
        optimizer_fields=optimizer_fields,
        data=data,
        run=run,
        config=config.to_dict(),
    )


def _read_finetune_glue(config, glue) -> FinetuneDataSettings:
    require = functools.partial(_require, config)
    d = config.data
    require(bool(d.dir), "data.dir", f"set it to GLUE's {d.glue_task} directory (train.tsv, ...)")
    require(os.path.isdir(d.dir), "data.dir", "no such directory")
    for field in ("train", "validation", "test"):
        require(
            not d[field],
            f"data.{field}",
            f"data.glue_task={d.glue_task!r} reads GLUE's files in data.dir; leave it empty",
        )

    def path(name: str) -> str:
        return os.path.join(d.dir, name)

    required = [glue.train, *(f for _, f in glue.validation)]
    for file in required:
        require(
            os.path.isfile(path(file.name)),
            "data.dir",
            f"has no {file.name}: GLUE's {d.glue_task} directory holds "
            f"{[f.name for f in required]}",
        )
    test = tuple((name, path(f.name)) for name, f in glue.test if os.path.isfile(path(f.name)))
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


def _read_finetune_files(config, task: str) -> FinetuneDataSettings:
    require = functools.partial(_require, config)
    d = config.data
    require(
        bool(d.train),
        "data.train",
        "set it to the training file (CSV, TSV, JSON Lines or CoNLL), or set data.glue_task",
    )
    require(
        bool(d.validation),
        "data.validation",
        "set it to a validation file: each epoch is evaluated on it to keep the best checkpoint",
    )
    require(
        d.format in ("", *layouts.FORMATS),
        "data.format",
        f"must be one of {layouts.FORMATS} (or empty: by each file's extension)",
    )
    text_fields = tuple(f.strip() for f in d.text_fields.split(",") if f.strip())
    token_task = task == heads.TOKEN_CLASSIFICATION
    if not token_task:
        require(
            len(text_fields) in (1, 2),
            "data.text_fields",
            "must name one text field, or two for sentence pairs (e.g. sentence1,sentence2)",
        )
        require(bool(d.label_field), "data.label_field", "must name the label field")
    require(
        not d.label_separator or task == heads.MULTI_LABEL,
        "data.label_separator",
        "applies to multi_label tasks only; leave it empty",
    )
    layout_of = []
    for field in ("train", "validation", "test"):
        file = d[field]
        if not file:
            continue
        require(os.path.isfile(file), f"data.{field}", "no such file")
        kind = d.format or layouts.EXTENSIONS.get(pathlib.Path(file).suffix.lower())
        if kind is None and token_task:
            kind = layouts.CONLL  # CoNLL files come as .txt, .conll, .iob ...
        require(
            kind is not None,
            f"data.{field}",
            f"its extension does not say its format; set data.format to one of {layouts.FORMATS}",
        )
        require(
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
                    d.label_field if kind != layouts.CONLL else None,
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
