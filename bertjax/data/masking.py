"""Dynamic masked-LM masking of a batch, vectorised with numpy.

Follows google-research/bert's ``create_masked_lm_predictions``: a sequence of ``n`` real
tokens (special tokens included in ``n``) gets
``min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))`` predictions; special
tokens and padding are never chosen; each chosen position becomes [MASK] with probability
0.8, a random non-special token with probability 0.1 and stays itself otherwise. Masking is
a pure function of ``(input_ids, input_mask, rng)``. The loader passes a ``RowRandom``
keyed by each example's global position, so an example is masked the same way whichever
process, batch split or worker count draws it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective uint64 hash with good avalanche."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class RowRandom:
    """Counter-based random numbers with an independent stream per batch row.

    Draw ``d``, column ``j`` of row ``i`` is a hash of ``(row_keys[i], d, j)``: vectorised,
    and independent of which other rows share the batch. Offers the two methods of
    ``np.random.Generator`` that masking uses, with the batch as the first dimension.
    """

    def __init__(self, row_keys: np.ndarray):
        self._keys = _mix64(np.asarray(row_keys, dtype=np.uint64))  # [B]
        self._draws = 0

    @classmethod
    def from_positions(cls, seed: int, stream: int, epoch: int, positions: np.ndarray) -> RowRandom:
        """Streams keyed by ``(seed, stream, epoch, position)`` for each row's global position."""
        base = np.random.SeedSequence([seed, stream, epoch]).generate_state(1, np.uint64)  # [1]
        with np.errstate(over="ignore"):
            return cls(_mix64(base + np.asarray(positions, dtype=np.uint64) * _GOLDEN))

    def _bits(self, shape: tuple[int, ...]) -> np.ndarray:
        batch, width = shape
        if batch != len(self._keys):
            raise ValueError(f"RowRandom has {len(self._keys)} rows, asked for {batch}")
        self._draws += 1
        with np.errstate(over="ignore"):
            draw_key = self._keys ^ _mix64(np.array([self._draws], dtype=np.uint64))  # [B]
            counters = draw_key[:, None] + np.arange(width, dtype=np.uint64)[None, :] * _GOLDEN
        return _mix64(counters)  # [B,W]

    def random(self, shape: tuple[int, int]) -> np.ndarray:
        """Uniform float64 in [0, 1), shape [B, W]."""
        return (self._bits(shape) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def integers(self, low: int, high: int, size: tuple[int, int]) -> np.ndarray:
        """Uniform int64 in [low, high), shape [B, W]."""
        return low + (self.random(size) * (high - low)).astype(np.int64)


# Probabilities of the three fates of a chosen position (google's 80/10/10).
MASK_TOKEN_PROB = 0.8
RANDOM_TOKEN_PROB = 0.1


@dataclasses.dataclass(frozen=True)
class MaskingSettings:
    """How many positions to predict and how to pick them."""

    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_masking: bool = False
    # The fates of a chosen position: [MASK] with mask_token_prob, a random non-special token
    # with random_token_prob, itself otherwise (google's BERT 0.8/0.1; ELECTRA's 0.85/0).
    mask_token_prob: float = MASK_TOKEN_PROB
    random_token_prob: float = RANDOM_TOKEN_PROB

    def __post_init__(self):
        fates = (self.mask_token_prob, self.random_token_prob)
        if not all(0.0 <= p <= 1.0 for p in fates) or sum(fates) > 1.0:
            raise ValueError(
                f"mask_token_prob={self.mask_token_prob!r} and random_token_prob="
                f"{self.random_token_prob!r} are invalid: each must lie in [0, 1], their sum "
                "at most 1."
            )
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ValueError(
                f"masked_lm_prob={self.masked_lm_prob!r} is invalid: it must lie in (0, 1]."
            )
        if not isinstance(self.max_predictions_per_seq, int) or self.max_predictions_per_seq < 1:
            raise ValueError(
                f"max_predictions_per_seq={self.max_predictions_per_seq!r} is invalid: "
                "it must be a positive integer."
            )


def num_to_predict(lengths: np.ndarray, settings: MaskingSettings) -> np.ndarray:
    """Google's prediction count per sequence from its real length (specials included)."""
    # np.rint rounds half to even, exactly like Python's round() in google's code.
    wanted = np.rint(lengths * settings.masked_lm_prob).astype(np.int64)
    return np.minimum(settings.max_predictions_per_seq, np.maximum(1, wanted))


def _choose_tokens(
    candidate: np.ndarray, k: np.ndarray, rng: np.random.Generator | RowRandom, width: int
) -> np.ndarray:
    """Chooses min(k_i, candidates_i) random candidate positions per row; bool [B,S]."""
    batch, seq = candidate.shape
    keys = rng.random((batch, seq))  # [B,S]
    keys[~candidate] = np.inf
    if width < seq:
        # Only the `width` smallest keys can ever be chosen since k <= width.
        top = np.argpartition(keys, width - 1, axis=1)[:, :width]  # [B,W]
    else:
        top = np.broadcast_to(np.arange(seq), (batch, seq))  # [B,S]
    order = np.argsort(np.take_along_axis(keys, top, axis=1), axis=1)
    top = np.take_along_axis(top, order, axis=1)  # [B,W] positions by ascending key
    n_candidates = candidate.sum(axis=1)
    take = np.arange(top.shape[1]) < np.minimum(k, n_candidates)[:, None]  # [B,W]
    chosen = np.zeros((batch, seq), dtype=bool)
    np.put_along_axis(chosen, top, take, axis=1)
    return chosen


def _choose_words(
    input_ids: np.ndarray,
    candidate: np.ndarray,
    k: np.ndarray,
    rng: np.random.Generator | RowRandom,
    is_word_start: np.ndarray,
) -> np.ndarray:
    """Whole-word choice (google's wwm): shuffled words added while they fit in k; bool [B,S]."""
    batch, seq = candidate.shape
    previous_candidate = np.zeros_like(candidate)
    previous_candidate[:, 1:] = candidate[:, :-1]
    # A piece after a special token starts a word even without a word-start marker.
    starts = candidate & (is_word_start[input_ids] | ~previous_candidate)  # [B,S]
    word_of_piece = np.cumsum(starts, axis=1) - 1  # [B,S] word slot of each piece
    n_words = starts.sum(axis=1)

    rows = np.arange(batch)[:, None]
    flat_word = (rows * seq + word_of_piece)[candidate]
    word_length = np.bincount(flat_word, minlength=batch * seq).reshape(batch, seq)  # [B,S]

    keys = rng.random((batch, seq))  # [B,S] one random key per word slot
    keys[np.arange(seq) >= n_words[:, None]] = np.inf
    order = np.argsort(keys, axis=1)  # [B,S] word slots in shuffled order
    length_in_order = np.take_along_axis(word_length, order, axis=1)  # [B,S]

    # Words are taken in shuffled order until the first that would overflow k: a prefix
    # found with one cumulative sum.
    cumulative = np.cumsum(length_in_order, axis=1)  # [B,S]
    take = cumulative <= k[:, None]  # [B,S]
    first_overflow = take.sum(axis=1)  # prefix is contiguous since lengths are >= 0
    count = np.where(
        first_overflow > 0, cumulative[np.arange(batch), np.maximum(first_overflow - 1, 0)], 0
    )
    take &= np.arange(seq) < first_overflow[:, None]
    # Google skips a word that would overflow and goes on with the next ones; that part is
    # sequential per row, so walk the remaining ranks for all rows at once. Rows stop
    # mattering once full, so this usually ends after a few ranks.
    active = (count < k) & (first_overflow < n_words)
    if active.any():
        for rank in range(int(first_overflow[active].min()), int(n_words[active].max())):
            open_rows = active & (rank >= first_overflow) & (count < k) & (rank < n_words)
            length = length_in_order[:, rank]
            fits = open_rows & (count + length <= k)
            take[:, rank] |= fits
            count = count + np.where(fits, length, 0)
            if not (active & (count < k) & (rank + 1 < n_words)).any():
                break

    word_taken = np.zeros((batch, seq), dtype=bool)
    np.put_along_axis(word_taken, order, take, axis=1)
    return candidate & np.take_along_axis(word_taken, np.maximum(word_of_piece, 0), axis=1)


def mask_batch(
    input_ids: np.ndarray,
    input_mask: np.ndarray,
    rng: np.random.Generator | RowRandom,
    settings: MaskingSettings,
    *,
    vocab_size: int,
    special_ids: Sequence[int],
    mask_id: int,
    is_word_start: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Masks a batch; returns the masked input_ids [B,S] and the masked_lm_* features [B,P]."""
    input_ids = np.asarray(input_ids)
    input_mask = np.asarray(input_mask).astype(bool)
    if input_ids.ndim != 2 or input_ids.shape != input_mask.shape:
        raise ValueError(
            f"input_ids shape {input_ids.shape} and input_mask shape {input_mask.shape} must "
            "be the same [batch, seq] shape."
        )
    if settings.whole_word_masking and is_word_start is None:
        raise ValueError("whole_word_masking=True needs is_word_start (bool [vocab_size]).")
    batch, seq = input_ids.shape
    width = settings.max_predictions_per_seq

    is_special = np.zeros(vocab_size, dtype=bool)
    is_special[np.asarray(special_ids, dtype=np.int64)] = True
    candidate = input_mask & ~is_special[input_ids]  # [B,S]
    k = num_to_predict(input_mask.sum(axis=1), settings)  # [B]

    if settings.whole_word_masking:
        word_start = np.asarray(is_word_start, dtype=bool)
        chosen = _choose_words(input_ids, candidate, k, rng, word_start)
    else:
        chosen = _choose_tokens(candidate, k, rng, min(width, seq))

    # Chosen positions first, in ascending order (stable sort of the "not chosen" flag).
    positions = np.argsort(~chosen, axis=1, kind="stable")[:, : min(width, seq)]  # [B,W]
    n_chosen = chosen.sum(axis=1)
    valid = np.arange(positions.shape[1]) < n_chosen[:, None]  # [B,W]
    if positions.shape[1] < width:
        pad = width - positions.shape[1]
        positions = np.pad(positions, ((0, 0), (0, pad)))  # [B,P]
        valid = np.pad(valid, ((0, 0), (0, pad)))  # [B,P]
    positions = np.where(valid, positions, 0)
    original = np.where(valid, np.take_along_axis(input_ids, positions, axis=1), 0)  # [B,P]

    # The fate of every chosen position is drawn independently (google decides per token).
    fate = rng.random((batch, width))  # [B,P]
    non_special = np.flatnonzero(~is_special)
    random_tokens = non_special[rng.integers(0, len(non_special), size=(batch, width))]
    mask_prob, random_prob = settings.mask_token_prob, settings.random_token_prob
    replacement = np.where(
        fate < mask_prob,
        mask_id,
        np.where(fate < mask_prob + random_prob, random_tokens, original),
    )

    masked_ids = input_ids.astype(np.int32, copy=True)
    row_index = np.broadcast_to(np.arange(batch)[:, None], positions.shape)
    masked_ids[row_index[valid], positions[valid]] = replacement[valid]
    return {
        "input_ids": masked_ids,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": original.astype(np.int32),
        "masked_lm_weights": valid.astype(np.float32),
    }
