"""Pretraining instances "[CLS] A [SEP] B [SEP]" with google-research/bert's semantics.

The algorithm is create_pretraining_data.py's create_instances_from_document, computed on
int32 arrays without a per-token loop:

- Per document, the target length is max_seq_length - 3, or with probability short_seq_prob a
  random length in [2, max_seq_length - 3].
- Whole sentences accumulate into a chunk until the target is reached or the document ends.
- A is the chunk's first a_end sentences, a_end ~ U{1..len(chunk) - 1} (1 for a single-sentence
  chunk).
- NSP: with probability 0.5, or always when the chunk has one sentence, B is a span from a random
  *other* document (label 1): from a random sentence on, until B reaches target - len(A) tokens;
  the chunk's unused sentences are put back. Otherwise B is the rest of the chunk (label 0).
- SOP (ALBERT): B is always the rest of the chunk, and with probability 0.5 A and B are swapped
  (label 1). A chunk is only closed once it has two sentences, so that B exists; a lone last
  sentence of a document yields no instance.
- The pair is truncated to max_seq_length - 3 tokens, one token at a time from the longer side
  (B on ties), from its front or back with probability 0.5 each. The number of removals from
  each side is fixed by the lengths, so the front removals are drawn as Binomial(n, 0.5).
- dupe_factor passes over all documents with fresh randomness, then all instances are shuffled.

Deviation from google (documented): a random B never comes from A's own document. Google draws
up to 10 times and may fall back to the same document. With a single document in the pool, a
multi-sentence chunk uses its actual continuation (label 0) and a single-sentence chunk is
skipped.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from bertjax.text.tokenizer import Tokenizer

TASKS = ("nsp", "sop")


@dataclasses.dataclass(frozen=True)
class InstanceSettings:
    """How instances are cut from documents."""

    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    task: str = "nsp"  # "nsp" (next-sentence prediction) | "sop" (sentence-order prediction)

    def __post_init__(self):
        if self.max_seq_length < 5:
            raise ValueError(
                f"InstanceSettings.max_seq_length={self.max_seq_length} is too small; it must be "
                ">= 5 ([CLS] A [SEP] B [SEP] with one token each in A and B)"
            )
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(
                f"InstanceSettings.short_seq_prob={self.short_seq_prob} must be in [0, 1]"
            )
        if self.dupe_factor < 1:
            raise ValueError(f"InstanceSettings.dupe_factor={self.dupe_factor} must be >= 1")
        if self.task not in TASKS:
            raise ValueError(
                f"InstanceSettings.task={self.task!r} is not valid; choose one of {TASKS}"
            )


class Instances(NamedTuple):
    """A batch of variable-length instances in flat (ragged) form."""

    tokens: np.ndarray  # int32 [total_tokens]: "[CLS] A [SEP] B [SEP]" of each instance
    offsets: np.ndarray  # int64 [n + 1]: instance i is tokens[offsets[i]:offsets[i + 1]]
    segment_b_start: np.ndarray  # int32 [n]: index in the instance of B's first token
    next_sentence_labels: np.ndarray  # int32 [n]: 1 = random next (nsp) or swapped (sop)

    @property
    def num_instances(self) -> int:
        """How many instances (len() stays the tuple's length, 4)."""
        return len(self.segment_b_start)

    def instance(self, i: int) -> np.ndarray:
        """Token ids of instance i."""
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def segment_ids(self, i: int) -> np.ndarray:
        """Segment ids of instance i: 0 for [CLS] A [SEP], 1 for B [SEP]."""
        length = int(self.offsets[i + 1] - self.offsets[i])
        return (np.arange(length) >= self.segment_b_start[i]).astype(np.int32)  # [length]


def empty_instances() -> Instances:
    """Zero instances."""
    return Instances(
        tokens=np.zeros(0, np.int32),
        offsets=np.zeros(1, np.int64),
        segment_b_start=np.zeros(0, np.int32),
        next_sentence_labels=np.zeros(0, np.int32),
    )


def _ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(starts[i], starts[i] + lengths[i]) over i."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    # Each position's source = its run's start + its offset within the run.
    shift = np.repeat(starts - (ends - lengths), lengths)  # [total]
    return shift + np.arange(total, dtype=np.int64)


def _removals(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """How many tokens google's truncate_seq_pair takes from A and from B."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    gap = abs(len_a - len_b)
    if excess <= gap:
        return (excess, 0) if len_a > len_b else (0, excess)
    # After the lengths meet, removals alternate, starting with B (B is cut on ties).
    rest = excess - gap
    from_a = rest // 2 + (gap if len_a > len_b else 0)
    from_b = (rest + 1) // 2 + (gap if len_b > len_a else 0)
    return from_a, from_b


class _Corpus:
    """All sentences flattened: one token array, sentence bounds per document."""

    def __init__(self, documents: Sequence[Sequence[np.ndarray]]):
        pieces: list[np.ndarray] = []
        lengths: list[int] = []
        doc_sentences: list[int] = []
        for document in documents:
            count = 0
            for sentence in document:
                sentence = np.asarray(sentence)
                if sentence.ndim != 1:
                    raise ValueError(
                        "each sentence must be a 1-D array of token ids, "
                        f"got shape {sentence.shape}"
                    )
                if len(sentence):  # an empty sentence carries no tokens and cannot be A or B
                    pieces.append(sentence)
                    lengths.append(len(sentence))
                    count += 1
            if count:
                doc_sentences.append(count)
        self.tokens = (
            np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.zeros(0, np.int32)
        )
        # bounds[k] is where global sentence k starts; bounds[-1] == len(tokens).
        self.bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.bounds[1:])
        # Document d holds global sentences first[d] .. first[d + 1] - 1.
        self.first = np.zeros(len(doc_sentences) + 1, dtype=np.int64)
        np.cumsum(doc_sentences, out=self.first[1:])
        self.num_documents = len(doc_sentences)
        # Python lists: the per-sentence loop indexes and bisects them, far cheaper than numpy.
        self.bounds_list: list[int] = self.bounds.tolist()
        self.first_list: list[int] = self.first.tolist()


def create_instances(
    documents: list[list[np.ndarray]],
    settings: InstanceSettings,
    rng: np.random.Generator,
    cls_id: int,
    sep_id: int,
) -> Instances:
    """All instances of dupe_factor passes over documents (lists of int32 sentences), shuffled."""
    corpus = _Corpus(documents)
    if corpus.num_documents == 0:
        return empty_instances()
    draws = _Uniforms(rng)
    # Each instance as token ranges in corpus.tokens: A = [a_lo, a_hi), B = [b_lo, b_hi).
    spans: list[tuple[int, int, int, int, int]] = []
    for _ in range(settings.dupe_factor):
        for doc in range(corpus.num_documents):
            _document_instances(corpus, doc, settings, draws, rng, spans)
    if not spans:
        return empty_instances()
    table = np.asarray(spans, dtype=np.int64)  # [n, 5]
    table = table[rng.permutation(len(table))]
    return _assemble(corpus.tokens, table, cls_id, sep_id)


class _Uniforms:
    """Uniform draws fetched from the generator in blocks: scalar calls dominate otherwise."""

    def __init__(self, rng: np.random.Generator, block: int = 4096):
        self._rng = rng
        self._block = block
        self._values: list[float] = []

    def random(self) -> float:
        """A float in [0, 1)."""
        if not self._values:
            self._values = self._rng.random(self._block).tolist()[::-1]
        return self._values.pop()

    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high), uniform (to within 2**-53)."""
        return low + int(self.random() * (high - low))


def _document_instances(corpus, doc, settings, draws, rng, spans) -> None:
    """Appends the instances of one document (google's create_instances_from_document)."""
    bounds = corpus.bounds_list
    first, last = corpus.first_list[doc], corpus.first_list[doc + 1]  # global sentence range
    sop = settings.task == "sop"
    max_num_tokens = settings.max_seq_length - 3
    target = max_num_tokens
    if draws.random() < settings.short_seq_prob:
        target = draws.integer(2, max_num_tokens + 1)
    single_document = corpus.num_documents == 1
    i = first
    while i < last:
        # The chunk is sentences i .. end-1: the shortest prefix reaching target tokens.
        end = bisect.bisect_left(bounds, bounds[i] + target, min(i + 1 + sop, last), last)
        n = end - i
        if sop and n < 2:
            break  # a lone last sentence has no continuation to pair with
        a_end = i + (draws.integer(1, n) if n >= 2 else 1)
        a_lo, a_hi = bounds[i], bounds[a_end]
        if sop:
            b_lo, b_hi = a_hi, bounds[end]
            label = int(draws.random() < 0.5)
            if label:
                a_lo, a_hi, b_lo, b_hi = b_lo, b_hi, a_lo, a_hi
            next_i = end
        elif n == 1 or draws.random() < 0.5:
            if single_document:
                if n == 1:
                    i = end
                    continue  # no other document to draw a random B from
                b_lo, b_hi, label, next_i = a_hi, bounds[end], 0, end
            else:
                other = draws.integer(0, corpus.num_documents - 1)
                other += other >= doc  # uniform over the other documents
                o_first, o_last = corpus.first_list[other], corpus.first_list[other + 1]
                start = draws.integer(o_first, o_last)
                target_b = target - (a_hi - a_lo)
                stop = bisect.bisect_left(bounds, bounds[start] + target_b, start + 1, o_last)
                b_lo, b_hi, label = bounds[start], bounds[stop], 1
                next_i = a_end  # the chunk's unused sentences go back
        else:
            b_lo, b_hi, label, next_i = a_hi, bounds[end], 0, end
        cut_a, cut_b = _removals(a_hi - a_lo, b_hi - b_lo, max_num_tokens)
        if cut_a:
            front = int(rng.binomial(cut_a, 0.5))
            a_lo, a_hi = a_lo + front, a_hi - (cut_a - front)
        if cut_b:
            front = int(rng.binomial(cut_b, 0.5))
            b_lo, b_hi = b_lo + front, b_hi - (cut_b - front)
        spans.append((a_lo, a_hi, b_lo, b_hi, label))
        i = next_i


def _assemble(tokens: np.ndarray, table: np.ndarray, cls_id: int, sep_id: int) -> Instances:
    """Builds the flat "[CLS] A [SEP] B [SEP]" arrays from token ranges, without a Python loop."""
    a_lo, a_hi, b_lo, b_hi, labels = table.T  # each [n]
    len_a, len_b = a_hi - a_lo, b_hi - b_lo
    lengths = len_a + len_b + 3
    offsets = np.zeros(len(table) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.int32)  # [total_tokens]
    starts = offsets[:-1]
    out[starts] = cls_id
    out[starts + 1 + len_a] = sep_id
    out[offsets[1:] - 1] = sep_id
    out[_ragged_arange(starts + 1, len_a)] = tokens[_ragged_arange(a_lo, len_a)]
    out[_ragged_arange(starts + 2 + len_a, len_b)] = tokens[_ragged_arange(b_lo, len_b)]
    return Instances(
        tokens=out,
        offsets=offsets,
        segment_b_start=(len_a + 2).astype(np.int32),
        next_sentence_labels=labels.astype(np.int32),
    )


def tokenize_documents(
    documents: Sequence[Sequence[str]], tokenizer: Tokenizer
) -> list[list[np.ndarray]]:
    """Token ids of every sentence of documents, in one batched encode call."""
    flat = [sentence for document in documents for sentence in document]
    encoded = tokenizer.encode_batch(flat)
    result: list[list[np.ndarray]] = []
    k = 0
    for document in documents:
        result.append([np.asarray(ids, dtype=np.int32) for ids in encoded[k : k + len(document)]])
        k += len(document)
    return result
