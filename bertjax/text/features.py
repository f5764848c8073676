"""Text to model inputs: single texts and pairs, truncation, length buckets.

`encode(tokenizer, texts, pairs, max_length)` gives google-research/bert's input arrays
(input_ids with [CLS] A [SEP] (B [SEP]), input_mask, segment_ids) for any tokenizer; pairs
longer than max_length lose tokens from the longer text first, as google's
run_classifier.py. `inputs` gives the same per example, unpadded, for callers that batch by
length (`length_bucket`). `offsets` maps each token back to the characters it came from;
words to sub-word positions (word ids) are `bertjax.tasks.labels.model.encode_words`. No model
is needed to encode text: bertjax.inference and the fine-tuning readers both come here.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertjax.text.tokenizer import MASK, Tokenizer

# Google's names of the three input arrays, in the order the encoder takes them.
INPUT_FEATURES = ("input_ids", "input_mask", "segment_ids")


class InputError(ValueError):
    """Text that cannot become model inputs; the message says which text and why.

    A fault of one text also carries its position among the texts (`index`), which one
    (`what`: "text", "text pair") and what is wrong with it (`problem`), so that a file's
    reader can name the file and line instead.
    """

    def __init__(self, message: str, index: int | None = None, what: str = "", problem: str = ""):
        super().__init__(message)
        self.index = index
        self.what = what
        self.problem = problem


class TruncationWarning(UserWarning):
    """Some texts were longer than the model's positions and were cut."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One model input: token ids with [CLS]/[SEP], and their segment ids."""

    ids: list[int]
    segments: list[int]

    def features(self) -> dict[str, np.ndarray]:
        """input_ids and segment_ids as int32 arrays (the mask follows from the length)."""
        return {
            "input_ids": np.asarray(self.ids, np.int32),
            "segment_ids": np.asarray(self.segments, np.int32),
        }


def as_texts(value: Any, name: str) -> list[str]:
    """A str or a sequence of str as a non-empty list, or InputError saying what is wrong."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, bytearray)):
        raise InputError(f"{name} is bytes; decode it to str first (e.g. .decode('utf-8'))")
    if not isinstance(value, Sequence):
        raise InputError(f"{name} must be a str or a list of str, got {type(value).__name__}")
    texts = list(value)
    if not texts:
        raise InputError(f"{name} is an empty list; give at least one text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"{name}[{i}] is of type {type(text).__name__}, not str")
    return texts


def which(index: int, count: int, what: str) -> str:
    """How a message names one of `count` inputs."""
    return f"the {what}" if count == 1 else f"{what} {index}"


def truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """google-research/bert's _truncate_seq_pair: drop the longer text's last token until
    both fit in `budget` (b's when they are as long)."""
    a_len, b_len = len(a), len(b)
    while a_len + b_len > budget:
        if a_len > b_len:
            a_len -= 1
        else:
            b_len -= 1
    return a[:a_len], b[:b_len]


def token_ids(tokenizer: Tokenizer, texts: list[str], what: str) -> list[list[int]]:
    """Each text's token ids (special pieces typed in the text count); empty texts fail."""
    for i, text in enumerate(texts):
        if not text.strip():
            problem = "is empty; every text needs some words"
            raise InputError(f"{which(i, len(texts), what)} {problem}", i, what, problem)
    encoded = tokenizer.encode_batch(texts, special_tokens_in_text=True)
    for i, ids in enumerate(encoded):
        if not ids:
            problem = (
                f"({texts[i][:40]!r}) has no tokens: the tokenizer drops all of it (control "
                "characters only?)"
            )
            raise InputError(f"{which(i, len(texts), what)} {problem}", i, what, problem)
    return encoded


def inputs(
    tokenizer: Tokenizer,
    texts: list[str],
    pairs: list[str] | None,
    max_length: int,
    *,
    limit: int | None = None,
    need_mask: bool = False,
) -> list[Example]:
    """One Example per text (and pair), cut to max_length; warns (TruncationWarning) when
    any was cut. `limit`: the model's positions, for the messages (default max_length).
    `need_mask`: every text must keep a [MASK] (fill-mask)."""
    limit = max_length if limit is None else limit
    needed = 2 if pairs is None else 3
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        raise InputError(f"max_length={max_length!r} is invalid: must be an int")
    if not needed < max_length <= limit:
        raise InputError(
            f"max_length={max_length} is invalid: must be in [{needed + 1}, {limit}] (the "
            f"model has {limit} positions; {needed} go to [CLS] and [SEP])"
        )
    first = token_ids(tokenizer, texts, "text")
    second = None if pairs is None else token_ids(tokenizer, pairs, "text pair")
    if need_mask:
        for i, ids in enumerate(first):
            if tokenizer.mask_id not in ids:
                raise InputError(
                    f"{which(i, len(texts), 'text')} has no {MASK}: write {MASK} where a "
                    f"token should be predicted, e.g. 'Paris is the {MASK} of France.'"
                )
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    examples, cut = [], []
    for i, a in enumerate(first):
        if second is None:
            kept_a, kept_b = a[: max_length - 2], None
        else:
            kept_a, kept_b = truncate_pair(a, second[i], max_length - 3)
        if len(kept_a) < len(a) or (kept_b is not None and len(kept_b) < len(second[i])):
            cut.append(i)
        ids = [cls_id, *kept_a, sep_id]
        segments = [0] * len(ids)
        if kept_b is not None:
            ids += [*kept_b, sep_id]
            segments += [1] * (len(kept_b) + 1)
        if need_mask and tokenizer.mask_id not in ids:
            raise InputError(
                f"{which(i, len(texts), 'text')} has its {MASK} beyond the model's "
                f"{max_length} positions; shorten the text before the {MASK}"
            )
        examples.append(Example(ids, segments))
    if cut:
        what = which(cut[0], len(texts), "text")
        if len(cut) > 1:
            what = f"{len(cut)} of {len(texts)} texts (the first: {what}) are"
        else:
            what += " is"
        warnings.warn(
            f"{what} longer than the limit of {max_length} tokens ([CLS] and [SEP] "
            f"included; the model has {limit} positions) and cut to it",
            TruncationWarning,
            stacklevel=4,
        )
    return examples


def stack(examples: list[Example], width: int | None = None) -> dict[str, np.ndarray]:
    """int32 [n, width] input arrays of examples, zero-padded (width: the longest)."""
    width = max(len(e.ids) for e in examples) if width is None else width
    out = {name: np.zeros((len(examples), width), np.int32) for name in INPUT_FEATURES}
    for row, example in enumerate(examples):
        n = len(example.ids)
        out["input_ids"][row, :n] = example.ids
        out["input_mask"][row, :n] = 1
        out["segment_ids"][row, :n] = example.segments
    return out


def encode(
    tokenizer: Tokenizer,
    texts: str | Sequence[str],
    text_pairs: str | Sequence[str] | None,
    max_length: int,
    *,
    limit: int | None = None,
) -> dict[str, np.ndarray]:
    """The model's inputs for texts (and pairs): int32 [n, longest] arrays (see `inputs`)."""
    texts = as_texts(texts, "texts")
    pairs = None if text_pairs is None else as_texts(text_pairs, "text_pairs")
    if pairs is not None and len(pairs) != len(texts):
        raise InputError(
            f"text_pairs has {len(pairs)} texts but texts has {len(texts)}; give one pair per text"
        )
    return stack(inputs(tokenizer, texts, pairs, max_length, limit=limit))


def offsets(tokenizer: Tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Each text's [tokens, 2] int32 character offsets: token k of
    `tokenizer.encode_batch([text])[0]` came from text[start:end] (start == end for a piece
    that covers no character of its own, e.g. the leading bytes of a byte-fallback character).
    For both tokenizers, so that a span of tokens maps back to the text (question answering).
    """
    return [
        np.asarray(spans, np.int32).reshape(len(ids), 2)  # [tokens, 2]
        for ids, spans in tokenizer.encode_with_offsets(list(texts))
    ]


def length_bucket(longest: int, bucket: int, max_length: int) -> int:
    """Positions a batch whose longest example has `longest` tokens is cut to: the smallest
    multiple of `bucket` that holds it (max_length without a bucket, or at most)."""
    if bucket == 0:
        return max_length
    return min(max_length, -(-longest // bucket) * bucket)


def fewest_widths(
    lengths: np.ndarray,
    multiple: int,
    limit: int,
    overhead: float,
    counts: np.ndarray | None = None,
    program_positions: float = 0.0,
) -> tuple[int, ...]:
    """The fewest widths that hold items of `lengths` tokens with little padding: each
    width a multiple of `multiple` (or `limit`), each item cut to the smallest width that
    holds it, all of them costing at most `overhead` (a fraction) more positions than
    cutting each item to its own multiple would. `counts`: how many rows each item stands
    for (default one each). One width is one compiled program, so a run that cuts its
    batches to these widths compiles few programs and pays little padding for it.
    `program_positions`: what compiling one program costs, in positions computed; widths
    are added only while each saves at least that many (so over `overhead` where programs
    cost more than the padding they save).

    Exact, by dynamic programming over the multiples the items need (an optimal set of
    widths uses only those: a width between two of them could drop to the lower one).
    """
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        return (limit,)
    counts = np.ones(len(lengths)) if counts is None else np.asarray(counts, np.float64)
    needed = np.minimum(limit, -(-lengths // multiple) * multiple)  # each item's own multiple
    candidates, at = np.unique(needed, return_inverse=True)
    rows = np.bincount(at, weights=counts, minlength=len(candidates))  # rows per candidate
    finest = float(rows @ candidates)
    budget = finest * (1.0 + overhead)
    m = len(candidates)
    # Rows of the candidates before each one: a group of candidates i+1..j holds
    # prefix[j+1] - prefix[i+1] rows.
    prefix = np.concatenate([[0.0], np.cumsum(rows)])
    # cost[j]: the fewest positions for candidates 0..j with at most k widths, the widest
    # candidates[j]; parents[k-1][j]: the widest of the widths below (-1: none).
    cost = candidates * prefix[1:]
    parents = [np.full(m, -1)]
    while cost[-1] > budget and len(parents) < m:  # m widths: the finest, within budget
        parent = parents[-1].copy()
        extended = cost.copy()
        for j in range(1, m):
            # The widest group takes candidates i+1..j at candidates[j], the rest as before.
            split = cost[:j] + candidates[j] * (prefix[j + 1] - prefix[1 : j + 1])
            i = int(np.argmin(split))
            if split[i] < extended[j]:
                extended[j], parent[j] = split[i], i
        if cost[-1] - extended[-1] < program_positions:
            break  # one more program would cost more than the positions it saves
        cost = extended
        parents.append(parent)
    widths, j = [], m - 1
    for parent in reversed(parents):
        if j < 0:
            break
        widths.append(int(candidates[j]))
        j = int(parent[j])
    return tuple(sorted(widths))
