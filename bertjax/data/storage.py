"""On-disk format of prepared instances: memory-mappable shards plus a manifest.

A prepared directory holds::

    tokenizer.model                     the sentencepiece model the ids come from
    manifest.json                       written last: its presence marks a finished prepare
    <split>/shard-NNNNN.tokens.npy      flat token ids of the shard's instances (uint16 or int32)
    <split>/shard-NNNNN.index.npy       int64 [n, 4]: start, length, segment_b_start, label

Instance ``i`` of a shard is ``tokens[start:start + length]`` = "[CLS] A [SEP] B [SEP]";
segment 1 begins at ``segment_b_start``. Both files open with ``np.load(mmap_mode="r")``,
so readers touch only the pages they gather from.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from bertjax.data.instances import Instances

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
SPLITS = ("train", "eval")

# Columns of a shard's index file.
START, LENGTH, SEGMENT_B_START, LABEL = range(4)
INDEX_COLUMNS = 4


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest storage dtype for ids of this vocabulary: uint16 when it fits."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def _prepare_hint(path: pathlib.Path) -> str:
    return (
        f"run `python -m bertjax.data.prepare --input <corpus files> --output {path}` "
        "(or bertjax.data.prepare(...)) to create it"
    )


def _save_atomic(path: pathlib.Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)


def shard_paths(
    data_dir: str | os.PathLike, split: str, name: str
) -> tuple[pathlib.Path, pathlib.Path]:
    """Paths of a shard's token file and index file."""
    split_dir = pathlib.Path(data_dir) / split
    return split_dir / f"{name}.tokens.npy", split_dir / f"{name}.index.npy"


def write_shard(
    data_dir: str | os.PathLike, split: str, name: str, instances: Instances, dtype: np.dtype
) -> dict:
    """Writes one shard (each file under a temporary name, then renamed); returns its record."""
    tokens_path, index_path = shard_paths(data_dir, split, name)
    tokens_path.parent.mkdir(parents=True, exist_ok=True)
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
    _save_atomic(tokens_path, tokens.astype(dtype))
    _save_atomic(index_path, index)
    return {
        "name": name,
        "num_instances": int(n),
        "num_tokens": int(offsets[-1] - offsets[0]) if n else 0,
        "max_length": int(index[:, LENGTH].max()) if n else 0,
    }


def write_manifest(data_dir: str | os.PathLike, manifest: dict) -> None:
    """Writes manifest.json under a temporary name and renames it into place."""
    path = pathlib.Path(data_dir) / MANIFEST_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_manifest(data_dir: str | os.PathLike) -> dict:
    """Reads a prepared directory's manifest; clear errors when it is missing or foreign."""
    path = pathlib.Path(data_dir)
    if not path.is_dir():
        raise FileNotFoundError(
            f"Prepared data directory {str(path)!r} does not exist: {_prepare_hint(path)}."
        )
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{str(manifest_path)!r} is missing: {str(path)!r} was never prepared or its "
            f"preparation did not finish; {_prepare_hint(path)}."
        )
    manifest = json.loads(manifest_path.read_text())
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{str(manifest_path)!r} has format_version={version!r} but this bertjax reads "
            f"format_version={FORMAT_VERSION}; prepare the data again."
        )
    return manifest


class SplitReader:
    """Random access to one split's instances: vectorised gather of padded examples."""

    def __init__(self, data_dir: str | os.PathLike, split: str, shards: Sequence[dict]):
        self.tokens = []
        index_parts = []
        shard_of = []
        for shard_number, record in enumerate(shards):
            tokens_path, index_path = shard_paths(data_dir, split, record["name"])
            for p in (tokens_path, index_path):
                if not p.is_file():
                    raise FileNotFoundError(
                        f"Shard file {str(p)!r} listed in the manifest is missing; prepare "
                        "the data again."
                    )
            self.tokens.append(np.load(tokens_path, mmap_mode="r"))
            index = np.load(index_path)  # [n, 4]: small, so kept in memory
            index_parts.append(index)
            shard_of.append(np.full(len(index), shard_number, dtype=np.int32))
        if not index_parts:
            index_parts = [np.zeros((0, INDEX_COLUMNS), np.int64)]
        index = np.concatenate(index_parts)  # [N, 4]
        self.shard = np.concatenate(shard_of) if shard_of else np.zeros(0, np.int32)  # [N]
        self.start = index[:, START]  # [N]
        self.length = index[:, LENGTH]  # [N]
        self.segment_b_start = index[:, SEGMENT_B_START]  # [N]
        self.label = index[:, LABEL].astype(np.int32)  # [N]

    def __len__(self) -> int:
        return len(self.start)

    def gather(self, indices: np.ndarray, max_seq_length: int) -> dict[str, np.ndarray]:
        """Unmasked padded features of the given instances: [B,S] ids/mask/segments, [B] labels."""
        indices = np.asarray(indices, dtype=np.int64)
        positions = np.arange(max_seq_length)
        length = self.length[indices]  # [B]
        input_mask = positions < length[:, None]  # [B,S]
        # Padding positions re-read the last real token (always in range) and are zeroed below.
        within = self.start[indices][:, None] + np.minimum(positions, length[:, None] - 1)  # [B,S]
        shard = self.shard[indices]
        if len(self.tokens) == 1:
            input_ids = self.tokens[0][within].astype(np.int32)  # [B,S]
        else:
            input_ids = np.empty(within.shape, dtype=np.int32)  # [B,S]
            for s in np.unique(shard):
                rows = shard == s
                input_ids[rows] = self.tokens[s][within[rows]]
        input_ids[~input_mask] = 0
        segment_ids = input_mask & (positions >= self.segment_b_start[indices][:, None])
        return {
            "input_ids": input_ids,
            "input_mask": input_mask.astype(np.int32),
            "segment_ids": segment_ids.astype(np.int32),
            "next_sentence_labels": self.label[indices],
        }
