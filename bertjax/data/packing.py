"""Rows of whole documents packed together: the modern recipe's MLM-only pretraining data.

Each document's sentences are joined into one run of tokens, cut into pieces of at most
``max_seq_length - 2`` tokens, and every piece becomes ``[CLS] piece [SEP]``. The pieces are
packed into rows of at most ``max_seq_length`` tokens by best-fit decreasing: longest piece
first (ties in document order), each into the fullest row that still has room for it (ties:
the row opened first), a new row when none has. No randomness is involved: a row set is a
pure function of the documents, which keeps prepare's shards byte-identical over any number
of processes.

Rows are stored as instances (bertjax.data.storage) whose segment B starts past their end
(segment_ids all 0) and whose label is 0; every document piece starts with [CLS], which text
never produces, so the loader recovers each token's document and its position within it from
the tokens alone (`document_features`), without storing more than today's shards.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from bertjax.data.instances import Instances, empty_instances

LAYOUTS = ("pairs", "packed")


def document_pieces(
    documents: Sequence[Sequence[np.ndarray]], max_seq_length: int
) -> list[np.ndarray]:
    """Each document's tokens (its sentences joined) cut into pieces of at most
    max_seq_length - 2 tokens, in order; empty documents give none."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS] x [SEP]")
    room = max_seq_length - 2
    pieces = []
    for document in documents:
        sentences = [np.asarray(s, dtype=np.int32) for s in document if len(s)]
        if not sentences:
            continue
        tokens = np.concatenate(sentences)
        pieces.extend(tokens[start : start + room] for start in range(0, len(tokens), room))
    return pieces


def best_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing bin packing: for each row, the indices of the items it holds.

    Items go longest first (ties in input order), each into the row with the least room left
    that still fits it (ties: the row opened first), or into a new row when none fits; within
    a row, items keep the order they were placed in.
    """
    lengths = [int(n) for n in lengths]
    if any(not 0 < n <= capacity for n in lengths):
        raise ValueError(f"every length must lie in [1, {capacity}], got {lengths}")
    # by_room[r]: the open rows with exactly r slots left, by row index (oldest first).
    by_room: list[list[int]] = [[] for _ in range(capacity + 1)]
    rows: list[list[int]] = []
    room: list[int] = []
    for item in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[item]
        left = next((r for r in range(n, capacity) if by_room[r]), None)
        if left is None:
            row = len(rows)
            rows.append([])
            room.append(capacity)
        else:
            row = by_room[left].pop(0)
        rows[row].append(item)
        room[row] -= n
        if room[row]:
            bisect.insort(by_room[room[row]], row)
    return rows


def pack_documents(
    documents: Sequence[Sequence[np.ndarray]], max_seq_length: int, cls_id: int, sep_id: int
) -> Instances:
    """Documents (lists of int32 sentences) as packed rows "[CLS] d1 [SEP] [CLS] d2 [SEP] ..."."""
    pieces = document_pieces(documents, max_seq_length)
    if not pieces:
        return empty_instances()
    rows = best_fit([len(p) + 2 for p in pieces], max_seq_length)
    parts = []
    for row in rows:
        for item in row:
            parts += [[cls_id], pieces[item], [sep_id]]
    tokens = np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])
    lengths = np.array([sum(len(pieces[i]) + 2 for i in row) for row in rows], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Instances(
        tokens=tokens,
        offsets=offsets,
        # Segment B starts past every row's end: all tokens are segment 0.
        segment_b_start=np.full(len(rows), max_seq_length, dtype=np.int32),
        next_sentence_labels=np.zeros(len(rows), dtype=np.int32),
    )


def efficiency(num_tokens: int, num_rows: int, max_seq_length: int) -> float:
    """Real tokens (specials included) per token slot of the rows."""
    return num_tokens / (num_rows * max_seq_length) if num_rows else 0.0


def document_features(
    input_ids: np.ndarray, input_mask: np.ndarray, cls_id: int
) -> dict[str, np.ndarray]:
    """Per-token document_ids (1.. per document in the row, 0 for padding) and positions
    (restarting at 0 at each document's [CLS], 0 for padding) of packed rows [B, S]."""
    real = np.asarray(input_mask).astype(bool)  # [B,S]
    starts = (np.asarray(input_ids) == cls_id) & real  # [B,S]
    document_ids = np.where(real, np.cumsum(starts, axis=1), 0)  # [B,S]
    index = np.arange(real.shape[1])[None, :]  # [1,S]
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)  # [B,S]
    positions = np.where(real, index - first, 0)  # [B,S]
    return {
        "document_ids": document_ids.astype(np.int32),
        "positions": positions.astype(np.int32),
    }
