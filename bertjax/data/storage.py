"""On-disk format of prepared instances: memory-mappable shards plus a manifest.

A prepared directory holds::

    tokenizer.model                     the sentencepiece model the ids come from
    manifest.json                       written last: its presence marks a finished prepare
    <split>/shard-NNNNN.tokens.npy      flat token ids of the shard's instances (uint16 or int32)
    <split>/shard-NNNNN.index.npy       int64 [n, 4]: start, length, segment_b_start, label

Instance ``i`` of a shard is ``tokens[start:start + length]`` = "[CLS] A [SEP] B [SEP]";
segment 1 begins at ``segment_b_start``. On disk both files open with ``np.load(mmap_mode="r")``,
so readers touch only the pages they gather from. On GCS (``gs://``) the small index file is
read whole and the token file by byte ranges (`RemoteTokens`): a batch fetches only its
instances' tokens, concurrently, and nothing is downloaded ahead of need but the batches the
loader's threads prefetch. One reader over several splits (a mixture's sources) may hold some
on disk and some on GCS, each shard read its own way.
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Sequence

import numpy as np

from bertjax.data.instances import Instances
from bertjax.storage import fs

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
SPLITS = ("train", "eval")

# Columns of a shard's index file.
START, LENGTH, SEGMENT_B_START, LABEL = range(4)
INDEX_COLUMNS = 4


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest storage dtype for ids of this vocabulary: uint16 when it fits."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def _prepare_hint(path: fs.AnyPath) -> str:
    return (
        f"run `python -m bertjax.data.prepare --input <corpus files> --output {path}` "
        "(or bertjax.data.prepare(...)) to create it"
    )


def _save(path: fs.AnyPath, array: np.ndarray) -> None:
    """Writes an .npy file whole (atomically, local or gs://)."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    fs.write_bytes(path, buffer.getvalue())


def shard_paths(
    data_dir: str | os.PathLike, split: str, name: str
) -> tuple[fs.AnyPath, fs.AnyPath]:
    """Paths of a shard's token file and index file."""
    split_dir = fs.path(data_dir) / split
    return split_dir / f"{name}.tokens.npy", split_dir / f"{name}.index.npy"


def write_shard(
    data_dir: str | os.PathLike, split: str, name: str, instances: Instances, dtype: np.dtype
) -> dict:
    """Writes one shard (each file whole, atomically: local or gs://); returns its record."""
    tokens_path, index_path = shard_paths(data_dir, split, name)
    tokens = np.asarray(instances.tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(dtype).max):
        raise ValueError(
            f"token ids span [{tokens.min()}, {tokens.max()}], which does not fit the storage "
            f"dtype {dtype}."
        )
    offsets = np.asarray(instances.offsets, dtype=np.int64)
    n = len(offsets) - 1
    index = np.empty((n, INDEX_COLUMNS), dtype=np.int64)  # [n, 4]
    index[:, START] = offsets[:-1]
    index[:, LENGTH] = np.diff(offsets)
    index[:, SEGMENT_B_START] = instances.segment_b_start
    index[:, LABEL] = instances.next_sentence_labels
    _save(tokens_path, tokens.astype(dtype))
    _save(index_path, index)
    return {
        "name": name,
        "num_instances": int(n),
        "num_tokens": int(offsets[-1] - offsets[0]) if n else 0,
        "max_length": int(index[:, LENGTH].max()) if n else 0,
    }


def write_manifest(data_dir: str | os.PathLike, manifest: dict) -> None:
    """Writes manifest.json whole (atomically): a reader sees none or all of it."""
    fs.write_text(
        fs.path(data_dir) / MANIFEST_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    )


def read_manifest(data_dir: str | os.PathLike) -> dict:
    """Reads a prepared directory's manifest; clear errors when it is missing or foreign."""
    path = fs.path(data_dir)
    manifest_path = path / MANIFEST_FILE
    try:
        text = fs.read_text(manifest_path)
    except FileNotFoundError:
        fs.require_bucket(path)
        if not fs.is_dir(path):
            raise FileNotFoundError(
                f"Prepared data directory {str(path)!r} does not exist: {_prepare_hint(path)}."
            ) from None
        raise FileNotFoundError(
            f"{str(manifest_path)!r} is missing: {str(path)!r} was never prepared or its "
            f"preparation did not finish; {_prepare_hint(path)}."
        ) from None
    except (IsADirectoryError, NotADirectoryError):
        raise FileNotFoundError(
            f"Prepared data directory {str(path)!r} is not a directory: {_prepare_hint(path)}."
        ) from None
    manifest = json.loads(text)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{str(manifest_path)!r} has format_version={version!r} but this bertjax reads "
            f"format_version={FORMAT_VERSION}; prepare the data again."
        )
    return manifest


class RemoteTokens:
    """The token files of a split's shards on GCS, read by byte ranges: only what a batch needs.

    Each file's .npy header is read once; `take` fetches each instance's run of tokens (runs
    of a shard that touch, or lie within MERGE_GAP_BYTES, are read as one range: an unshuffled
    pass reads one range per shard and batch), the ranges of one call from all shards
    concurrently. Nothing is cached: a reader holds the batches in flight, whatever the files'
    sizes. `bytes_read`, `held_bytes` (now) and `peak_bytes` (the most held at once by calls
    in progress) let a caller check that.
    """

    HEADER_BYTES = 4096  # numpy pads .npy headers to a multiple of 64 bytes; ours are ~128
    # Runs of one shard closer than this are read as one range: each range is a request, and
    # below a few tens of KiB a request's overhead costs more than the bytes between the runs.
    # A batch of B instances thus reads at most (B - 1) * MERGE_GAP_BYTES beyond its tokens.
    MERGE_GAP_BYTES = 1 << 15

    def __init__(self, paths: Sequence[fs.AnyPath]):
        self.paths = list(paths)
        heads = fs.read_ranges(self.paths, [0] * len(paths), [self.HEADER_BYTES] * len(paths))
        self.offsets = []  # where each file's array bytes begin
        dtypes = set()
        for path, head in zip(self.paths, heads):
            stream = io.BytesIO(head)
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
            else:
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
            if len(shape) != 1 or fortran_order or dtype.hasobject:
                raise ValueError(f"{path}: not a flat token file (shape {shape}, dtype {dtype})")
            self.offsets.append(stream.tell())
            dtypes.add(dtype)
        if len(dtypes) > 1:
            raise ValueError(f"the token files {self.paths} mix dtypes {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop() if dtypes else np.dtype(np.int32)
        self.bytes_read = 0
        self.peak_bytes = 0
        self.held_bytes = 0
        self._lock = threading.Lock()

    def take(self, shard: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        """Tokens ``[starts[i], starts[i] + lengths[i])`` of shard ``shard[i]``, for each i."""
        order = np.lexsort((starts, shard))
        size = self.dtype.itemsize
        gap = self.MERGE_GAP_BYTES // size
        # [shard, begin, end) runs; an instance's run merges into the previous one it touches
        # or nearly touches (within the gap).
        runs: list[list[int]] = []
        run_of = np.empty(len(starts), dtype=np.int64)
        for i in order:
            s, begin, end = int(shard[i]), int(starts[i]), int(starts[i] + lengths[i])
            if runs and runs[-1][0] == s and begin <= runs[-1][2] + gap:
                runs[-1][2] = max(runs[-1][2], end)
            else:
                runs.append([s, begin, end])
            run_of[i] = len(runs) - 1
        wanted = sum(end - begin for _, begin, end in runs) * size
        with self._lock:
            self.held_bytes += wanted
            self.bytes_read += wanted
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        try:
            pieces = fs.read_ranges(
                [self.paths[s] for s, _, _ in runs],
                [self.offsets[s] + begin * size for s, begin, _ in runs],
                [self.offsets[s] + end * size for s, _, end in runs],
            )
            arrays = [np.frombuffer(piece, dtype=self.dtype) for piece in pieces]
            out = []
            for i in range(len(starts)):
                s, begin, _ = runs[run_of[i]]
                at = int(starts[i]) - begin
                out.append(arrays[run_of[i]][at : at + int(lengths[i])])
            return out
        finally:
            with self._lock:
                self.held_bytes -= wanted


def _missing_shard(p) -> str:
    return f"Shard file {str(p)!r} listed in the manifest is missing; prepare the data again."


def _read_remote_index(index_path: fs.AnyPath) -> np.ndarray:
    """A shard's index file from GCS, read whole (it is small: 32 bytes per instance)."""
    try:
        data = fs.read_bytes(index_path)
    except FileNotFoundError:
        raise FileNotFoundError(_missing_shard(index_path)) from None
    return np.load(io.BytesIO(data), allow_pickle=False)  # [n, 4]


class SplitReader:
    """Random access to one split's instances: vectorised gather of padded examples."""

    def __init__(self, data_dir: str | os.PathLike, split: str, shards: Sequence[dict]):
        # Per shard: its memory-mapped token file on disk, None on GCS (read by RemoteTokens).
        self.tokens: list[np.ndarray | None] = []
        index_parts = []
        shard_of = []
        token_paths = []
        for shard_number, record in enumerate(shards):
            tokens_path, index_path = shard_paths(data_dir, split, record["name"])
            token_paths.append(tokens_path)
            if fs.is_remote(tokens_path):
                index = _read_remote_index(index_path)
                self.tokens.append(None)
            else:
                for p in (tokens_path, index_path):
                    if not p.is_file():
                        raise FileNotFoundError(_missing_shard(p))
                self.tokens.append(np.load(tokens_path, mmap_mode="r"))
                index = np.load(index_path)  # [n, 4]: small, so kept in memory
            index_parts.append(index)
            shard_of.append(np.full(len(index), shard_number, dtype=np.int32))
        self.token_paths = token_paths
        self._open_remote()
        if not index_parts:
            index_parts = [np.zeros((0, INDEX_COLUMNS), np.int64)]
        index = np.concatenate(index_parts)  # [N, 4]
        self.shard = np.concatenate(shard_of) if shard_of else np.zeros(0, np.int32)  # [N]
        self.start = index[:, START]  # [N]
        self.length = index[:, LENGTH]  # [N]
        self.segment_b_start = index[:, SEGMENT_B_START]  # [N]
        self.label = index[:, LABEL].astype(np.int32)  # [N]

    def _open_remote(self) -> None:
        """One RemoteTokens over the shards on GCS (``remote``; None when there are none), and
        each shard's place among them (``remote_index``: -1 for a shard on disk)."""
        on_gcs = [s for s, tokens in enumerate(self.tokens) if tokens is None]
        self.remote: RemoteTokens | None = None
        self.remote_index = np.full(len(self.tokens), -1, dtype=np.int64)  # [shards]
        self.remote_index[on_gcs] = np.arange(len(on_gcs))
        if not on_gcs:
            return
        paths = [self.token_paths[s] for s in on_gcs]
        try:
            self.remote = RemoteTokens(paths)
        except FileNotFoundError:
            missing = next((p for p in paths if not fs.is_file(p)), paths[0])
            raise FileNotFoundError(_missing_shard(missing)) from None

    def __len__(self) -> int:
        return len(self.start)

    @classmethod
    def concatenate(cls, readers: Sequence[SplitReader]) -> SplitReader:
        """One reader over the instances of several (the i-th reader's instance j becomes
        ``sum(len(r) for r in readers[:i]) + j``): a batch drawn from several splits is one
        gather, whether they are on disk, on gs://, or some on each."""
        combined = cls.__new__(cls)
        combined.token_paths = [p for reader in readers for p in reader.token_paths]
        combined.tokens = [tokens for reader in readers for tokens in reader.tokens]
        combined._open_remote()
        shard_offsets = np.cumsum([0] + [len(reader.token_paths) for reader in readers])
        combined.shard = np.concatenate(
            [reader.shard + offset for reader, offset in zip(readers, shard_offsets)]
        ).astype(np.int32)  # [N]
        for name in ("start", "length", "segment_b_start", "label"):
            setattr(combined, name, np.concatenate([getattr(r, name) for r in readers]))
        return combined

    def gather(self, indices: np.ndarray, max_seq_length: int) -> dict[str, np.ndarray]:
        """Unmasked padded features of the given instances: [B,S] ids/mask/segments, [B] labels."""
        indices = np.asarray(indices, dtype=np.int64)
        positions = np.arange(max_seq_length)
        length = self.length[indices]  # [B]
        input_mask = positions < length[:, None]  # [B,S]
        shard = self.shard[indices]
        if self.remote is None:
            input_ids = self._take_local(indices, shard, positions)  # [B,S]
        else:
            input_ids = np.zeros(input_mask.shape, dtype=np.int32)  # [B,S]
            on_gcs = self.remote_index[shard] >= 0  # [B]
            if not on_gcs.all():  # a mixture of sources on disk and on gs://
                rows = np.flatnonzero(~on_gcs)
                input_ids[rows] = self._take_local(indices[rows], shard[rows], positions)
            rows = np.flatnonzero(on_gcs)
            if len(rows):
                # The runs themselves, not their padding: nothing past an instance is fetched.
                runs = self.remote.take(
                    self.remote_index[shard[rows]],
                    self.start[indices[rows]],
                    np.minimum(length[rows], max_seq_length),
                )
                for row, run in zip(rows, runs):
                    input_ids[row, : len(run)] = run
        # Zeroes the padding (multiplying is cheaper than assigning through a boolean mask).
        np.multiply(input_ids, input_mask, out=input_ids)
        segment_ids = input_mask & (positions >= self.segment_b_start[indices][:, None])
        return {
            "input_ids": input_ids,
            "input_mask": input_mask.astype(np.int32),
            "segment_ids": segment_ids.astype(np.int32),
            "next_sentence_labels": self.label[indices],
        }

    def _take_local(
        self, indices: np.ndarray, shard: np.ndarray, positions: np.ndarray
    ) -> np.ndarray:
        """[B,S] int32 tokens of the instances from the memory-mapped shards; padding positions
        re-read an instance's last real token (always in range; the caller zeroes them)."""

        def window(rows: np.ndarray) -> np.ndarray:  # [b,S] token numbers within their shard
            length = self.length[rows]
            return self.start[rows][:, None] + np.minimum(positions, length[:, None] - 1)

        if len(indices) and (len(self.tokens) == 1 or shard.min() == shard.max()):
            return self.tokens[int(shard[0])][window(indices)].astype(np.int32)
        # Rows of several shards (a large corpus, or a mixture's sources): grouped by shard by
        # a stable sort, so that each shard's rows are one slice, taken straight into place,
        # and put back in the batch's order (and widened) in one copy; a fancy-indexed copy of
        # each shard's rows in and out costs a third more.
        order = np.argsort(shard, kind="stable")  # [B]
        counts = np.bincount(shard, minlength=len(self.tokens))  # [shards]
        present = np.flatnonzero(counts)
        within = window(indices[order])  # [B,S], in shard order
        dtypes = {self.tokens[s].dtype for s in present}
        grouped = np.empty(within.shape, dtypes.pop() if len(dtypes) == 1 else np.int32)
        begin = 0
        for s in present:
            end = begin + counts[s]
            part = grouped[begin:end]  # [b,S] view
            if part.dtype == self.tokens[s].dtype:
                np.take(self.tokens[s], within[begin:end], mode="clip", out=part)
            else:
                part[...] = np.take(self.tokens[s], within[begin:end], mode="clip")
            begin = end
        input_ids = np.empty(grouped.shape, dtype=np.int32)  # [B,S]
        input_ids[order] = grouped
        return input_ids
