"""A pretraining run's settings, read once from its ConfigDict (configs/default.py).

`PretrainSettings.from_config(config)` is the edge. Facts that only exist later are checked
where they enter: the tokenizer's vocabulary when the data is ready
(`PretrainSettings.model_config`), the prepared data's sequence length and eval split in
`bertjax.pretrain.data.ensure_data`, an existing checkpoint's architecture in
`bertjax.engine.rundir.check_compatible`.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
from typing import Any

import jax
import ml_collections

from bertjax import encoders
from bertjax.data import instances, mixture, packing
from bertjax.data.corpus import expand_paths
from bertjax.data.masking import MaskingSettings
from bertjax.data.storage import MANIFEST_FILE
from bertjax.engine import optim
from bertjax.engine.settings import (
    ConfigError,
    check_mesh,
    check_mesh_fits,
    positive_int,
    read_optimizer,
    require,
    token_capacity,
)
from bertjax.nn import sharding
from bertjax.pretrain import objectives
from bertjax.pretrain.objectives.mlm import SENTENCE_PAIR_PARAMS
from bertjax.storage import fs
from bertjax.text.tokenizer import Tokenizer
from bertjax.text.training import MODEL_TYPES

# What a step minimises: the registered objectives' names (bertjax.pretrain.objectives).
OBJECTIVES = objectives.names()
__all__ = ["OBJECTIVES", "SENTENCE_PAIR_PARAMS", "DataSettings", "PretrainSettings", "RunSettings"]


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
    masking: MaskingSettings  # of the training batches
    eval_masking: MaskingSettings  # of the held-out batches: a fixed rate, whatever training's
    # "pairs": google's [CLS] A [SEP] B [SEP] instances; "packed": whole documents packed into
    # rows, each attending to itself only (bertjax.data.packing), for the MLM-only objective.
    layout: str = "pairs"
    # A weighted mixture instead of inputs (bertjax.data.mixture): each source prepared into
    # its own directory under dir (default <workdir>/data), one tokenizer trained on them all.
    sources: tuple[mixture.Source, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The shape of the run: batch, steps, mesh and intervals."""

    seed: int
    num_train_steps: int
    batch_size: int  # global, over all processes and devices
    grad_accum_steps: int
    # Batch-size warmup: the global batch starts at batch_warmup_start rows and grows by
    # that many, linearly, to batch_size at step batch_warmup_steps (0: no warmup).
    batch_warmup_start: int
    batch_warmup_steps: int
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

    @property
    def loader_batch_size(self) -> int:
        """Global rows of one loader batch: a step takes batch_size_at(step) / this many."""
        return self.batch_warmup_start if self.batch_warmup_steps else self.batch_size

    def batch_size_at(self, step: int) -> int:
        """The global batch of the step that takes the state from `step` to `step + 1`.

        It grows in multiples of batch_warmup_start: 1 + floor((n - 1) * step / W) of them for
        step < W = batch_warmup_steps, n = batch_size / batch_warmup_start from step W on.
        Each size compiles the train step once.
        """
        if not self.batch_warmup_steps or step >= self.batch_warmup_steps:
            return self.batch_size
        pieces = self.batch_size // self.batch_warmup_start
        return self.batch_warmup_start * (1 + (pieces - 1) * step // self.batch_warmup_steps)


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """Everything a pretraining run needs to know, validated."""

    # The architecture, an encoder family's config (bertjax.encoders); its vocab_size (and
    # special token ids) are provisional until the tokenizer is known.
    model: Any
    requested_vocab_size: int  # config.model.vocab_size: 0 takes the tokenizer's
    optimizer: optim.OptimizerSettings
    data: DataSettings
    run: RunSettings
    config: dict  # the config as given, kept in checkpoints for the record
    objective: str = "mlm_sentence"  # a registered objective's name
    # The objective's own settings (its `read`), e.g. rtd's generator width and weight.
    objective_settings: Any = None

    @property
    def sentence_pair(self) -> bool:
        """Whether the objective trains (and evaluation reports) the sentence-pair task."""
        return objectives.get(self.objective).sentence_pair

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

    def model_config(self, tokenizer: Tokenizer) -> Any:
        """The architecture with the tokenizer's vocabulary (and special token ids, where the
        family records them); fails if the config asked for another size."""
        vocab_size = tokenizer.vocab_size
        if self.requested_vocab_size and self.requested_vocab_size != vocab_size:
            raise ConfigError(
                f"config.model.vocab_size={self.requested_vocab_size} does not match the "
                f"tokenizer's vocabulary of {vocab_size}; set it to 0 to take the tokenizer's size"
            )
        return encoders.family_of(self.model).with_vocabulary(self.model, tokenizer)


def _read(config: ml_collections.ConfigDict, *, devices, process_count: int) -> PretrainSettings:
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
        positive_int(config, field)
    require_ = functools.partial(require, config)
    require_(config.eval_batches >= 0, "eval_batches", "must be >= 0 (0 evaluates the whole split)")
    require_(
        isinstance(config.fill_mask_samples, int) and config.fill_mask_samples >= 0,
        "fill_mask_samples",
        "must be an integer >= 0 (0 shows none)",
    )
    require_(
        config.peak_flops_per_device >= 0,
        "peak_flops_per_device",
        "must be >= 0 (0: look up the device)",
    )
    token_capacity(config)

    run = RunSettings(
        seed=config.seed,
        num_train_steps=config.num_train_steps,
        batch_size=config.batch_size,
        grad_accum_steps=config.grad_accum_steps,
        batch_warmup_start=config.batch_warmup_start,
        batch_warmup_steps=config.batch_warmup_steps,
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
    # Configs written before encoder families had no family field: BERT.
    family_name = model_fields.pop("family", encoders.DEFAULT_FAMILY)
    preset = model_fields.pop("preset")
    requested_vocab = model_fields.pop("vocab_size")
    try:
        family = encoders.get(family_name)
        # Provisional until the tokenizer is known: the size the tokenizer will be trained to.
        model = family.from_settings(
            preset, {"vocab_size": requested_vocab or data.vocab_size, **model_fields}
        )
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.model: {e}") from e
    require_(
        data.max_seq_length <= model.max_position_embeddings,
        "data.max_seq_length",
        f"exceeds the model's max_position_embeddings={model.max_position_embeddings}",
    )
    for field in ("masked_lm_prob", "eval_masked_lm_prob"):
        # google's count for a full row: a smaller cap would lower the rate of long rows.
        wanted = max(1, round(data.max_seq_length * config.data[field]))
        require_(
            data.masking.max_predictions_per_seq >= wanted,
            "data.max_predictions_per_seq",
            f"caps the predictions of a full row of data.max_seq_length={data.max_seq_length} "
            f"below data.{field}={config.data[field]} ({wanted} of them); raise it to at least "
            f"{wanted}",
        )
    objective = config.objective
    require_(objective in objectives.names(), "objective", f"must be one of {objectives.names()}")
    chosen = objectives.get(objective)
    # The objective sees its own fields as plain values (configs written before it lack them).
    values = chosen.values(config)
    chosen.check(values, family, data.layout)
    objective_settings = chosen.read(values)
    data = dataclasses.replace(
        data,
        masking=chosen.masking(data.masking, data.max_seq_length),
        eval_masking=chosen.masking(data.eval_masking, data.max_seq_length),
    )
    frozen = chosen.frozen(family, model, objective_settings)
    optimizer = read_optimizer(config, total_steps=config.num_train_steps, frozen=frozen)

    mesh = check_mesh(config, run, devices, process_count)
    check_mesh_fits(model, mesh, check_vocab=bool(requested_vocab))
    _check_batch_warmup(config, run, sharding.data_parallel_size(mesh))
    require_(
        config.init_from is not None,
        "init_from",
        "this recipe continues another run: set --config.init_from=<its workdir>",
    )
    if config.init_from:
        require_(
            fs.path(config.init_from).exists(),
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
        objective=objective,
        objective_settings=objective_settings,
    )


def _check_batch_warmup(config, run: RunSettings, data_parallel: int) -> None:
    """Every batch of the warmup splits into the run's micro-batches and device shards."""
    steps, start = run.batch_warmup_steps, run.batch_warmup_start
    ok = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0
    require(config, ok, "batch_warmup_steps", "must be an integer >= 0 (0: no batch warmup)")
    if not steps:
        return
    unit = run.grad_accum_steps * data_parallel
    require(
        config,
        isinstance(start, int) and 0 < start < run.batch_size and run.batch_size % start == 0,
        "batch_warmup_start",
        f"must be a positive divisor of batch_size={run.batch_size} smaller than it",
    )
    require(
        config,
        start % unit == 0,
        "batch_warmup_start",
        f"must be a multiple of grad_accum_steps x the data-parallel size ({unit}), so that "
        "every batch of the warmup splits into equal micro-batches and device shards",
    )


def _read_data(config) -> DataSettings:
    require_ = functools.partial(require, config)
    d = config.data
    for field in ("masked_lm_prob", "eval_masked_lm_prob"):
        require_(0.0 < d[field] < 1.0, f"data.{field}", "must be in (0, 1)")
    require_(
        d.max_predictions_per_seq <= d.max_seq_length,
        "data.max_predictions_per_seq",
        f"must be <= data.max_seq_length={d.max_seq_length}",
    )
    require_(d.task in instances.TASKS, "data.task", f"must be one of {instances.TASKS}")
    # Older configs have no layout field: they hold pairs.
    layout = d.get("layout", "pairs")
    require_(layout in packing.LAYOUTS, "data.layout", f"must be one of {packing.LAYOUTS}")
    require_(
        layout != "packed" or d.dupe_factor == 1,
        "data.dupe_factor",
        "must be 1 with data.layout='packed': packing is not random, so more passes would "
        "repeat the same rows (masking is drawn per batch anyway)",
    )
    require_(
        d.tokenizer_model_type in MODEL_TYPES,
        "data.tokenizer_model_type",
        f"must be one of {MODEL_TYPES}",
    )
    require_(
        0.0 < d.eval_fraction < 1.0,
        "data.eval_fraction",
        "must be in (0, 1): evaluation needs a held-out split",
    )
    inputs = tuple(path.strip() for path in d.input.split(",") if path.strip())
    for path in inputs:
        if fs.is_remote(path):
            fs.path(path)  # the gcs extra is there; what it matches is listed when prepared
            continue
        require_(
            os.path.exists(path) or bool(glob.glob(path, recursive=True)),
            "data.input",
            f"{path!r} matches no file or directory",
        )
    try:
        sources = mixture.parse_sources(d.get("sources", "") or "")
    except mixture.SourcesError as err:
        raise ConfigError(f"config.data.sources: {err}") from None
    require_(
        not (sources and inputs),
        "data.sources",
        "and data.input are both set; name the inputs as one source of the mixture instead",
    )
    for source in sources:
        for path in source.paths:
            if fs.is_remote(path):
                fs.path(path)  # the gcs extra is there; what it matches is listed when prepared
                continue
            try:
                expand_paths([path])
            except FileNotFoundError as err:
                raise ConfigError(f"config.data.sources: source {source.name!r}: {err}") from None
    if d.dir and not inputs and not sources:
        require_(
            (fs.path(d.dir) / MANIFEST_FILE).exists(),
            "data.dir",
            "holds no prepared data (no manifest) and data.input names nothing to prepare; "
            "run python -m bertjax.data.prepare or set data.input",
        )
    if d.tokenizer:
        require_(fs.path(d.tokenizer).is_file(), "data.tokenizer", "no such file")
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
        eval_masking=MaskingSettings(
            masked_lm_prob=d.eval_masked_lm_prob,
            max_predictions_per_seq=d.max_predictions_per_seq,
            whole_word_masking=d.whole_word_masking,
        ),
        layout=layout,
        sources=sources,
    )
