"""The batches of a fine-tuning run: each epoch's order of the training examples, training
batches (and micro-batches grouped by length) cut to the positions they need, and evaluation
batches sorted by length, every process taking its own rows of each global batch."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import jax
import numpy as np

from bertjax.engine import perf
from bertjax.finetune.settings import BATCH_ORDERS
from bertjax.finetune.task import Examples

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
    for name in per_position_features(examples):
        batch[name] = batch[name][:, :width]
    if "weights" not in batch:  # a split may weigh its rows' labels (distillation's unlabeled)
        batch["weights"] = np.ones(len(rows), np.float32)
    return batch


def per_position_features(examples: Examples) -> list[str]:
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
        return fitting_width(widths, longest, seq)
    return min(seq, -(-longest // length_bucket) * length_bucket)


def fitting_width(widths: tuple[int, ...], longest: int, seq: int) -> int:
    """The smallest of `widths` that holds `longest` positions (all `seq` if none does)."""
    at = bisect.bisect_left(widths, longest)
    return min(seq, widths[at]) if at < len(widths) else seq


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
        first = fitting_width(widths, int(lengths[order[start]]), seq)
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
        for name in per_position_features(examples):
            batch[name] = batch[name][:, :width]
    weights = np.zeros(size, np.float32)
    weights[: len(real)] = 1.0
    batch["weights"] = weights
    local = size // jax.process_count()
    mine = slice(jax.process_index() * local, (jax.process_index() + 1) * local)
    return {name: array[mine] for name, array in batch.items()}


def eval_length_bucket(length_bucket: int) -> int:
    """The multiple evaluation cuts its widths to, given training's `length_bucket` (0: all
    positions).

    Evaluation compiles forward passes only, cheap beside training's steps, so its widths are
    four times finer: pairs of about 18 tokens run 24 wide rather than 32.
    """
    return max(1, length_bucket // 4) if length_bucket else 0
