"""The pretraining input pipeline: shuffle, shard by process, batch, mask (on grain).

Order. Epoch ``e`` visits the split in the permutation drawn from ``(seed, e)`` (identity
when ``shuffle=False``). Global batch ``g`` of the epoch is permutation entries
``[g*B*P, (g+1)*B*P)`` for per-process batch size ``B`` and ``P`` processes; process ``p``
takes the ``p``-th run of ``B`` of them, so processes read disjoint examples that together
cover the epoch. The last incomplete global batch of an epoch is dropped.

Masking is drawn per example from ``(seed, epoch, position in the epoch's order)``, so a
batch is a pure function of its step number and an example's mask does not depend on how
the global batch is split over processes (one process with 4 devices and two with 2 each
see the same batches): the output does not depend on prefetch threads either, and resuming
needs only the step. The grain pipeline is a ``MapDataset`` over step numbers whose map gathers
and masks a whole batch with vectorised numpy (grain's per-record overhead would dominate at the
rates wanted if every example were its own record).
"""

from __future__ import annotations

import sys
import threading

import grain
import jax
import numpy as np

from bertjax.data.masking import MaskingSettings, RowRandom, mask_batch
from bertjax.data.packing import document_features
from bertjax.data.storage import RemoteTokens, SplitReader, read_manifest
from bertjax.storage import fs
from bertjax.text.tokenizer import SENTENCEPIECE_FILE, Tokenizer

STATE_VERSION = 1
# Prefetch threads a loader of gs:// data uses at least: each batch is a round trip to the store.
REMOTE_READ_AHEAD = 4
# Stream tags keep the shuffle and masking random streams apart for the same seed.
_SHUFFLE_STREAM, _MASKING_STREAM = 0, 1


class BatchMakerBase:
    """Step number -> this process's masked batch, pure in the step (safe across threads):
    what a Loader asks of its maker. Subclasses gather a step's unmasked features (`_make`);
    masking and the batch's features are made here, alike for every maker."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        max_seq_length: int,
        batch_size: int,
        seed: int,
        masking: MaskingSettings,
        process_index: int,
        process_count: int,
        layout: str,
    ):
        self.layout = layout
        self.cls_id = tokenizer.cls_id
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self.global_batch_size = batch_size * process_count
        self.seed = seed
        self.masking = masking
        self.process_index = process_index
        self.vocab_size = tokenizer.vocab_size
        self.special_ids = tuple(tokenizer.special_ids)
        self.mask_id = tokenizer.mask_id
        self.is_word_start = np.asarray(tokenizer.is_word_start, dtype=bool)
        self.closed = False  # set by close()
        self._in_progress = 0
        self._busy = threading.Condition()

    def __call__(self, step: int) -> dict[str, np.ndarray] | None:
        with self._busy:
            if self.closed:
                return None
            self._in_progress += 1
        try:
            return self._make(step)
        finally:
            with self._busy:
                self._in_progress -= 1
                self._busy.notify_all()

    def close(self) -> None:
        """Makes no batch from now on, and returns once those being made are done."""
        with self._busy:
            self.closed = True
            self._busy.wait_for(lambda: self._in_progress == 0)

    def _make(self, step: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _finish(self, features: dict[str, np.ndarray], rng: RowRandom) -> dict[str, np.ndarray]:
        """The batch of unmasked features (SplitReader.gather's), masked with rng's rows."""
        masked = mask_batch(
            features["input_ids"],
            features["input_mask"],
            rng,
            self.masking,
            vocab_size=self.vocab_size,
            special_ids=self.special_ids,
            mask_id=self.mask_id,
            is_word_start=self.is_word_start,
        )
        batch = {
            "input_ids": masked["input_ids"],
            "input_mask": features["input_mask"],
            "segment_ids": features["segment_ids"],
            "masked_lm_positions": masked["masked_lm_positions"],
            "masked_lm_ids": masked["masked_lm_ids"],
            "masked_lm_weights": masked["masked_lm_weights"],
            "next_sentence_labels": features["next_sentence_labels"],
        }
        if self.layout == "packed":
            # From the unmasked ids: every document piece starts with [CLS].
            batch.update(
                document_features(features["input_ids"], features["input_mask"], self.cls_id)
            )
        return batch


class _BatchMaker(BatchMakerBase):
    """One prepared split's batches: epochs of its shuffled order."""

    def __init__(
        self,
        reader: SplitReader,
        tokenizer: Tokenizer,
        *,
        max_seq_length: int,
        batch_size: int,
        seed: int,
        masking: MaskingSettings,
        shuffle: bool,
        process_index: int,
        process_count: int,
        layout: str = "pairs",
    ):
        super().__init__(
            tokenizer,
            max_seq_length=max_seq_length,
            batch_size=batch_size,
            seed=seed,
            masking=masking,
            process_index=process_index,
            process_count=process_count,
            layout=layout,
        )
        self.reader = reader
        self.batches_per_epoch = len(reader) // self.global_batch_size
        self.shuffle = shuffle
        self._lock = threading.Lock()
        self._orders: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's visiting order of the split (a permutation when shuffling)."""
        with self._lock:
            order = self._orders.get(epoch)
            if order is None:
                if self.shuffle:
                    rng = np.random.default_rng([self.seed, _SHUFFLE_STREAM, epoch])
                    order = rng.permutation(len(self.reader))
                else:
                    order = np.arange(len(self.reader))
                # Keep only the latest epochs: prefetch may straddle an epoch boundary.
                self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
                self._orders[epoch] = order
            return order

    def _make(self, step: int) -> dict[str, np.ndarray]:
        epoch, batch_in_epoch = divmod(int(step), self.batches_per_epoch)
        first = batch_in_epoch * self.global_batch_size + self.process_index * self.batch_size
        indices = self.order(epoch)[first : first + self.batch_size]  # [B]
        features = self.reader.gather(indices, self.max_seq_length)
        rng = RowRandom.from_positions(
            self.seed, _MASKING_STREAM, epoch, np.arange(first, first + self.batch_size)
        )
        return self._finish(features, rng)


class Loader:
    """Iterator of this process's batches; its position is a small JSON-serialisable state.

    A finite loader (``num_epochs`` set) that has been exhausted starts over when iterated
    again, so ``for batch in eval_loader`` gives the same batches on every pass.
    """

    def __init__(
        self, maker: _BatchMaker, tokenizer: Tokenizer, num_epochs: int | None, worker_count: int
    ):
        self.num_examples = len(maker.reader)
        self.batches_per_epoch = maker.batches_per_epoch
        self.num_epochs = num_epochs
        num_steps = sys.maxsize if num_epochs is None else num_epochs * maker.batches_per_epoch
        self._start(maker, tokenizer, num_steps, worker_count)

    def _start(
        self, maker: BatchMakerBase, tokenizer: Tokenizer, num_steps: int, worker_count: int
    ) -> None:
        """Starts the grain pipeline of maker's batches for steps [0, num_steps)."""
        self._maker = maker
        self.tokenizer = tokenizer
        self.layout = maker.layout
        self.max_seq_length = maker.max_seq_length
        self.max_predictions_per_seq = maker.masking.max_predictions_per_seq
        self.batch_size = maker.batch_size
        self.num_steps = num_steps
        dataset = grain.MapDataset.range(self.num_steps).map(maker)
        read_options = grain.ReadOptions(
            num_threads=worker_count, prefetch_buffer_size=2 * worker_count
        )
        self._iterator = dataset.to_iter_dataset(read_options).__iter__()
        self._step = 0

    @property
    def remote_tokens(self) -> RemoteTokens | None:
        """The byte-range reader of gs:// data (its bytes_read and peak_bytes); None on disk."""
        return self._maker.reader.remote

    def __iter__(self) -> Loader:
        if self._step >= self.num_steps:
            self._seek(0)
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        self._step += 1
        return batch

    def __len__(self) -> int:
        """Batches in one full pass (all epochs) of a finite loader."""
        if self.num_epochs is None:
            raise TypeError("An endless loader (num_epochs=None) has no length.")
        return self.num_steps

    def close(self) -> None:
        """Stops the prefetch threads, once the batches being made are done (no request to
        the store is left in flight); iterating after close is not supported."""
        self._iterator.close()
        self._maker.close()

    def _seek(self, step: int) -> None:
        self._iterator.set_state({"next_index": step})
        self._step = step

    def get_state(self) -> dict:
        """The position: the batches handed out so far, as epoch and batch within it."""
        epoch, batch_in_epoch = divmod(self._step, self.batches_per_epoch)
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "global_batch_size": self._maker.global_batch_size,
            "num_examples": self.num_examples,
            "seed": self._maker.seed,
        }

    def set_state(self, state: dict) -> None:
        """Continues with exactly the batches that would have come after the saved state."""
        expected = {
            "version": STATE_VERSION,
            "global_batch_size": self._maker.global_batch_size,
            "num_examples": self.num_examples,
            "seed": self._maker.seed,
        }
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"Loader state has {key}={state.get(key)!r} but this loader has "
                    f"{key}={value!r}; a position is only meaningful for the same data, "
                    "seed and global batch size."
                )
        batch_in_epoch = int(state["batch_in_epoch"])
        if not 0 <= batch_in_epoch < self.batches_per_epoch:
            raise ValueError(
                f"Loader state has batch_in_epoch={batch_in_epoch}, outside "
                f"[0, {self.batches_per_epoch})."
            )
        step = int(state["epoch"]) * self.batches_per_epoch + batch_in_epoch
        if not 0 <= step <= self.num_steps:
            raise ValueError(
                f"Loader state epoch={state['epoch']} is beyond this loader's "
                f"num_epochs={self.num_epochs}."
            )
        self._seek(step)


def make_loader(
    data_dir,
    *,
    split: str = "train",
    batch_size: int,
    seed: int = 0,
    masking: MaskingSettings | None = None,
    shuffle: bool = True,
    num_epochs: int | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    expected_max_seq_length: int | None = None,
    expected_tokenizer_fingerprint: str | None = None,
    worker_count: int = 0,
) -> Loader:
    """A loader of masked batches (this process's ``batch_size`` rows) from a prepared directory.

    ``worker_count`` is the number of prefetch threads (0: batches are made on demand in the
    calling thread); it never changes the batches. Data on ``gs://`` is read by byte ranges
    (storage.RemoteTokens), never downloaded whole, with at least REMOTE_READ_AHEAD threads
    making the next batches ahead (a bounded number: twice the threads), so that a request's
    round trip does not stall each step.

    Data prepared with ``layout="packed"`` gives two more features: ``document_ids`` (1.. per
    document of a row, 0 for padding) and ``positions`` (restarting at 0 at each document);
    its segment_ids and next_sentence_labels are all 0.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: it must be a positive integer.")
    if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
        raise ValueError(
            f"num_epochs={num_epochs!r} is invalid: use a positive integer or None (endless)."
        )
    process_index, process_count = check_processes(worker_count, process_index, process_count)
    manifest, data_dir, reader, tokenizer = open_split(
        data_dir, split, expected_max_seq_length, expected_tokenizer_fingerprint
    )
    global_batch_size = batch_size * process_count
    if len(reader) < global_batch_size:
        raise ValueError(
            f"split {split!r} of {str(data_dir)!r} has {len(reader)} examples, fewer than one "
            f"global batch (batch_size={batch_size} x process_count={process_count} = "
            f"{global_batch_size}); use a smaller batch or more data."
        )
    maker = _BatchMaker(
        reader,
        tokenizer,
        max_seq_length=int(manifest["max_seq_length"]),
        batch_size=batch_size,
        seed=seed,
        masking=masking or MaskingSettings(),
        shuffle=shuffle,
        process_index=process_index,
        process_count=process_count,
        layout=manifest.get("layout", "pairs"),
    )
    if fs.is_remote(data_dir):
        worker_count = max(worker_count, REMOTE_READ_AHEAD)
    return Loader(maker, tokenizer, num_epochs, worker_count)


def check_processes(
    worker_count: int, process_index: int | None, process_count: int | None
) -> tuple[int, int]:
    """(process index, process count), jax's when not given; checks them and worker_count."""
    if not isinstance(worker_count, int) or worker_count < 0:
        raise ValueError(f"worker_count={worker_count!r} is invalid: it must be an integer >= 0.")
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} is invalid for process_count={process_count}: "
            f"valid indices are 0..{process_count - 1}."
        )
    return process_index, process_count


def open_split(
    data_dir,
    split: str,
    expected_max_seq_length: int | None = None,
    expected_tokenizer_fingerprint: str | None = None,
) -> tuple[dict, fs.AnyPath, SplitReader, Tokenizer]:
    """(manifest, directory, reader, tokenizer) of a prepared split, checked against what the
    caller expects and against the directory's own tokenizer."""
    manifest = read_manifest(data_dir)
    data_dir = fs.path(data_dir)
    if expected_max_seq_length not in (None, manifest["max_seq_length"]):
        raise ValueError(
            f"{str(data_dir)!r} was prepared with max_seq_length={manifest['max_seq_length']} "
            f"but this run expects max_seq_length={expected_max_seq_length}; prepare the data "
            "again with the run's sequence length or change the run."
        )
    if (
        expected_tokenizer_fingerprint is not None
        and expected_tokenizer_fingerprint != manifest["tokenizer_fingerprint"]
    ):
        raise ValueError(
            f"{str(data_dir)!r} was prepared with the tokenizer of fingerprint "
            f"{manifest['tokenizer_fingerprint']} but this run expects fingerprint "
            f"{expected_tokenizer_fingerprint}; prepare the data again with the run's tokenizer."
        )
    if split not in manifest["splits"]:
        raise ValueError(
            f"split={split!r} is not in {str(data_dir)!r}; valid: {sorted(manifest['splits'])}."
        )
    tokenizer = Tokenizer.load(data_dir / SENTENCEPIECE_FILE)
    if tokenizer.fingerprint != manifest["tokenizer_fingerprint"]:
        raise ValueError(
            f"{str(data_dir / SENTENCEPIECE_FILE)!r} has fingerprint {tokenizer.fingerprint} but "
            f"the manifest names {manifest['tokenizer_fingerprint']}: the directory was altered; "
            "prepare the data again."
        )
    reader = SplitReader(data_dir, split, manifest["splits"][split]["shards"])
    return manifest, data_dir, reader, tokenizer
