"""The fine-tuning run: train, evaluate after each epoch, keep the best, predict, per seed.

`finetune(settings, workdir)` is the whole job behind `python finetune.py`. Each seed runs the
shared loop (bertjax.engine.loop) with what fine-tuning adds: the epoch's data order, evaluation of
every validation split at each epoch's end by the task's metric, and the best parameters kept
apart. The task itself (reading, objective, scores, predictions) comes from the registry
(bertjax.finetune.task). A run's work directory (names in bertjax.engine.rundir) holds:

    checkpoints/          the latest state (parameters, optimizer state, step), saved after
                          every epoch and every checkpoint_every_steps; rerunning resumes it
    best/                 the parameters of the best epoch by the task's metric (Orbax)
    tokenizer.model       the tokenizer (tokenizer.json for WordPiece), so the directory
                          opens on its own: bertjax.Model.load(workdir) and the method
                          of its capability (predict, answer, embed, generate)
    metrics.jsonl, tensorboard/
    predictions_<split>.tsv   predictions of the best parameters for each test file, as
                          the task writes them (bertjax.tasks)
    result.json           the best epoch and its validation metrics

With several seeds (config.seeds) each seed runs in <workdir>/seed_<n>/ and
<workdir>/seeds.json holds every seed's best value and their median.

The data order of epoch e is drawn from (seed, e) (epoch_order: shuffled, or batches by
length) and dropout keys are folded from the seed and the step, so a resumed run takes the
same steps as an uninterrupted one.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.experimental import multihost_utils

from bertjax import capability, encoders
from bertjax.capability import HeadSpec
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import compile_ahead, metrics_writer, perf, rundir, steps
from bertjax.engine import loop as loop_lib
from bertjax.engine.settings import ConfigError, check_mesh_fits
from bertjax.finetune import metrics as metrics_lib
from bertjax.finetune import task as task_lib
from bertjax.finetune.objective import Finetuning, build_finetuning
from bertjax.finetune.settings import BATCH_ORDERS, FinetuneSettings
from bertjax.finetune.task import Examples, TaskData
from bertjax.nn import heads, sharding
from bertjax.storage import fs
from bertjax.text import features as features_lib
from bertjax.text.tokenizer import Tokenizer


class HeadMismatchError(ConfigError):
    """A run's task or labels differ from the head of the checkpoint it would resume."""


# ----------------------------------------------------------------------------- the model to tune


def open_source(path: str | os.PathLike, step: int | None = None) -> rundir.Run:
    """Opens what init_from is (at a checkpoint `step` of a work directory, if given): its
    architecture, tokenizer and head (parameters come later)."""
    try:
        # A fine-tuning run never uses MLM/NSP heads: a BertModel directory lacks nothing.
        return rundir.open_run(path, step, pretraining_heads=False)
    except (ValueError, FileNotFoundError, checkpoint_lib.CheckpointRestoreError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"config.init_from={str(path)!r}: {err}") from None


def initial_params(source: rundir.Run, ft: Finetuning, fresh: Any) -> tuple[Any, str, bool]:
    """The run's first parameters from init_from, placed on the mesh, as the head's capability
    takes them (the encoder, and the head if the source has this run's); a line saying what
    was taken; whether the head starts fresh."""
    _, params = rundir.read_params(source, ft.mesh)
    params, note, fresh_head = capability.of(ft.head).warm_start(
        ft.model_config, ft.head, source, params, fresh
    )
    return jax.device_put(params, ft.state.shardings.params), note, fresh_head


def first_state(
    source: rundir.Run, ft: Finetuning, rng: jax.Array
) -> tuple[steps.TrainState, str, bool]:
    """A new run's first train state: `initial_params` over `ft.state.init(rng)`, the same
    arrays, with the parameters' line and whether the head starts fresh. Where the head's
    capability takes the source's subtrees as they are (Capability.warm_start), one program
    computes only what the source does not give (a fresh head, the optimizer state): a
    random encoder is neither compiled nor computed only to be overwritten."""
    head = capability.of(ft.head)
    if type(head).warm_start is not capability.Capability.warm_start:
        # A warm start of its own (seq2seq's rearranges weights on the host) takes the
        # whole fresh initialisation.
        state = ft.state.init(rng)
        params, note, fresh_head = initial_params(source, ft, state.params)
        return state.replace(params=params), note, fresh_head
    _, given = rundir.read_params(source, ft.mesh)

    def take(given, fresh):
        return head.warm_start(ft.model_config, ft.head, source, given, fresh)[0]

    # The line and whether the head starts fresh depend on the trees' structure only.
    _, note, fresh_head = head.warm_start(
        ft.model_config, ft.head, source, given, ft.state.abstract.params
    )
    return ft.state.init_taking(rng, given, take), note, fresh_head


# ----------------------------------------------------------------------------- batches


def _rows(features: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {name: array[rows] for name, array in features.items()}


def train_batch(
    examples: Examples,
    order: np.ndarray,
    index: int,
    batch_size: int,
    length_bucket: int = 0,
    widths: tuple[int, ...] | None = None,
) -> dict[str, np.ndarray]:
    """This process's rows of the index-th global batch of an epoch's order.

    With `length_bucket` the positions are cut to the smallest multiple of it that holds the
    global batch's longest example, or with `widths` (the run's, `training_widths`) to the
    smallest of them that does. Every process reads the whole split, so all of them choose
    the same width. Cutting only padding changes no output at a real position.
    """
    rows = order[index * batch_size : (index + 1) * batch_size]
    return _local_batch(examples, rows, length_bucket, widths)


def train_micro_batches(
    examples: Examples,
    order: np.ndarray,
    index: int,
    batch_size: int,
    micro_batches: int,
    length_bucket: int,
    widths: tuple[int, ...] | None = None,
) -> list[dict[str, np.ndarray]]:
    """This process's rows of the index-th global batch, as micro-batches grouped by length.

    The batch's examples are sorted by length and cut into `micro_batches` runs of equal
    size, each cut to its own length bucket (or the smallest of `widths` that holds it, as
    `train_batch`): the shortest examples share a micro-batch, so
    no micro-batch pays attention and feed-forward for another's longest example. The
    micro-batches' gradients add up to the batch's (steps.MicroBatchSteps). The sort is
    stable, so every process groups the same rows.
    """
    rows = order[index * batch_size : (index + 1) * batch_size]
    lengths = examples.features["input_mask"][rows].sum(axis=1)
    rows = rows[np.argsort(lengths, kind="stable")]
    size = batch_size // micro_batches
    return [
        _local_batch(examples, rows[k * size : (k + 1) * size], length_bucket, widths)
        for k in range(micro_batches)
    ]


def _local_batch(
    examples: Examples, rows: np.ndarray, length_bucket: int, widths: tuple[int, ...] | None
) -> dict[str, np.ndarray]:
    """This process's part of the global batch of `rows`, cut to the positions they need."""
    width = batch_width(examples, rows, length_bucket, widths)
    local = len(rows) // jax.process_count()
    rows = rows[jax.process_index() * local : (jax.process_index() + 1) * local]
    batch = _rows(examples.features, rows)
    for name in _per_position(examples):
        batch[name] = batch[name][:, :width]
    batch["weights"] = np.ones(len(rows), np.float32)
    return batch


def _per_position(examples: Examples) -> list[str]:
    """The features with one value per position: cut with the batch's width."""
    names = ["input_ids", "input_mask", "segment_ids"]
    if examples.word_positions is not None:  # token tasks label each position
        names.append("labels")
    return names


def batch_width(
    examples: Examples, rows: np.ndarray, length_bucket: int, widths: tuple[int, ...] | None = None
) -> int:
    """Positions a batch of `rows` needs: its longest example rounded up to `length_bucket`
    (all of max_seq_length without one), or to the smallest of `widths` that holds it."""
    mask = examples.features["input_mask"]
    seq = mask.shape[1]
    if length_bucket == 0 and widths is None:
        return seq
    longest = int(mask[rows].sum(axis=1).max())
    if widths is not None:
        return _fitting(widths, longest, seq)
    return min(seq, -(-longest // length_bucket) * length_bucket)


def _fitting(widths: tuple[int, ...], longest: int, seq: int) -> int:
    """The smallest of `widths` that holds `longest` positions (all `seq` if none does)."""
    at = bisect.bisect_left(widths, longest)
    return min(seq, widths[at]) if at < len(widths) else seq


# A run cuts its batches to a few widths that cost at most this share more positions than
# cutting each batch to its own length bucket (the smallest multiple that holds it) would:
# one width is one compiled program (features.fewest_widths). benchmarks/shapes.py, SQuAD
# windows at 384 in 8 micro-batches of 4: training 10 widths -> 8 for +1 % of positions
# (28 programs before, when each micro-batch's index was compiled in too), evaluation 41
# programs -> 11 for +5 %. Training's steps are most of a run's time, so its share is smaller.
TRAIN_WIDTH_OVERHEAD = 0.02
EVAL_WIDTH_OVERHEAD = 0.05
# What compiling one evaluation program costs, in positions evaluated. On a 2-core CPU, a
# ModernBERT L6/H256 classifier (benchmarks/modernbert_finetune.py): each evaluation program
# about 2.5 s to trace and compile (14 widths -> 2 took 24.6 s off compiling), its forward
# pass about 9,000 real positions a second. Accelerators compile slower and evaluate faster,
# so there a program is worth more positions still: this is a lower bound everywhere.
EVAL_PROGRAM_POSITIONS = 20_000
# The same for one training program, in positions trained (forward and backward). On the
# same host the review command of benchmarks/modernbert_finetune.py (ModernBERT L6/H256)
# compiled its 27 programs in about 60 s, the training ones the largest, and trained about
# 6,000 positions a second: 10,000 positions are under 2 s of training there, a lower bound
# as above. It cut that command's training widths from 7 to 5, and SQuAD's (benchmarks/qa.py,
# MiniLM) from 7 to 5 (docs/compiling.md). A second run loads each program from the
# compilation cache, which still costs its tracing, so it gains less or loses a little.
TRAIN_PROGRAM_POSITIONS = 10_000


def training_widths(
    examples: Examples,
    seeds: tuple[int, ...],
    num_epochs: int,
    batch_size: int,
    micro_batches: int,
    length_bucket: int,
    overhead: float = TRAIN_WIDTH_OVERHEAD,
    batch_order: str = "shuffled",
    program_positions: float = TRAIN_PROGRAM_POSITIONS,
) -> tuple[int, ...] | None:
    """The widths, multiples of `length_bucket`, that the run's training batches are cut to
    (None: every batch at max_seq_length, without a length bucket).

    The run's batches are known before it starts (each epoch's order comes from the seed and
    `batch_order`), so the width each batch needs is too: with `micro_batches` > 1 each
    micro-batch's as `train_micro_batches` groups them, else each batch's. Of those, the
    fewest widths within `overhead` more positions, a width added only while it saves more
    than `program_positions` (features.fewest_widths).
    """
    if length_bucket == 0:
        return None
    mask = examples.features["input_mask"]
    lengths = mask.sum(axis=1)
    steps_per_epoch = len(examples) // batch_size
    longest = []
    for seed in seeds:
        for epoch in range(num_epochs):
            order = training_order(examples, seed, epoch, batch_size, batch_order)
            order = order[: steps_per_epoch * batch_size]
            per_batch = np.sort(lengths[order].reshape(steps_per_epoch, batch_size), axis=1)
            # [step, micro-batch, row]: sorted, so each micro-batch's longest is its last.
            grouped = per_batch.reshape(steps_per_epoch, micro_batches, -1)
            longest.append(grouped[:, :, -1].reshape(-1))
    longest = np.concatenate(longest)
    rows = np.full(len(longest), batch_size // micro_batches)  # rows cut to each width
    return features_lib.fewest_widths(
        longest, length_bucket, mask.shape[1], overhead, rows, program_positions
    )


def evaluation_widths(
    splits: list[Examples],
    length_bucket: int,
    overhead: float = EVAL_WIDTH_OVERHEAD,
    passes: list[int] | None = None,
    program_positions: float = 0.0,
) -> tuple[int, ...] | None:
    """The widths, multiples of `eval_length_bucket(length_bucket)`, that evaluation and
    prediction cut every split's batches to: chosen from all their examples at once, so
    that every split runs the same few programs (None without a length bucket).

    `passes`: how often the run evaluates each split (default once); `program_positions`:
    what one more program costs, in positions (features.fewest_widths), so that a small
    development set evaluated a few times runs few programs.
    """
    if length_bucket == 0 or not splits:
        return None
    lengths = np.concatenate([s.features["input_mask"].sum(axis=1) for s in splits])
    counts = np.concatenate(
        [np.full(len(s), n) for s, n in zip(splits, passes or [1] * len(splits), strict=True)]
    )
    seq = max(s.features["input_mask"].shape[1] for s in splits)
    return features_lib.fewest_widths(
        lengths, eval_length_bucket(length_bucket), seq, overhead, counts, program_positions
    )


def fitting_capacity(
    examples: Examples,
    seeds: tuple[int, ...],
    num_epochs: int,
    batch_size: int,
    grad_accum_steps: int,
    shards: int,
    batch_order: str = "shuffled",
) -> float:
    """The token_capacity at which every micro-batch shard of the run fits its packed slots.

    The run's batches are known before it starts (each epoch's order comes from the seed and
    `batch_order`), so the fullest shard of any of them sets the capacity. Shards are laid out
    as the train step sees them: contiguous rows per batch shard, micro-batch k taking every
    grad_accum_steps-th row from k (steps.split_micro_batches).
    """
    mask = examples.features["input_mask"]
    lengths = mask.sum(axis=1)
    steps_per_epoch = len(examples) // batch_size
    rows_per_shard = batch_size // grad_accum_steps // shards
    fullest = 0
    for seed in seeds:
        for epoch in range(num_epochs):
            order = training_order(examples, seed, epoch, batch_size, batch_order)
            order = order[: steps_per_epoch * batch_size]
            # [step, shard, row within the micro-batch's shard, micro-batch]
            per_row = lengths[order].reshape(
                steps_per_epoch, shards, rows_per_shard, grad_accum_steps
            )
            fullest = max(fullest, int(per_row.sum(axis=2).max()))
    return fullest / (rows_per_shard * mask.shape[1])


# By length, each window of this many batches of the epoch's random order is sorted by length
# before it is cut into batches (Hugging Face's group_by_length sampler takes 50): batches
# still hold a random selection of the data, only of similar lengths.
LENGTH_WINDOW_BATCHES = 50


def epoch_order(
    seed: int,
    epoch: int,
    count: int,
    lengths: np.ndarray | None = None,
    batch_size: int = 0,
) -> np.ndarray:
    """The training examples' order in an epoch: a permutation drawn from (seed, epoch).

    With `lengths` (each example's, config.batch_order="by_length"), consecutive batches of
    `batch_size` hold examples of similar length: the permutation's whole batches are cut
    into windows of LENGTH_WINDOW_BATCHES batches, each window is sorted by length and cut
    into batches, and the batches' order is shuffled (from the same seed), so that a run does
    not go from its long batches to its short ones. The examples past the last whole batch
    are dropped, as a shuffled epoch drops them; equal lengths keep their random order.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(count)
    if lengths is None:
        return order
    if len(lengths) != count or batch_size < 1:
        raise ValueError(f"{len(lengths)} lengths for {count} examples, batch size {batch_size}")
    order = order[: count // batch_size * batch_size]
    window = LENGTH_WINDOW_BATCHES * batch_size
    for start in range(0, len(order), window):
        part = order[start : start + window]
        order[start : start + window] = part[np.argsort(-lengths[part], kind="stable")]
    batches = order.reshape(-1, batch_size)  # [batch, row]
    return batches[rng.permutation(len(batches))].reshape(-1)


def training_order(
    examples: Examples, seed: int, epoch: int, batch_size: int, batch_order: str
) -> np.ndarray:
    """`examples`' order in an epoch of the run (epoch_order), as config.batch_order says."""
    if batch_order not in BATCH_ORDERS:
        raise ValueError(f"batch_order {batch_order!r}: must be one of {BATCH_ORDERS}")
    lengths = None
    if batch_order == "by_length":
        lengths = examples.features["input_mask"].sum(axis=1)  # [example]
    return epoch_order(seed, epoch, len(examples), lengths, batch_size)


def eval_batches(
    examples: Examples,
    batch_size: int,
    length_bucket: int | None = None,
    rows_multiple: int = 1,
    platform: str | None = None,
    widths: tuple[int, ...] | None = None,
) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """(the examples a batch holds, this process's part of it) for every batch.

    Without `length_bucket` the batches hold the examples in order, at every position. With
    one they hold the examples sorted by length, each batch cut to the smallest multiple of
    `length_bucket` positions that holds its longest (0: all positions), so short examples
    do not pay for the longest; with `widths` too (`evaluation_widths`), each batch is cut to
    the narrowest of them that holds its rows, so a split runs one program per width. On a
    CPU a batch of long examples holds fewer rows (perf.rows_per_call; `rows_multiple`: the
    mesh's data-parallel size), a call that stays in the cache. The last batch is filled
    with copies of its first example, weighted 0 (all-padding rows would make attention
    divide by nothing).
    """
    count = len(examples)
    order = np.arange(count)
    if length_bucket is not None:
        order = np.argsort(examples.features["input_mask"].sum(axis=1), kind="stable")
    if length_bucket is not None and widths is not None:
        yield from _batches_of_widths(examples, order, batch_size, rows_multiple, platform, widths)
        return
    start = 0
    while start < count:
        width = batch_width(examples, order[start : start + batch_size], length_bucket or 0)
        size = perf.rows_per_call(width, batch_size, rows_multiple, platform)
        real = order[start : start + size]
        start += size
        width = batch_width(examples, real, length_bucket or 0)
        yield real, _eval_batch(examples, real, size, width if length_bucket is not None else None)


def _batches_of_widths(
    examples: Examples,
    order: np.ndarray,
    batch_size: int,
    rows_multiple: int,
    platform: str | None,
    widths: tuple[int, ...],
) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """eval_batches with `widths`: the examples in `order` (by length), each batch at the
    narrowest of `widths` whose rows per call (fewer for wider) all fit in it, so that every
    batch's shape is one of len(widths) and only the last batch is part filler."""
    seq = examples.features["input_mask"].shape[1]
    lengths = examples.features["input_mask"].sum(axis=1)
    start = 0
    while start < len(order):
        first = _fitting(widths, int(lengths[order[start]]), seq)
        for width in (w for w in (*widths, seq) if w >= first):
            size = perf.rows_per_call(width, batch_size, rows_multiple, platform)
            real = order[start : start + size]
            if lengths[real].max() <= width:  # sorted: the batch's last is its longest
                break
        start += size
        yield real, _eval_batch(examples, real, size, width)


def _eval_batch(
    examples: Examples, real: np.ndarray, size: int, width: int | None
) -> dict[str, np.ndarray]:
    """This process's part of a batch of `size` rows holding `real` (then copies of its first,
    weighted 0), cut to `width` positions (None: all)."""
    rows = np.concatenate([real, np.full(size - len(real), real[0])])
    batch = _rows(examples.features, rows)
    if width is not None:
        for name in _per_position(examples):
            batch[name] = batch[name][:, :width]
    weights = np.zeros(size, np.float32)
    weights[: len(real)] = 1.0
    batch["weights"] = weights
    local = size // jax.process_count()
    mine = slice(jax.process_index() * local, (jax.process_index() + 1) * local)
    return {name: array[mine] for name, array in batch.items()}


def _to_host(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def eval_length_bucket(length_bucket: int) -> int:
    """The multiple evaluation cuts its widths to, given training's `length_bucket` (0: all
    positions).

    Evaluation compiles forward passes only, cheap beside training's steps, so its widths are
    four times finer: pairs of about 18 tokens run 24 wide rather than 32 (STS-B's dev pairs on
    a MiniLM: evaluation 534 ms -> 363 ms).
    """
    return max(1, length_bucket // 4) if length_bucket else 0


def run_eval(
    ft: Finetuning,
    params,
    examples: Examples,
    batch_size: int,
    length_bucket: int = 32,
    widths: tuple[int, ...] | None = None,
) -> tuple[heads.HeadSums, dict[str, np.ndarray]]:
    """Summed loss statistics and the outputs (the objective's) of every example, in order.

    Where the task's objective allows it (`position_outputs`), batches are grouped by length
    and cut to multiples of a quarter of `length_bucket` positions (training's widths), or to
    `widths` (the run's `evaluation_widths`); per-position outputs come back at full length,
    the cut positions holding the lowest value of their type (no decoder picks them).
    """
    position_outputs = ft.objective.position_outputs
    seq = examples.features["input_mask"].shape[1]
    totals, outputs = None, {}
    for real, local in _run_eval_batches(ft, examples, batch_size, length_bucket, widths):
        batch = steps.global_batch(local, ft.batch_sharding, jax.process_count())
        sums, batch_outputs = ft.eval_step(params, batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        for name, value in batch_outputs.items():
            value = _to_host(value)[: len(real)]
            if name not in outputs:
                shape = value.shape[1:]
                if name in (position_outputs or ()):
                    shape = (seq,) + shape[1:]
                outputs[name] = np.full((len(examples),) + shape, _lowest(value.dtype), value.dtype)
            if value.ndim == 1:
                outputs[name][real] = value
            else:
                outputs[name][real, : value.shape[1]] = value
    return jax.device_get(totals), outputs


def _run_eval_batches(
    ft: Finetuning,
    examples: Examples,
    batch_size: int,
    length_bucket: int,
    widths: tuple[int, ...] | None,
) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """The batches run_eval takes (eval_batches with the objective's and mesh's settings)."""
    position_outputs = ft.objective.position_outputs
    bucket = None if position_outputs is None else eval_length_bucket(length_bucket)
    multiple = sharding.data_parallel_size(ft.mesh)
    platform = ft.mesh.devices.flat[0].platform
    return eval_batches(examples, batch_size, bucket, multiple, platform, widths)


def _lowest(dtype: np.dtype):
    """The lowest value of a dtype: what positions cut from an evaluation batch hold."""
    return np.finfo(dtype).min if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


# ----------------------------------------------------------------------------- one seed


def _prefix(split_name: str) -> str:
    """Metric namespace of a validation split: eval/, or eval_matched/ for MNLI's."""
    return "eval" + split_name[len("validation") :]


def _better(metric: str, value: float, best: dict | None) -> bool:
    if best is None:
        return True
    if metric in metrics_lib.LOWER_IS_BETTER:
        return value < best["value"]
    return value > best["value"]


def validation_scores(
    ft: Finetuning,
    params,
    task: TaskData,
    batch_size: int,
    length_bucket: int = 32,
    widths: tuple[int, ...] | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, np.ndarray]]]:
    """Loss and the task's metrics on every validation split, namespaced by split, and each
    split's outputs (run_eval's) by its name (`widths`: as run_eval's)."""
    scorer = task_lib.get(ft.head.task)
    scores: dict[str, float] = {}
    outputs_by_split = {}
    for examples in task.validation:
        sums, outputs = run_eval(ft, params, examples, batch_size, length_bucket, widths)
        prefix = _prefix(examples.name)
        scores.update({k: float(v) for k, v in ft.objective.metrics(sums, prefix).items()})
        for name, value in scorer.scores(ft.head, examples, outputs).items():
            scores[f"{prefix}/{name}"] = value
        outputs_by_split[examples.name] = outputs
    return scores, outputs_by_split


@dataclasses.dataclass(frozen=True)
class _Run:
    """What every seed shares: settings, the built steps, the data, the source model."""

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


def _meta(run: _Run, seed: int, best: dict | None) -> dict:
    return {
        "head": run.ft.head.to_dict(),
        "model_config": encoders.config_to_dict(run.ft.model_config),
        "tokenizer_fingerprint": run.tokenizer.fingerprint,
        "config": run.settings.config,
        "seed": seed,
        "train_examples": len(run.task.train),
        "steps_per_epoch": run.steps_per_epoch,
        "batch_order": run.settings.run.batch_order,
        "max_seq_length": run.settings.data.max_seq_length,
        "best": best,
    }


def _check_resumable(meta: dict, run: _Run, directory) -> None:
    """Fails, saying how, unless an existing checkpoint belongs to this run's task and data."""
    if "head" not in meta:
        raise HeadMismatchError(
            f"the checkpoints in {directory} are not a fine-tuning run's (a pretraining run's?); "
            "give fine-tuning its own --workdir (and the pretraining run as config.init_from)"
        )
    head = HeadSpec.from_dict(meta["head"])
    if head != run.ft.head and (head.task, head.labels) == (run.ft.head.task, run.ft.head.labels):
        saved, asked = _option_differences(head, run.ft.head)
        article = "an" if head.task[0] in "aeiou" else "a"
        raise HeadMismatchError(
            f"the checkpoint in {directory} is {article} {head.task} head with {saved}, but this "
            f"run asks {asked}; use another --workdir, or the settings it was trained with"
        )
    if head != run.ft.head:
        raise HeadMismatchError(
            f"the checkpoint in {directory} is a {head.describe()} head, but this run's task "
            f"is {run.ft.head.describe()}; use another --workdir, or the task and data it was "
            "trained on"
        )
    # The architecture too: a checkpoint that cannot be read onto this model would otherwise
    # be taken for a damaged one.
    rundir.check_compatible(
        meta, run.tokenizer, run.ft.model_config, f"the checkpoint in {directory}"
    )
    saved = {"batch_order": "shuffled", **meta}  # checkpoints from before batch_order
    for key, value in (
        ("train_examples", len(run.task.train)),
        ("steps_per_epoch", run.steps_per_epoch),
        # Another order would take other batches than the interrupted run's.
        ("batch_order", run.settings.run.batch_order),
    ):
        if saved.get(key) != value:
            raise ConfigError(
                f"the checkpoint in {directory} has {key}={saved.get(key)!r}, this run "
                f"{value!r}: it was trained on other data or settings; use another --workdir"
            )


def _option_differences(saved: HeadSpec, asked: HeadSpec) -> tuple[str, str]:
    """The options two heads of one task set differently, as ("pooling='mean'",
    "pooling='cls'"): each option by its own name (a nested one by its last name)."""

    def flat(options: Any, prefix: str = "") -> dict[str, Any]:
        out = {}
        for name, value in (options or {}).items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{name}."))
            else:
                out[f"{prefix}{name}"] = value
        return out

    old = flat(saved.to_dict().get("options"))
    new = flat(asked.to_dict().get("options"))
    names = [n for n in sorted(set(old) | set(new)) if old.get(n) != new.get(n)]

    def shown(values: dict[str, Any]) -> str:
        return ", ".join(f"{n.rsplit('.', 1)[-1]}={values.get(n)!r}" for n in names)

    return shown(old), shown(new)


@dataclasses.dataclass
class _SeedHooks:
    """What the shared loop asks of one seed of a fine-tuning run (loop.LoopHooks)."""

    run: _Run
    seed: int
    best_checkpointer: checkpoint_lib.Checkpointer
    checkpoint_dir: fs.AnyPath
    best: dict | None = None
    # The best evaluation's outputs by validation split, kept where the task writes the
    # validation split's predictions (None before it, or when resumed after it).
    best_validation_outputs: dict[str, dict[str, np.ndarray]] | None = None
    # (epoch, its training order): drawn once per epoch, not at every step (by length, the
    # order sorts the whole training set).
    current_order: tuple[int, np.ndarray] | None = None

    def dropout_rng(self) -> jax.Array:
        return jax.random.fold_in(jax.random.key(self.seed), 1)

    def fresh(self) -> tuple[steps.TrainState, jax.Array]:
        state, note, fresh_head = first_state(
            self.run.source, self.run.ft, jax.random.key(self.seed)
        )
        params = state.params
        if fresh_head:
            task = task_lib.get(self.run.settings.task)
            params, head_note = task.start_head(params, self.run.task, self.run.settings.run)
            note += f"; {head_note}" if head_note else ""
        print(note)
        return state.replace(params=params), self.dropout_rng()

    def resumed(self, restored: checkpoint_lib.Restored) -> jax.Array:
        self.best = restored.meta["best"]
        print(f"Resumed seed {self.seed} from {self.checkpoint_dir} at step {restored.step}")
        return self.dropout_rng()

    def batch(self, step: int) -> dict[str, np.ndarray]:
        run = self.run
        epoch, index = divmod(step, run.steps_per_epoch)
        settings = run.settings.run
        if self.current_order is None or self.current_order[0] != epoch:
            order = training_order(
                run.task.train, self.seed, epoch, settings.batch_size, settings.batch_order
            )
            self.current_order = (epoch, order)
        order = self.current_order[1]
        if settings.micro_batches_by_length:
            return train_micro_batches(
                run.task.train,
                order,
                index,
                settings.batch_size,
                settings.grad_accum_steps,
                settings.length_bucket,
                run.train_widths,
            )
        return train_batch(
            run.task.train,
            order,
            index,
            settings.batch_size,
            settings.length_bucket,
            run.train_widths,
        )

    def eval_metrics(self, state: steps.TrainState, step: int) -> dict[str, float]:
        run, metric = self.run, self.run.settings.run.metric
        scores, outputs = validation_scores(
            run.ft,
            state.params,
            run.task,
            run.settings.run.eval_batch_size,
            run.settings.run.length_bucket,
            run.eval_widths,
        )
        scores["epoch"] = step // run.steps_per_epoch
        main = f"{_prefix(run.task.validation[0].name)}/{metric}"
        line = ", ".join(f"{k} {v:.4f}" for k, v in scores.items() if k.startswith("eval"))
        tqdm.tqdm.write(f"seed {self.seed} epoch {scores['epoch']}: {line}")
        if _better(metric, scores[main], self.best):
            self.best = {
                "metric": main,
                "value": scores[main],
                "step": step,
                "epoch": scores["epoch"],
                "scores": scores,
            }
            if task_lib.get(run.settings.task).predicts_validation:
                # The best parameters' validation predictions, written when the run ends
                # without evaluating the split again.
                self.best_validation_outputs = outputs
            self.best_checkpointer.save(
                step,
                params=state.params,
                # Parameters only: the optimizer item holds just the step.
                opt_state={"step": state.step},
                meta=self.meta(step),
                force=True,
            )
        return scores

    def meta(self, step: int) -> dict:
        return _meta(self.run, self.seed, self.best)


def _run_seed(run: _Run, seed: int, workdir: fs.AnyPath) -> dict[str, Any]:
    settings = run.settings
    is_main = jax.process_index() == 0
    # Checked before anything is written there: a directory of another run keeps its files.
    existing = workdir / rundir.CHECKPOINT_DIR
    if existing.is_dir():
        try:
            meta = checkpoint_lib.read_meta(existing)
        except FileNotFoundError:  # no finished step yet: nothing to resume or to protect
            meta = None
        if meta is not None:
            _check_resumable(meta, run, existing)
    fs.makedirs(workdir)
    if is_main:
        run.tokenizer.save(workdir / rundir.tokenizer_file(run.tokenizer))
    checkpointer = checkpoint_lib.Checkpointer(
        workdir / rundir.CHECKPOINT_DIR,
        max_to_keep=1,
        save_interval_steps=settings.run.checkpoint_every_steps,
    )
    best_checkpointer = checkpoint_lib.Checkpointer(
        workdir / rundir.BEST_CHECKPOINT_DIR, max_to_keep=1, save_interval_steps=1
    )
    writer = metrics_writer.MetricWriter(
        workdir / rundir.METRICS_FILE, workdir / rundir.TENSORBOARD_DIR, enabled=is_main
    )
    plan = loop_lib.Plan(
        run.ft.steps,
        checkpointer,
        writer,
        loop_lib.Cadence(
            total_steps=run.total_steps,
            period=run.steps_per_epoch,
            log_every=settings.run.log_every_steps,
            eval_every=run.steps_per_epoch,
            checkpoint_every=settings.run.checkpoint_every_steps,
        ),
        is_main,
    )
    hooks = _SeedHooks(run, seed, best_checkpointer, checkpointer.directory)
    try:
        outcome = loop_lib.train(plan, hooks)
    finally:
        best_checkpointer.close()

    result = {
        "seed": seed,
        "workdir": str(workdir),
        "steps": outcome.step,
        "preempted": outcome.preempted,
        "best": hooks.best,
    }
    if outcome.preempted:
        return result
    result["predictions"] = _predict_tests(run, workdir, hooks.best_validation_outputs)
    if is_main:
        rundir.write_text(workdir / rundir.RESULT_FILE, json.dumps(result, indent=2) + "\n")
    return result


def _predict_tests(
    run: _Run,
    workdir: fs.AnyPath,
    validation_outputs: dict[str, dict[str, np.ndarray]] | None = None,
) -> list[str]:
    """Writes each test split's predictions by the best parameters; their paths.

    A task with `predicts_validation` (question answering's official files) writes the
    validation splits' too, from `validation_outputs` (the best evaluation's, by split) where
    this process kept them; a task's write_predictions may return where it wrote.
    """
    kind = task_lib.get(run.ft.head.task)
    kept = validation_outputs or {}
    # (split, its outputs where already computed)
    splits = [(examples, None) for examples in run.task.test]
    if kind.predicts_validation:
        splits = [(e, kept.get(e.name)) for e in run.task.validation] + splits
    if not splits:
        return []
    with jax.set_mesh(run.ft.mesh):
        params = None
        written = []
        for examples, outputs in splits:
            if outputs is None:
                if params is None:
                    _, params, _ = checkpoint_lib.restore_params(
                        workdir / rundir.BEST_CHECKPOINT_DIR,
                        abstract_params=run.ft.state.abstract.params,
                    )
                _, outputs = run_eval(
                    run.ft,
                    params,
                    examples,
                    run.settings.run.eval_batch_size,
                    run.settings.run.length_bucket,
                    run.eval_widths,
                )
            path = workdir / rundir.PREDICTIONS_FILE.format(examples.name)
            if jax.process_index() == 0:
                path = kind.write_predictions(path, run.ft.head, examples, outputs) or path
            written.append(str(path))
    return written


# ----------------------------------------------------------------------------- the command


def finetune(
    settings: FinetuneSettings, workdir: str | os.PathLike, devices=None
) -> dict[str, Any]:
    """Fine-tunes (or resumes) for every seed of the settings in workdir; returns the summary.

    `workdir` is a local directory or `gs://bucket/path`. `devices`: the devices of the mesh
    (default: all of them).
    """
    start = time.time()
    workdir = fs.makedirs(workdir)
    # On GCS making a directory writes nothing: ask the store now, so that a missing bucket,
    # missing credentials or a refused permission end here, in one line naming the path.
    fs.kind(workdir)
    lock = rundir.WorkdirLock(workdir)
    if jax.process_index() == 0:
        lock.acquire()
    try:
        with perf.CompileTime() as compiling:
            run = prepare(settings, devices)
            compiler = None
            if settings.run.compile_ahead:
                compiler = compile_ahead.Compiler(settings.run.compile_ahead, run.ft.mesh)
            seeds = settings.run.seeds
            results = []
            failing = True
            try:
                if compiler is not None:
                    run = compiled_ahead(run, compiler)
                for seed in seeds:
                    seed_dir = (
                        workdir if len(seeds) == 1 else workdir / rundir.SEED_DIR.format(seed)
                    )
                    results.append(_run_seed(run, seed, seed_dir))
                    if results[-1]["preempted"]:
                        break
                failing = False
            finally:
                if compiler is not None:
                    # Programs never called are dropped; a failure no step raised is raised.
                    compiler.close(failing=failing)
    finally:
        lock.release()
    summary = _seed_summary(settings, results, workdir, time.time() - start)
    summary["compile_sec"] = compiling.seconds
    summary["programs_compiled"] = compiling.programs
    summary["programs_loaded"] = compiling.loaded
    if jax.process_index() == 0:
        _print_summary(summary)
    return summary


def prepare(settings: FinetuneSettings, devices=None) -> _Run:
    """Reads init_from and the task's data, and builds the run's steps (shared by seeds)."""
    source = open_source(settings.init_from, settings.init_step)
    model_config = settings.model_config(source.config)
    kind = task_lib.get(settings.task)
    task = kind.read(settings.data, source.tokenizer)
    for note in task.notes:
        print(note)
    kind.check(task, settings.run.metric)
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
    )
    check_mesh_fits(model_config, ft.mesh)
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
    return _Run(
        settings,
        ft,
        task,
        source,
        source.tokenizer,
        steps_per_epoch,
        train_widths,
        eval_widths,
    )


# ----------------------------------------------------------------------------- compiled ahead


def compiled_ahead(run: _Run, compiler: compile_ahead.Compiler) -> _Run:
    """`run` with its steps' programs compiled ahead by `compiler` (bertjax.engine.compile_ahead):
    every training shape, in the order the run first meets it, then every evaluation and
    prediction shape (the batches run_eval will take). A step then runs the program compiled
    for its shape: the same jitted function's, so the run's results do not change."""
    ft, settings = run.ft, run.settings.run
    built = ft.steps
    abstract = built.state.abstract
    rng = jax.eval_shape(lambda: jax.random.key(0))  # the dropout key's shape and dtype
    train = run.task.train
    order = training_order(train, settings.seeds[0], 0, settings.batch_size, settings.batch_order)
    per_position = _per_position(train)

    def shapes(local: dict[str, np.ndarray], width: int | None = None) -> dict:
        """The global batch of this process's `local` rows, at `width` positions."""
        out = {}
        for name, array in local.items():
            shape = (array.shape[0] * jax.process_count(),) + array.shape[1:]  # [rows, ...]
            if width is not None and name in per_position:
                shape = (shape[0], width) + shape[2:]  # [rows, width, ...]
            out[name] = jax.ShapeDtypeStruct(shape, array.dtype, sharding=built.batch_sharding)
        return out

    widths = _training_widths_in_use_order(run)
    train_step, micro_step = built.train_step, built.micro_batch_step
    if settings.micro_batches_by_length:
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
            micro = shapes(first, width)
            micro_step.denominators.prepare(micro)
            denominators = jax.eval_shape(micro_step.denominators.function, micro)
            # The micro-batch's index is a traced Python int: one program for every index.
            micro_step.accumulate.prepare(
                abstract.params, grads, sums, micro, denominators, rng, abstract.step, 0
            )
            if k == 0:
                micro_step.apply.prepare(abstract, grads, sums, denominators)
    else:
        first = train_batch(
            train, order, 0, settings.batch_size, settings.length_bucket, run.train_widths
        )
        train_step = compiler.ahead(train_step)
        for width in widths:
            train_step.prepare(abstract, shapes(first, width), rng)
    eval_step = compiler.ahead(built.eval_step)
    for examples in [*run.task.validation, *run.task.test]:
        batches = _run_eval_batches(
            ft, examples, settings.eval_batch_size, settings.length_bucket, run.eval_widths
        )
        for _, local in batches:
            eval_step.prepare(abstract.params, shapes(local))
    ahead = dataclasses.replace(
        built, train_step=train_step, eval_step=eval_step, micro_batch_step=micro_step
    )
    return dataclasses.replace(run, ft=dataclasses.replace(ft, steps=ahead))


def _training_widths_in_use_order(run: _Run) -> list[int | None]:
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
                    width = _fitting(run.train_widths, int(n), seq)
                    if width not in met:
                        met.append(width)
                if len(met) == len(run.train_widths):
                    return met
    return met + [w for w in run.train_widths if w not in met]


def _seed_summary(settings, results: list[dict], workdir: fs.AnyPath, seconds: float) -> dict:
    values = [r["best"]["value"] for r in results if r.get("best")]
    summary = {
        "workdir": str(workdir),
        "metric": settings.run.metric,
        "seeds": results,
        "wall_time_sec": seconds,
        "preempted": any(r["preempted"] for r in results),
        # The notebook call that fits this run's kind of model.
        "usage": capability.get(settings.task).usage,
    }
    if len(settings.run.seeds) > 1 and len(values) == len(settings.run.seeds):
        summary["median"] = statistics.median(values)
        if jax.process_index() == 0:
            record = {
                "metric": settings.run.metric,
                "median": summary["median"],
                "seeds": {str(r["seed"]): r["best"]["value"] for r in results},
            }
            rundir.write_text(workdir / rundir.SEEDS_FILE, json.dumps(record, indent=2) + "\n")
    return summary


def _print_summary(summary: dict) -> None:
    lines = [
        "",
        "Fine-tuning stopped for preemption" if summary["preempted"] else "Fine-tuning finished",
    ]
    for r in summary["seeds"]:
        best = r.get("best")
        shown = f"{best['metric']} {best['value']:.4f} (epoch {best['epoch']})" if best else "-"
        lines.append(f"  seed {r['seed']}: best {shown}  in {r['workdir']}")
        for path in r.get("predictions", []):
            lines.append(f"    predictions: {path}")
    if "median" in summary:
        lines.append(f"  median over {len(summary['seeds'])} seeds: {summary['median']:.4f}")
    wall = summary["wall_time_sec"]
    compiling = summary.get("compile_sec", 0.0)
    lines.append(
        f"  wall time: {wall:.1f} s, of which compiling {compiling:.1f} s "
        f"({100 * compiling / max(wall, 1e-9):.0f} %, {summary.get('programs_compiled', 0)} "
        f"programs compiled, {summary.get('programs_loaded', 0)} loaded from the compilation "
        "cache)"
    )
    first = summary["seeds"][0]["workdir"]
    lines.append(f"  use it:    bertjax.Model.load({first!r}).{summary['usage']}")
    print("\n".join(lines), flush=True)
