"""Weighted mixtures of corpora: the sources, and which source each example of a run is from.

Sources. ``parse_sources`` reads the ``data.sources`` setting, a comma-separated list of
``name=path[|path...]:weight[:option=value...]`` (paths are files, globs or directories, local
or gs://; options: ``format``, ``text_field``, ``id_field``, ``max_epochs``), e.g.::

    web=gs://b/fineweb/*.parquet:0.6,books=books/*.jsonl.zst:0.3,wiki=wiki/:0.1:max_epochs=2

Weights are relative (they need not sum to 1). ``max_epochs`` caps how many passes over a
source the run may take (0, the default: no cap); a source that reaches its cap drops out and
the others' weights are renormalised.

Schedule. Example ``i`` of the run (global batch ``t`` holds examples ``t*G .. t*G + G - 1``)
lies in block ``i // BLOCK_EXAMPLES``. Each block gives every active source its share of the
block's examples (largest remainders), interleaved evenly: the j-th of a source's ``n`` examples
has the key ``(j + u) / n`` for an offset ``u`` drawn from ``(seed, block)``, and the block is
the examples in key order, so any run of ``m`` examples holds about ``m * weight`` of each
source. A source's examples are numbered in the order drawn; number ``k`` is example
``k mod N`` of its pass ``k // N`` (N: its size), in the order its pass's permutation (from
``(seed, source name, pass)``) gives. Everything is a pure function of the example index, so a
run resumes from its step alone, on any number of processes, each process computing and reading
only its own rows. Which sources are active in a block follows from the weights, sizes and
caps alone (``Schedule.segments``): a source leaves after the last block it can fill.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

from bertjax.data.corpus import ReadSettings
from bertjax.data.loader import (
    REMOTE_READ_AHEAD,
    BatchMakerBase,
    Loader,
    check_processes,
    open_split,
)
from bertjax.data.masking import MaskingSettings, RowRandom
from bertjax.data.storage import SplitReader
from bertjax.storage import fs
from bertjax.text.tokenizer import Tokenizer

# Examples per block of the schedule: the unit whose shares are exact (to one example).
BLOCK_EXAMPLES = 1000
SOURCE_OPTIONS = ("format", "text_field", "id_field", "max_epochs")
PATH_SEPARATOR = "|"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# Stream tags of the schedule's random offsets, each source's pass permutations and the
# masking of each example (the single-source loader's tags are 0 and 1).
_SCHEDULE_STREAM, _SOURCE_SHUFFLE_STREAM, _MASKING_STREAM = 3, 4, 5
STATE_VERSION = 1
SYNTAX = "name=path[|path...]:weight[:option=value...]"
EXAMPLE = "web=data/web/*.parquet:0.6,books=data/books.jsonl.zst:0.4:max_epochs=2"


@dataclasses.dataclass(frozen=True)
class Source:
    """One corpus of a mixture: where it is, its weight, how it is read, its repetition cap."""

    name: str
    paths: tuple[str, ...]
    weight: float
    format: str = "auto"
    text_field: str = "text"
    id_field: str = ""
    max_epochs: float = 0.0  # passes the run may take over it; 0: no cap

    @property
    def read_settings(self) -> ReadSettings:
        return ReadSettings(self.format, self.text_field, self.id_field)

    def to_dict(self) -> dict:
        """A JSON-serialisable copy (as checkpoints' meta record it)."""
        return {**dataclasses.asdict(self), "paths": list(self.paths)}


class SourcesError(ValueError):
    """A data.sources setting that cannot be read; the message names the entry."""


def parse_sources(text: str) -> tuple[Source, ...]:
    """The sources of a ``data.sources`` setting (module docstring); () for an empty one."""
    sources: list[Source] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, sep, rest = entry.partition("=")
        name = name.strip()
        if not sep or not rest or ":" not in rest:
            raise SourcesError(f"entry {entry!r} is invalid: write {SYNTAX}, e.g. {EXAMPLE}")
        if not _NAME.match(name):
            raise SourcesError(
                f"entry {entry!r}: the name {name!r} is invalid; use letters, digits, '_', '-', "
                "'.' (it names the source in logs and prepared directories)"
            )
        if any(source.name == name for source in sources):
            raise SourcesError(f"the name {name!r} is given twice; give each source its own")
        tokens = rest.split(":")
        options: dict[str, str] = {}
        # Options come last and hold "="; the weight is the first token before them; the path
        # is what remains (it may hold ':' itself, as gs:// does).
        while len(tokens) > 2 and "=" in tokens[-1]:
            key, _, value = tokens.pop().partition("=")
            if key not in SOURCE_OPTIONS:
                raise SourcesError(
                    f"source {name!r}: unknown option {key!r}; valid: {', '.join(SOURCE_OPTIONS)}"
                )
            options[key] = value
        weight_text = tokens.pop().strip()
        path_text = ":".join(tokens)
        paths = tuple(p.strip() for p in path_text.split(PATH_SEPARATOR) if p.strip())
        if not paths:
            raise SourcesError(f"source {name!r} names no path; write {SYNTAX}")
        weight = _positive_number(weight_text)
        if weight is None:
            raise SourcesError(
                f"source {name!r}: weight {weight_text!r} is not a positive number; write "
                f"{SYNTAX} with a weight > 0, e.g. {EXAMPLE}"
            )
        max_epochs = 0.0
        if "max_epochs" in options:
            max_epochs = _positive_number(options.pop("max_epochs")) or -1.0
            if max_epochs < 0:
                raise SourcesError(
                    f"source {name!r}: max_epochs must be a number > 0 (passes over the source; "
                    "leave it out for no cap)"
                )
        try:
            source = Source(name, paths, weight, max_epochs=max_epochs, **options)
            source.read_settings  # noqa: B018 - validates format and fields
        except ValueError as err:
            raise SourcesError(f"source {name!r}: {err}") from None
        sources.append(source)
    return tuple(sources)


def _positive_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def apportion(total: int, weights: list[float]) -> list[int]:
    """total split in proportion to weights: floors, then one more each for the largest
    remainders (ties to the earlier source)."""
    whole = sum(weights)
    quotas = [total * w / whole for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in by_remainder[: total - sum(counts)]:
        counts[s] += 1
    return counts


@dataclasses.dataclass(frozen=True)
class Segment:
    """Consecutive blocks in which the same sources are active, with each one's count per block."""

    first_block: int
    end_block: int | None  # None: the schedule never ends
    counts: tuple[int, ...]  # examples per block of each source (0: not active)
    dropped: tuple[int, ...]  # sources that ran out just before this segment


def _unit_hash(*numbers: int) -> float:
    """A number in [0, 1) drawn from a hash of the given integers (cheaper than a generator
    for the few draws a block takes)."""
    text = ":".join(map(str, numbers)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") / 2.0**64


def source_key(name: str) -> int:
    """A stable number for a source's name: its pass permutations do not depend on its place."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "little")


class Schedule:
    """Which source, and which of its examples, each example of a run comes from."""

    def __init__(
        self,
        names: list[str],
        weights: list[float],
        sizes: list[int],
        max_epochs: list[float],
        seed: int,
    ):
        if not (len(names) == len(weights) == len(sizes) == len(max_epochs)) or not names:
            raise ValueError("a schedule needs one name, weight, size and cap per source")
        self.names = list(names)
        self.weights = [float(w) for w in weights]
        self.sizes = [int(n) for n in sizes]
        self.max_epochs = [float(c) for c in max_epochs]
        self.seed = seed
        # Examples each source may give: its passes times its size (None: no cap).
        limits = [
            math.floor(cap * size) if cap else None for cap, size in zip(self.max_epochs, sizes)
        ]
        self.segments = _segments(self.weights, limits)
        last = self.segments[-1] if self.segments else None
        self.total_examples: int | None = None  # None: the mixture never ends
        if last is None or last.end_block is not None:
            self.total_examples = sum(
                (segment.end_block - segment.first_block) * sum(segment.counts)
                for segment in self.segments
            )
        self._lock = threading.Lock()
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def segment_index(self, block: int) -> int:
        """The index of the segment holding block (len(segments) past the end)."""
        for index, segment in enumerate(self.segments):
            if segment.end_block is None or block < segment.end_block:
                return index
        return len(self.segments)

    def before(self, block: int) -> np.ndarray:
        """Examples of each source in the blocks before block: [S]."""
        counts = np.zeros(len(self.names), dtype=np.int64)
        for segment in self.segments:
            if segment.first_block >= block:
                break
            end = block if segment.end_block is None else min(block, segment.end_block)
            counts += (end - segment.first_block) * np.asarray(segment.counts, dtype=np.int64)
        return counts

    def block(self, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source of each example of the block [BLOCK], its number among the run's examples of
        that source [BLOCK], the example of the source's split it is [BLOCK]); made once per
        block, so that a batch's lookup is slices of one or two blocks (span)."""
        with self._lock:
            cached = self._blocks.get(block)
            if cached is not None:
                return cached
        index = self.segment_index(block)
        if index == len(self.segments):
            raise IndexError(
                f"block {block} is past the end of the mixture ({self.total_examples} examples)"
            )
        active = [(s, n) for s, n in enumerate(self.segments[index].counts) if n]
        before = self.before(block)
        keys, numbers, examples = [], [], []
        for s, n in active:
            ranks = np.arange(n, dtype=np.int64)
            keys.append((ranks + _unit_hash(self.seed, _SCHEDULE_STREAM, block, s)) / n)
            # Laid out source by source, a source's draws are consecutive numbers: their
            # examples come from a slice or two of its pass orders, before the interleaving.
            numbers.append(before[s] + ranks)
            examples.append(self._examples_in(s, int(before[s]), n))
        sources = np.repeat(np.asarray([s for s, _ in active], np.int32), [n for _, n in active])
        keys, numbers, examples = map(np.concatenate, (keys, numbers, examples))
        # By key; equal keys (rare) by source, the order they were laid out in.
        order = np.argsort(keys, kind="stable")
        result = (sources[order], numbers[order], examples[order])  # [BLOCK] each
        with self._lock:
            # Keep the latest blocks only: a batch (and prefetch) spans a few.
            if len(self._blocks) > 8:
                self._blocks = {b: v for b, v in self._blocks.items() if b >= block - 4}
            self._blocks[block] = result
        return result

    def span(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(source [count], example of that source's prepared split [count]) of the run's
        examples first .. first + count - 1, as examples() gives them: slices of the blocks
        they lie in (a batch's lookup; the arrays may be shared with the cache: read only)."""
        sources, examples = [], []
        index, end = int(first), int(first) + int(count)
        while index < end:
            block, within = divmod(index, BLOCK_EXAMPLES)
            take = min(end - index, BLOCK_EXAMPLES - within)
            made = self.block(block)
            sources.append(made[0][within : within + take])
            examples.append(made[2][within : within + take])
            index += take
        if len(sources) == 1:
            return sources[0], examples[0]
        if not sources:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        return np.concatenate(sources), np.concatenate(examples)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source [n], number among that source's examples of the run [n]) of examples."""
        return self._lookup(indices, 1)

    def examples(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source [n], example of that source's prepared split [n]) of run examples."""
        return self._lookup(indices, 2)

    def _lookup(self, indices: np.ndarray, column: int) -> tuple[np.ndarray, np.ndarray]:
        """(source [n], block()'s column [n]) of run examples."""
        indices = np.asarray(indices, dtype=np.int64)
        blocks, within = np.divmod(indices, BLOCK_EXAMPLES)
        if len(indices) and blocks.min() == blocks.max():  # a batch within one block
            made = self.block(int(blocks[0]))
            return made[0][within], made[column][within]
        source = np.empty(len(indices), dtype=np.int32)
        value = np.empty(len(indices), dtype=np.int64)
        for block in np.unique(blocks):
            rows = blocks == block
            made = self.block(int(block))
            source[rows] = made[0][within[rows]]
            value[rows] = made[column][within[rows]]
        return source, value

    def _examples_in(self, source: int, first: int, count: int) -> np.ndarray:
        """The examples of source's split that its draws first .. first + count - 1 are:
        [count], from the one or few passes they span."""
        size = self.sizes[source]
        parts = []
        number, end = first, first + count
        while number < end:
            epoch, position = divmod(number, size)
            take = min(end - number, size - position)
            parts.append(self.order(source, epoch)[position : position + take])
            number += take
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def order(self, source: int, epoch: int) -> np.ndarray:
        """The permutation of a source's examples for its pass epoch."""
        key = (source, epoch)
        with self._lock:
            order = self._orders.get(key)
        if order is None:
            stream = [self.seed, _SOURCE_SHUFFLE_STREAM, source_key(self.names[source]), epoch]
            order = np.random.default_rng(stream).permutation(self.sizes[source])
            with self._lock:
                # The latest two passes of each source: prefetch may straddle a pass boundary.
                self._orders = {
                    k: v for k, v in self._orders.items() if k[0] != source or k[1] >= epoch - 1
                }
                self._orders[key] = order
        return order

    def counts(self, num_examples: int) -> np.ndarray:
        """Examples of each source among the run's first num_examples: [S]."""
        block, within = divmod(int(num_examples), BLOCK_EXAMPLES)
        counts = self.before(block)
        if within and self.segment_index(block) < len(self.segments):
            labels = self.block(block)[0]
            counts = counts + np.bincount(labels[:within], minlength=len(self.names))
        return counts

    def shares(self, num_examples: int) -> dict[str, float]:
        """Each source's share of the run's first num_examples (the asked one for none)."""
        counts = self.counts(num_examples)
        total = counts.sum()
        if not total:
            whole = sum(self.weights)
            return {name: w / whole for name, w in zip(self.names, self.weights)}
        return {name: float(c / total) for name, c in zip(self.names, counts)}

    def asked(self) -> dict[str, float]:
        """The shares asked for (the weights, normalised)."""
        whole = sum(self.weights)
        return {name: w / whole for name, w in zip(self.names, self.weights)}

    def describe_segment(self, index: int) -> str:
        """One line: which sources ran out at the start of segment index and the new shares."""
        segment = self.segments[index]
        ran_out = ", ".join(
            f"{self.names[s]!r} (max_epochs={self.max_epochs[s]:g}, {self.sizes[s]} examples)"
            for s in segment.dropped
        )
        total = sum(segment.counts)
        shares = ", ".join(
            f"{self.names[s]} {n / total:.3f}" for s, n in enumerate(segment.counts) if n
        )
        return (
            f"mixture: {ran_out} ran out at example {segment.first_block * BLOCK_EXAMPLES}; "
            f"renormalised to {shares}"
        )


def _segments(weights: list[float], limits: list[int | None]) -> list[Segment]:
    """The schedule's segments: each runs while every active source can fill its share of a
    block. In the block where a source runs short it gives what it has left and the others
    share the rest; when all have run out, that block is the last, and may be partial."""
    remaining = list(limits)
    active = list(range(len(weights)))
    segments: list[Segment] = []
    first = 0
    dropped: list[int] = []

    def short_of(sources: list[int], counts: list[int]) -> list[int]:
        return [s for s, n in zip(sources, counts) if remaining[s] is not None and remaining[s] < n]

    while active:
        shares = apportion(BLOCK_EXAMPLES, [weights[s] for s in active])
        short = short_of(active, shares)
        if not short:
            counts = [0] * len(weights)
            for s, n in zip(active, shares):
                counts[s] = n
            runs = [
                remaining[s] // counts[s] for s in active if remaining[s] is not None and counts[s]
            ]
            end = first + min(runs) if runs else None
            segments.append(Segment(first, end, tuple(counts), tuple(dropped)))
            if end is None:
                break
            for s in active:
                if remaining[s] is not None:
                    remaining[s] -= (end - first) * counts[s]
            first, dropped = end, []
            continue
        # One block in which the short sources give what they have left.
        fill = {s: remaining[s] for s in short}
        rest = [s for s in active if s not in fill]
        while rest:
            free = BLOCK_EXAMPLES - sum(fill.values())
            shares = apportion(free, [weights[s] for s in rest])
            newly_short = short_of(rest, shares)
            if not newly_short:
                fill.update(zip(rest, shares))
                break
            fill.update({s: remaining[s] for s in newly_short})
            rest = [s for s in rest if s not in newly_short]
        counts = tuple(fill.get(s, 0) for s in range(len(weights)))
        segments.append(Segment(first, first + 1, counts, tuple(dropped)))
        for s, n in fill.items():
            if remaining[s] is not None:
                remaining[s] -= n
        dropped = [s for s in active if remaining[s] == 0]
        active = [s for s in active if remaining[s] != 0]
        first += 1
        if sum(counts) < BLOCK_EXAMPLES:
            break  # every source ran out within this block: the run ends with it
    return segments


class _MixtureMaker(BatchMakerBase):
    """A mixture's batches: each row from the source and example the schedule names."""

    def __init__(self, schedule: Schedule, readers: list[SplitReader], tokenizer, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.schedule = schedule
        # All sources' instances as one reader: a batch is one gather, whatever its sources.
        self.reader = SplitReader.concatenate(readers)
        self.offsets = np.cumsum([0] + [len(reader) for reader in readers[:-1]])  # [S]

    def _make(self, step: int) -> dict[str, np.ndarray]:
        first = int(step) * self.global_batch_size + self.process_index * self.batch_size
        indices = np.arange(first, first + self.batch_size)  # [B] examples of the run
        source, example = self.schedule.span(first, self.batch_size)  # [B], [B]
        features = self.reader.gather(self.offsets[source] + example, self.max_seq_length)
        # Keyed by the example's place in the run: the same rows whatever the process count.
        rng = RowRandom.from_positions(self.seed, _MASKING_STREAM, 0, indices)
        return self._finish(features, rng)


class MixtureLoader(Loader):
    """A Loader of a weighted mixture of prepared sources (the module's schedule).

    ``shares()`` gives each source's share of the examples handed out so far, ``asked()`` the
    weights; when a source reaches its cap, a line says so and gives the renormalised shares.
    """

    def __init__(
        self,
        maker: _MixtureMaker,
        tokenizer: Tokenizer,
        worker_count: int,
        log: Callable[[str], None],
    ):
        self.schedule = maker.schedule
        self.num_examples = sum(self.schedule.sizes)
        self.num_epochs = None
        total = self.schedule.total_examples
        num_steps = sys.maxsize if total is None else total // maker.global_batch_size
        self.batches_per_epoch = num_steps
        self._log = log
        self.notices: list[str] = []  # what was logged about the mixture, in order
        self._start(maker, tokenizer, num_steps, worker_count)
        self._announced = 0
        if self.schedule.segments and self.schedule.segments[0].dropped:
            self._notice(0)

    def __next__(self) -> dict[str, np.ndarray]:
        batch = super().__next__()
        last = (self._step * self._maker.global_batch_size - 1) // BLOCK_EXAMPLES
        index = self.schedule.segment_index(last)
        while self._announced < index:
            self._announced += 1
            self._notice(self._announced)
        return batch

    def _notice(self, index: int) -> None:
        if not self.schedule.segments[index].dropped:
            return  # the block in which a source runs short: the next segment's line says so
        line = self.schedule.describe_segment(index)
        self.notices.append(line)
        self._log(line)

    @property
    def remote_tokens(self):
        """The byte-range reader of gs:// sources (all of them); None on disk."""
        return self._maker.reader.remote

    def shares(self) -> dict[str, float]:
        """Each source's share of the examples of the batches handed out so far (all
        processes'), or the asked shares before the first."""
        return self.schedule.shares(self._step * self._maker.global_batch_size)

    def asked(self) -> dict[str, float]:
        """The shares the weights ask for."""
        return self.schedule.asked()

    def _identity(self) -> dict:
        schedule = self.schedule
        return {
            "version": STATE_VERSION,
            "global_batch_size": self._maker.global_batch_size,
            "seed": self._maker.seed,
            "sources": [
                [name, weight, size, cap]
                for name, weight, size, cap in zip(
                    schedule.names, schedule.weights, schedule.sizes, schedule.max_epochs
                )
            ],
        }

    def get_state(self) -> dict:
        """The position: the steps handed out, with what they are only meaningful for."""
        return {**self._identity(), "step": self._step}

    def set_state(self, state: dict) -> None:
        """Continues with exactly the batches that would have come after the saved state."""
        for key, value in self._identity().items():
            if state.get(key) != value:
                raise ValueError(
                    f"Loader state has {key}={state.get(key)!r} but this mixture has "
                    f"{key}={value!r}; a position is only meaningful for the same sources, "
                    "weights, seed and global batch size (start a new phase to change them)."
                )
        step = int(state["step"])
        if not 0 <= step <= self.num_steps:
            raise ValueError(f"Loader state step={step} is outside [0, {self.num_steps}].")
        self._seek(step)
        if step:
            last = (step * self._maker.global_batch_size - 1) // BLOCK_EXAMPLES
            self._announced = self.schedule.segment_index(last)


def make_mixture_loader(
    prepared: Sequence[tuple[Source, str | os.PathLike]],
    *,
    batch_size: int,
    seed: int = 0,
    masking: MaskingSettings | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    expected_max_seq_length: int | None = None,
    expected_tokenizer_fingerprint: str | None = None,
    worker_count: int = 0,
    log: Callable[[str], None] | None = None,
) -> MixtureLoader:
    """A loader of masked training batches drawn from several prepared directories in
    proportion to their sources' weights (this process's ``batch_size`` rows).

    Every directory must hold the same sequence length, layout and tokenizer. ``log`` takes the
    lines about sources that run out (default: print, on process 0 only).
    """
    if not prepared:
        raise ValueError("a mixture needs at least one source")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: it must be a positive integer.")
    process_index, process_count = check_processes(worker_count, process_index, process_count)
    opened = [
        open_split(directory, "train", expected_max_seq_length, expected_tokenizer_fingerprint)
        for _, directory in prepared
    ]
    first_manifest, _, _, tokenizer = opened[0]
    first_name = prepared[0][0].name
    for (source, _), (manifest, directory, reader, other) in zip(prepared, opened):
        for key, value, theirs in (
            ("max_seq_length", first_manifest["max_seq_length"], manifest["max_seq_length"]),
            ("layout", first_manifest.get("layout", "pairs"), manifest.get("layout", "pairs")),
            ("tokenizer", tokenizer.fingerprint[:12], other.fingerprint[:12]),
        ):
            if value != theirs:
                raise ValueError(
                    f"source {source.name!r} ({str(directory)!r}) was prepared with "
                    f"{key}={theirs!r} but source {first_name!r} with {key}={value!r}; the "
                    "sources of a mixture must share them"
                )
        if len(reader) == 0:
            raise ValueError(
                f"source {source.name!r} ({str(directory)!r}) holds no training examples"
            )
    schedule = Schedule(
        [source.name for source, _ in prepared],
        [source.weight for source, _ in prepared],
        [len(reader) for _, _, reader, _ in opened],
        [source.max_epochs for source, _ in prepared],
        seed,
    )
    global_batch_size = batch_size * process_count
    total = schedule.total_examples
    if total is not None and total < global_batch_size:
        raise ValueError(
            f"the mixture's caps (max_epochs) allow {total} examples, fewer than one global "
            f"batch of {global_batch_size}; raise the caps or add data"
        )
    maker = _MixtureMaker(
        schedule,
        [reader for _, _, reader, _ in opened],
        tokenizer,
        max_seq_length=int(first_manifest["max_seq_length"]),
        batch_size=batch_size,
        seed=seed,
        masking=masking or MaskingSettings(),
        process_index=process_index,
        process_count=process_count,
        layout=first_manifest.get("layout", "pairs"),
    )
    if any(fs.is_remote(directory) for _, directory in prepared):
        worker_count = max(worker_count, REMOTE_READ_AHEAD)
    if log is None:
        log = print if process_index == 0 else (lambda line: None)
    return MixtureLoader(maker, tokenizer, worker_count, log)
