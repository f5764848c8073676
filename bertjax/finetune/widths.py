"""What a fine-tuning run's batches need, known before it starts (each epoch's order comes
from the seed): the few widths its training and evaluation batches are cut to (one compiled
program each), and the token capacity at which every batch shard fits its packed slots."""

from __future__ import annotations

import numpy as np

from bertjax.finetune.batches import eval_length_bucket, training_order
from bertjax.finetune.task import Examples
from bertjax.text import features as features_lib

# A run cuts its batches to a few widths that cost at most this share more positions than
# cutting each batch to its own length bucket (the smallest multiple that holds it) would:
# one width is one compiled program (features.fewest_widths). Training's steps are most of a
# run's time, so its share is smaller (benchmarks/shapes.py counts both).
TRAIN_WIDTH_OVERHEAD = 0.02
EVAL_WIDTH_OVERHEAD = 0.05
# What compiling one evaluation program costs, in positions evaluated: the seconds a program
# takes to trace and compile times the positions a second the forward pass evaluates, on a
# CPU (benchmarks/modernbert_finetune.py). Accelerators compile slower and evaluate faster,
# so there a program is worth more positions still: this is a lower bound everywhere.
EVAL_PROGRAM_POSITIONS = 20_000
# The same for one training program, in positions trained (forward and backward), a lower
# bound as above (docs/compiling.md). A second run loads each program from the compilation
# cache, which still costs its tracing, so it gains less or loses a little.
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
