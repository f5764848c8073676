"""Padded token batches for the encoders' tests: a [CLS] first, random word ids, an optional
[SEP] last, then padding."""

import numpy as np


def padded_batch(
    lengths,
    seq: int,
    *,
    vocab_size: int,
    first_word: int,
    cls_id: int | None,
    sep_id: int | None = None,
    pad_id: int = 0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask), int32 [len(lengths), seq]: row b holds lengths[b] real tokens, random ids
    in [first_word, vocab_size), with `cls_id` first and `sep_id` last where given."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)  # [b, s]
    ids = rng.integers(first_word, vocab_size, mask.shape)  # [b, s]
    if cls_id is not None:
        ids[:, 0] = cls_id
    if sep_id is not None:
        ids[np.arange(len(lengths)), lengths - 1] = sep_id
    return np.where(mask == 1, ids, pad_id).astype(np.int32), mask


def second_segment(mask: np.ndarray, start: int) -> np.ndarray:
    """Token types of a pair whose second segment starts at position `start`, within `mask`."""
    return (np.arange(mask.shape[1])[None] >= start).astype(np.int32) * mask  # [b, s]
