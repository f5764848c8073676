"""The one batching path every notebook method runs a model through (bertjax.inference.Model).

Texts are sorted by length and cut into batches of `batch_size`; each batch is padded to a
bucket, its length to a power of two up to the model's position limit and its rows to a power
of two up to `batch_size`, so each bucket compiles once and every later batch of that shape
reuses it. On a CPU a batch of long texts is cut into smaller calls (perf.rows_per_call: at
most about 2,048 tokens per device), which stay in the cache. With a mesh, batches are split
over its (data, fsdp) axes and parameters laid out by the model's logical axis rules; without
one, everything runs on the first device. Calls over many texts show a progress bar. A padded
batch whose real tokens fill at most PACKING_MAX_SHARE of its slots runs unpadded
(`fitted_packed_length`): the encoder computes its real tokens only, with the same outputs.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import tqdm.auto
from jax.experimental import multihost_utils

from bertjax.engine import perf
from bertjax.nn import sharding as sharding_lib

# The shortest length bucket: shorter batches would compile more shapes for no gain.
MIN_LENGTH_BUCKET = 8
# Calls over at least this many texts show a progress bar (when `progress` is None).
PROGRESS_MIN_TEXTS = 2048
# A padded batch runs unpadded (the encoder's packed_length, as fine-tuning runs it) when its
# fullest batch shard's real tokens fit in at most this share of the shard's slots: the rule
# ModernBERT's encoder applies (its PACKING_MAX_SHARE, chosen on train steps), which pays for
# notebook calls of review-length texts too (docs/modernbert-unpadded.md, "Notebook methods").
PACKING_MAX_SHARE = 0.7
# Packed lengths are whole eighths of a shard's slots, so that a bucket shape compiles at most
# five packed programs besides its padded one.
PACKING_STEPS = 8


def _next_power_of_two(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class Batcher:
    """Runs jitted functions over padded batches of features, on one device or a mesh.

    `max_positions`: the model's position limit (the longest bucket); `batch_size` is rounded
    up to a multiple of the mesh's data-parallel size; `progress`: show a progress bar (None:
    for calls over PROGRESS_MIN_TEXTS texts or more); `unpad=False` runs every batch padded
    (the reference the unpadded path is tested against).
    """

    def __init__(
        self,
        *,
        max_positions: int,
        mesh: jax.sharding.Mesh | None = None,
        batch_size: int = 32,
        progress: bool | None = None,
        unpad: bool = True,
    ):
        self.max_positions = max_positions
        self.mesh = mesh
        self.progress = progress
        self.unpad = unpad
        self._rows_multiple = 1 if mesh is None else sharding_lib.data_parallel_size(mesh)
        # The batch shards the encoder packs each of (sharding.shards(BATCH) inside the mesh).
        self._shards = 1 if mesh is None else sharding_lib.shards(sharding_lib.BATCH, mesh)
        # Without a mesh, everything runs on this one device.
        self._device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        self.batch_size = _round_up(batch_size, self._rows_multiple)
        devices = jax.local_devices() if mesh is None else mesh.devices.flat
        self._platform = next(iter(devices)).platform

    def batched(
        self,
        function: Callable,
        params: Any,
        features: list[dict[str, np.ndarray]],
        max_length: int | None = None,
    ) -> Iterator:
        """Yields (rows, outputs) per batch: the rows of `features` and numpy outputs for them.

        `function(params, batch, packed_length=...)` runs a padded batch; `packed_length`
        (static: None, or the slots per batch shard that hold its real tokens, chosen by
        `fitted_packed_length`) is for the encoder, which then computes real tokens only.
        `max_length`: the longest any row can be (question answering's window length), which
        caps the length buckets: windows of 384 tokens are padded to 384, not to 512.
        Batches are dispatched one ahead of reading their results back, so the host builds
        the next batch while the device computes.
        """
        pending: collections.deque = collections.deque()
        show = self.progress if self.progress is not None else len(features) >= PROGRESS_MIN_TEXTS
        bar = tqdm.auto.tqdm(
            total=len(features),
            unit="text",
            leave=False,
            disable=not show or jax.process_index() != 0,
        )
        try:
            for rows in self.batches(features, max_length):
                shape = self.bucket(rows, features, max_length)
                batch = pad_batch([features[r] for r in rows], shape)
                length = (
                    fitted_packed_length(batch["input_mask"], self._shards) if self.unpad else None
                )
                with self.context():  # the mesh, for the model's sharding constraints
                    out = function(params, self.put(batch), packed_length=length)
                    pending.append((rows, out))
                if len(pending) > 1:
                    rows_done, out = pending.popleft()
                    yield rows_done, self._fetch(out, len(rows_done))
                    bar.update(len(rows_done))
            while pending:
                rows_done, out = pending.popleft()
                yield rows_done, self._fetch(out, len(rows_done))
                bar.update(len(rows_done))
        finally:
            bar.close()

    def batches(
        self, features: list[dict[str, np.ndarray]], max_length: int | None = None
    ) -> Iterator[np.ndarray]:
        """Row indices of each batch: longest texts first, so batches are of like lengths.

        A batch holds `batch_size` rows, or on a CPU as many as perf.rows_per_call allows
        at its padded length (long texts run in smaller calls that stay in the cache).
        """
        lengths = np.asarray([len(f["input_ids"]) for f in features])
        order = np.argsort(-lengths, kind="stable")
        start = 0
        while start < len(order):
            length = self._bucket_length(int(lengths[order[start]]), max_length)
            count = perf.rows_per_call(length, self.batch_size, self._rows_multiple, self._platform)
            yield order[start : start + count]
            start += count

    def _bucket_length(self, longest: int, max_length: int | None = None) -> int:
        """A batch's padded length: a power of two, at most the model's positions and
        `max_length` (when the batch's longest row fits in it)."""
        limit = self.max_positions
        if max_length is not None:
            limit = min(limit, max(max_length, longest))
        return min(max(_next_power_of_two(longest), MIN_LENGTH_BUCKET), limit)

    def bucket(
        self,
        rows: np.ndarray,
        features: list[dict[str, np.ndarray]],
        max_length: int | None = None,
    ) -> dict[str, int]:
        """The padded shape of a batch: powers of two (rows a multiple of the data axes), the
        length at most the model's positions and `max_length`."""
        longest = max(len(features[r]["input_ids"]) for r in rows)
        length = self._bucket_length(longest, max_length)
        count = _round_up(min(_next_power_of_two(len(rows)), self.batch_size), self._rows_multiple)
        shape = {"rows": count, "length": length}
        if "masked_lm_positions" in features[rows[0]]:
            most = max(len(features[r]["masked_lm_positions"]) for r in rows)
            shape["masks"] = _next_power_of_two(most)
        return shape

    def context(self):
        """The mesh and its logical axis rules, for the model's sharding constraints."""
        if self.mesh is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(sharding_lib.LOGICAL_RULES))
        return stack

    def place(self, params: Any, abstract: Callable[[], Any]) -> Any:
        """Parameters on this batcher's device(s): one device, or laid out on the mesh by the
        logical axis names of `abstract()` (the tree's shapes and names, nothing computed)."""
        params = nn.meta.unbox(params)
        if isinstance(params, dict) and set(params) == {"params"}:
            params = params["params"]
        if self.mesh is None:
            return jax.device_put(params, self._device)
        shardings = sharding_lib.logical_shardings(abstract(), self.mesh)
        # A group the family's tree does not have (a ModernBERT discriminator's replaced-token
        # head: bertjax.pretrain.objectives.rtd) is small: replicated.
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        shardings = {
            name: shardings[name]
            if name in shardings
            else jax.tree.map(lambda _: replicated, group)
            for name, group in params.items()
        }
        return jax.device_put(params, shardings)

    def put(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        if self.mesh is None:
            return jax.device_put(batch, self._device)
        rows = sharding_lib.batch_sharding(self.mesh)
        # Every process holds the whole batch and hands over the pieces its devices keep.
        return {
            name: jax.make_array_from_callback(array.shape, rows, lambda index, a=array: a[index])
            for name, array in batch.items()
        }

    def _fetch(self, out: Any, count: int) -> Any:
        def one(x):
            if not x.is_fully_addressable:
                x = multihost_utils.process_allgather(x, tiled=True)
            return np.asarray(x)[:count]

        return jax.tree.map(one, out)


def fitted_packed_length(input_mask: np.ndarray, shards: int = 1) -> int | None:
    """The encoder's packed_length for a padded batch [rows, length] split into `shards` batch
    shards of contiguous rows, or None: run it padded.

    The fullest shard's real tokens, rounded up to whole eighths of a shard's slots (few
    programs), when that is at most PACKING_MAX_SHARE of them (packing pays).
    """
    rows, length = input_mask.shape
    slots = rows // shards * length
    fullest = int(input_mask.reshape(shards, -1).sum(axis=1).max())  # real tokens of a shard
    step = max(slots // PACKING_STEPS, 1)
    packed = max(_round_up(fullest, step), step)
    return packed if packed <= PACKING_MAX_SHARE * slots else None


def pad_batch(features: list[dict[str, np.ndarray]], shape: dict[str, int]) -> dict:
    """Stacks examples into [rows, length] arrays (and [rows, masks] positions), zero-padded.

    Padding rows are all zero: their outputs are computed and dropped.
    """
    rows, length = shape["rows"], shape["length"]
    batch = {
        "input_ids": np.zeros((rows, length), np.int32),
        "input_mask": np.zeros((rows, length), np.int32),
        "segment_ids": np.zeros((rows, length), np.int32),
    }
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        batch["input_ids"][row, :n] = f["input_ids"]
        batch["input_mask"][row, :n] = 1
        batch["segment_ids"][row, :n] = f["segment_ids"]
    if "masks" in shape:
        positions = np.zeros((rows, shape["masks"]), np.int32)
        for row, f in enumerate(features):
            positions[row, : len(f["masked_lm_positions"])] = f["masked_lm_positions"]
        batch["masked_lm_positions"] = positions
    return batch
