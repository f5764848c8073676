"""SQuAD's data (v1.1 and v2.0), as google-research/bert's run_squad.py reads and windows it.

  read_examples    SQuAD JSON (v1.1 or v2.0) or JSON Lines ({"question", "context",
                   "answers": {"text": [...], "answer_start": [...]}, "id"}) -> QAData. An answer
                   whose text is not the context at its answer_start is kept for scoring but
                   never trained on; QAData names those ids.
  token_offsets    each token's character span in the original text, for sentencepiece and
                   WordPiece alike; answers map to tokens through these spans, and predicted
                   spans back to the original context's characters (not by detokenising).
  make_features    [CLS] question [SEP] context window [SEP] rows: contexts longer than one
                   window are split into windows `doc_stride` tokens apart; every context token
                   knows whether this window is its "max context" one; a training window that
                   does not hold the answer (or a v2.0 question without one) points at [CLS].

The rest of question answering: the head and its loss (model.py), n-best decoding and the
prediction files (decode.py), the official scoring (metrics.py), Model.answer (answer.py).

Batch features (google's names): input_ids, input_mask, segment_ids [batch, seq];
start_positions, end_positions [batch]; weights [batch] (0 for rows that only pad a batch).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from bertjax.storage import fs, textfile
from bertjax.text.tokenizer import Tokenizer

# A token that is not part of the context ([CLS], the question, [SEP], padding) or that
# covers no character of it: never the start or end of an answer.
NO_OFFSET = -1


# ----------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class QASettings:
    """Windowing and decoding, with google's run_squad.py defaults.

    `version_2_with_negative` None means: as the data says (SQuAD v2.0's is_impossible, or
    a JSON Lines record without answers).
    """

    max_seq_length: int = 384
    doc_stride: int = 128  # tokens from one window's start to the next one's
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    version_2_with_negative: bool | None = None

    def __post_init__(self):
        for name in (
            "max_seq_length",
            "doc_stride",
            "max_query_length",
            "n_best_size",
            "max_answer_length",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"QASettings.{name}={value!r} is invalid: must be a positive int")
        if self.max_seq_length < self.max_query_length + 4:
            raise ValueError(
                f"QASettings.max_seq_length={self.max_seq_length} is invalid: it must hold "
                f"[CLS], max_query_length={self.max_query_length} question tokens, two [SEP] "
                f"and at least one context token (>= {self.max_query_length + 4})"
            )
        threshold = self.null_score_diff_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(
                f"QASettings.null_score_diff_threshold={threshold!r} is invalid: must be a float"
            )
        if self.version_2_with_negative not in (None, True, False):
            raise ValueError(
                f"QASettings.version_2_with_negative={self.version_2_with_negative!r} is "
                "invalid: must be True, False or None (detect from the data)"
            )


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset of the answer in the context


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One question about one context, with its gold answers (none: unanswerable)."""

    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]  # None only while reading a test file without answers
    is_impossible: bool = False
    # Where it was read, for messages: "dev.json: data[0].paragraphs[3].qas[1]" or
    # "f.jsonl line 7".
    where: str = ""

    @property
    def answer_matches(self) -> bool:
        """Whether the first answer's text is the context at its offset (what training uses).

        Runs of whitespace compare equal, as google's check does.
        """
        if not self.answers:
            return False
        first = self.answers[0]
        found = self.context[first.start : first.start + len(first.text)]
        return first.start >= 0 and (found == first.text or found.split() == first.text.split())


@dataclasses.dataclass(frozen=True)
class QAData:
    """The examples of one file and what reading them found."""

    examples: tuple[QAExample, ...]
    version_2: bool  # unanswerable questions are part of the task
    source: str
    # Examples whose (first) answer is not the context at its answer_start: scored, but never
    # trained on (google's "Could not find answer").
    mismatched: tuple[str, ...] = ()
    # False for a test file without answers: its questions are only predicted.
    has_answers: bool = True

    def report(self) -> str:
        """One paragraph for a run's log: what was read and what training will skip."""
        if not self.has_answers:
            return f"{self.source}: {len(self.examples)} questions without answers (predicted)"
        impossible = sum(e.is_impossible for e in self.examples)
        line = (
            f"{self.source}: {len(self.examples)} questions (SQuAD "
            f"{'v2.0' if self.version_2 else 'v1.1'} task, {impossible} without an answer)"
        )
        if self.mismatched:
            shown = ", ".join(self.mismatched[:8])
            more = f" and {len(self.mismatched) - 8} more" if len(self.mismatched) > 8 else ""
            line += (
                f"; {len(self.mismatched)} answer(s) do not match the context at their "
                f"answer_start and are not trained on: {shown}{more}"
            )
        return line


def read_examples(
    path: str | os.PathLike,
    *,
    version_2_with_negative: bool | None = None,
    answers_required: bool = True,
) -> QAData:
    """Reads SQuAD JSON ({"data": [...]}) or JSON Lines (.jsonl) question-answering data.

    `version_2_with_negative` None detects the task: SQuAD v2.0 marks every question with
    is_impossible, and a JSON Lines record with no answer is unanswerable. With False, a
    question without an answer is an error. Without `answers_required` (a test file) the
    questions may come without answers at all (every one of them, or none): they are then
    only predicted (`QAData.has_answers` False). Bad input fails with one line naming the
    file, the line (JSON Lines) or record (SQuAD JSON), and the field.
    """
    path = fs.path(path)
    if fs.kind(path) != "file":
        raise FileNotFoundError(f"question-answering data {str(path)!r} does not exist")
    try:
        # textfile names the file, line and column of a byte that does not decode.
        lines = list(textfile.read_lines(path))
    except textfile.TextFileError as err:
        raise ValueError(str(err)) from None
    text = "".join(lines)
    if _is_squad_json(path, text):
        examples, marked_v2 = _read_squad_json(text, str(path))
    else:
        examples, marked_v2 = _read_json_lines(lines, str(path)), False
    if not examples:
        raise ValueError(f"{path}: holds no questions")
    has_answers = _answers_given(examples, answers_required)
    if not has_answers:
        # Nothing to train on or score: the questions are only predicted.
        examples = [dataclasses.replace(e, answers=(), is_impossible=False) for e in examples]
    has_impossible = any(e.is_impossible for e in examples)
    version_2 = (
        marked_v2 or has_impossible
        if version_2_with_negative is None
        else bool(version_2_with_negative)
    )
    if not version_2 and has_impossible:
        first = next(e for e in examples if e.is_impossible)
        raise ValueError(
            f"{first.where}: question {first.id!r} has no answer, but version_2_with_negative"
            "=False (SQuAD v1.1 has an answer for every question)"
        )
    seen: dict[str, str] = {}
    for example in examples:
        if example.id in seen:
            raise ValueError(
                f"{example.where}: id {example.id!r} was already used at {seen[example.id]}; "
                "question ids must be unique (predictions are keyed by id)"
            )
        seen[example.id] = example.where
    mismatched = tuple(
        e.id for e in examples if has_answers and not e.is_impossible and not e.answer_matches
    )
    return QAData(tuple(examples), version_2, str(path), mismatched, has_answers)


def _answers_given(examples: Sequence[QAExample], required: bool) -> bool:
    """Whether the questions come with answers: all of them, or (a test file) none."""
    lacking = [k for k, e in enumerate(examples) if e.answers is None]
    if not lacking:
        return True
    if required:
        raise ValueError(f"{examples[lacking[0]].where}: missing 'answers'")
    given = [k for k, e in enumerate(examples) if e.answers is not None]
    if given:
        first, other = sorted((lacking[0], given[0]))
        state = "lacks" if first == given[0] else "has"
        raise ValueError(
            f"{examples[other].where}: {state} 'answers', unlike {examples[first].where}; "
            "give every question answers, or none (a test file)"
        )
    return False


def _is_squad_json(path: fs.AnyPath, text: str) -> bool:
    # SQuAD is one JSON object with "data"; anything else not named .jsonl is read as JSON
    # Lines, whose errors name the line.
    if path.suffix == ".jsonl" or not text.lstrip().startswith("{"):
        return False
    try:
        top = json.loads(text)
    except ValueError:
        # JSON Lines when its first line is a value; else a broken object, whose error
        # (with json's line and column) is SQuAD's.
        try:
            json.loads(text.lstrip().partition("\n")[0])
        except ValueError:
            return True
        return False
    return isinstance(top, dict) and "question" not in top


def _read_squad_json(text: str, source: str) -> tuple[list[QAExample], bool]:
    try:
        top = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{source} line {err.lineno}: not valid JSON ({err.msg} at column {err.colno})"
        ) from None
    if not isinstance(top, dict) or not isinstance(top.get("data"), list):
        raise ValueError(f"{source}: expected SQuAD's {{'data': [articles]}} at the top level")
    examples, marked_v2 = [], False
    for a, article in enumerate(top["data"]):
        for p, paragraph in enumerate(_field(article, "paragraphs", list, f"{source}: data[{a}]")):
            where_p = f"{source}: data[{a}].paragraphs[{p}]"
            context = _text(paragraph, "context", where_p)
            for q, qa in enumerate(_field(paragraph, "qas", list, where_p)):
                where = f"{where_p}.qas[{q}]"
                _field(qa, "id", (str, int), where)  # a JSON object, with an id
                is_impossible = qa.get("is_impossible", False)
                if not isinstance(is_impossible, bool):
                    raise ValueError(f"{where}: is_impossible={is_impossible!r} must be a bool")
                marked_v2 = marked_v2 or "is_impossible" in qa
                answers = None  # absent: a test file's question
                if "answers" in qa:
                    answers = tuple(
                        _answer(
                            _field(answer, "text", str, f"{where}.answers[{k}]"),
                            _field(answer, "answer_start", int, f"{where}.answers[{k}]"),
                            f"{where}.answers[{k}]",
                        )
                        for k, answer in enumerate(_field(qa, "answers", list, where))
                    )
                examples.append(
                    QAExample(
                        id=str(qa["id"]),
                        question=_text(qa, "question", where),
                        context=context,
                        answers=() if is_impossible and answers is not None else answers,
                        is_impossible=is_impossible or answers == (),
                        where=where,
                    )
                )
    return examples, marked_v2


def _read_json_lines(lines: Sequence[str], source: str) -> list[QAExample]:
    # textfile's lines end at "\n" only: U+2028 and U+2029 are text inside a JSON string.
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: a JSON {type(record).__name__}, not an object")
        parsed = None  # absent: a test file's question
        if "answers" in record:
            answers = _field(record, "answers", dict, where)
            texts = _field(answers, "text", list, f"{where}: answers")
            starts = _field(answers, "answer_start", list, f"{where}: answers")
            if len(texts) != len(starts):
                raise ValueError(
                    f"{where}: answers has {len(texts)} text(s) but {len(starts)} "
                    "answer_start(s); they must pair up"
                )
            parsed = tuple(_answer(t, s, f"{where}: answers") for t, s in zip(texts, starts))
        qid = record.get("id", number)
        if isinstance(qid, bool) or not isinstance(qid, (str, int)):
            raise ValueError(f"{where}: id={qid!r} must be a str or int")
        examples.append(
            QAExample(
                id=str(qid),
                question=_text(record, "question", where),
                context=_text(record, "context", where),
                answers=parsed,
                is_impossible=parsed == (),
                where=where,
            )
        )
    return examples


def _field(record: Any, name: str, kind, where: str):
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if name not in record:
        raise ValueError(f"{where}: missing {name!r}")
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        raise ValueError(f"{where}: {name}={value!r} must be a {expected}")
    return value


def _text(record: Any, name: str, where: str) -> str:
    """A question or context: a string with some words, as every task file's texts."""
    value = _field(record, name, str, where)
    if not value.strip():
        raise ValueError(f"{where}: {name} {value!r} is empty")
    return value


def _answer(text: Any, start: Any, where: str) -> Answer:
    if not isinstance(text, str) or not text:
        raise ValueError(f"{where}: answer text {text!r} must be a non-empty string")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"{where}: answer_start={start!r} must be an int >= 0")
    return Answer(text, start)


# ----------------------------------------------------------------------------- offsets


class TokenSpans(NamedTuple):
    """Token ids of a text and each token's character span [start, end) in it."""

    ids: list[int]
    offsets: np.ndarray  # [tokens, 2] int64; NO_OFFSET for a token that covers no character


def token_offsets(tokenizer: Tokenizer, texts: Sequence[str]) -> list[TokenSpans]:
    """Ids (the same as `tokenizer.encode_batch`, special tokens in the text read as such)
    with character spans into each text.

    The spans are the tokenizer's own (`Tokenizer.encode_with_offsets`, what
    bertjax.text.features.offsets returns; read once here with the ids), cleaned for answer
    spans: none starts with whitespace, and a piece that covers no character of its own (all
    but the last byte piece of a byte-fallback character) takes the character's span, or
    NO_OFFSET when it has none to take.
    """
    texts = list(texts)
    return [
        TokenSpans(
            list(ids),
            _clean_spans(text, np.asarray(spans, np.int64).reshape(len(ids), 2)),  # [tokens, 2]
        )
        for text, (ids, spans) in zip(
            texts, tokenizer.encode_with_offsets(texts, special_tokens_in_text=True)
        )
    ]


def _clean_spans(text: str, spans: np.ndarray) -> np.ndarray:
    """Spans without leading whitespace. A token left covering nothing takes the next
    token's span when both begin at the same place (the byte pieces of one character, or
    sentencepiece's lone word-boundary piece before them); otherwise it gets NO_OFFSET."""
    raw = spans.tolist()
    out = []
    for start, end in raw:
        while start < end and text[start].isspace():
            start += 1
        out.append([start, end])
    for k in range(len(out) - 1, -1, -1):
        if out[k][0] < out[k][1]:
            continue
        inherits = k + 1 < len(out) and out[k + 1][0] != NO_OFFSET and raw[k][0] == raw[k + 1][0]
        out[k] = list(out[k + 1]) if inherits else [NO_OFFSET, NO_OFFSET]
    return np.array(out, np.int64).reshape(-1, 2)  # [tokens, 2]


# ----------------------------------------------------------------------------- windows


@dataclasses.dataclass(frozen=True)
class QAFeatures:
    """Model inputs of every window of every example, and what decoding needs of them."""

    input_ids: np.ndarray  # [n, seq] int32: [CLS] question [SEP] window [SEP] padding
    input_mask: np.ndarray  # [n, seq] int32
    segment_ids: np.ndarray  # [n, seq] int32: 0 up to the first [SEP], 1 for the window
    start_positions: np.ndarray  # [n] int32: the answer's first token; 0 ([CLS]) if none
    end_positions: np.ndarray  # [n] int32
    example_index: np.ndarray  # [n] int32: the example each window belongs to
    # [n, seq, 2] int64: character span of each context token in the example's context;
    # NO_OFFSET for every other position.
    offsets: np.ndarray
    max_context: np.ndarray  # [n, seq] bool: this window is the token's max-context one
    # Training: examples left out because their answer does not match the context.
    skipped: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def batch(self, rows: slice | np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The model's features of some rows (all by default), with weights 1."""
        rows = slice(None) if rows is None else rows
        ids = self.input_ids[rows]
        return {
            "input_ids": ids,
            "input_mask": self.input_mask[rows],
            "segment_ids": self.segment_ids[rows],
            "start_positions": self.start_positions[rows],
            "end_positions": self.end_positions[rows],
            "weights": np.ones(ids.shape[0], np.float32),
        }


def doc_spans(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `num_tokens` context tokens, as google's
    run_squad.py: windows of at most `max_tokens`, `stride` tokens apart, the last one ending
    at the context's end. A context of no tokens still gets one (empty) window."""
    spans = []
    start = 0
    while True:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, stride)


def max_context_flags(spans: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    """Per window, per token: whether this window gives the token the most context.

    google's _check_is_max_context: a token's score in a window is min(tokens left of it,
    tokens right of it) + 0.01 * window length; the first window with the best score wins.
    """
    total = max((start + length for start, length in spans), default=0)
    best_score = np.full(total, -np.inf)
    best_window = np.zeros(total, np.int64)
    for w, (start, length) in enumerate(spans):
        position = np.arange(length)
        score = np.minimum(position, length - 1 - position) + 0.01 * length  # [length]
        tokens = start + position
        better = score > best_score[tokens]
        best_score[tokens[better]] = score[better]
        best_window[tokens[better]] = w
    return [best_window[start : start + length] == w for w, (start, length) in enumerate(spans)]


def answer_token_span(offsets: np.ndarray, start_char: int, end_char: int) -> tuple[int, int]:
    """The first and last context tokens overlapping characters [start_char, end_char);
    (-1, -1) when no token does."""
    hit = (offsets[:, 0] != NO_OFFSET) & (offsets[:, 0] < end_char) & (offsets[:, 1] > start_char)
    where = np.flatnonzero(hit)
    if not len(where):
        return -1, -1
    return int(where[0]), int(where[-1])


def make_features(
    examples: Sequence[QAExample],
    tokenizer: Tokenizer,
    settings: QASettings,
    *,
    training: bool,
) -> QAFeatures:
    """Every window of every example (see the module docstring).

    With `training`, an example whose answer does not match its context is left out (named
    in `skipped`), and each window carries the answer's token positions, or [CLS]'s when the
    window does not hold the whole answer or the question has none.
    """
    per_example = windows(examples, tokenizer, settings, settings.doc_stride)
    rows: list[Window] = []
    skipped = []
    for example, example_windows in zip(examples, per_example):
        if training and not example.is_impossible and not example.answer_matches:
            skipped.append(example.id)
        else:
            rows += example_windows
    features = rows_to_features(rows, settings.max_seq_length)
    if training:
        for row, window in enumerate(rows):
            first, last = window.answer_tokens
            end = window.first_token_in_doc + len(window.offsets)
            # Only a window holding the whole answer points at it; the others at [CLS].
            if first >= 0 and window.first_token_in_doc <= first and last < end:
                features.start_positions[row] = (
                    window.context_start + first - window.first_token_in_doc
                )
                features.end_positions[row] = (
                    window.context_start + last - window.first_token_in_doc
                )
    return dataclasses.replace(features, skipped=tuple(skipped))


def rows_to_features(rows: Sequence[Window], seq: int) -> QAFeatures:
    """Windows as model inputs, with their context offsets and max-context flags."""
    n = len(rows)
    input_ids = np.zeros((n, seq), np.int32)
    input_mask = np.zeros((n, seq), np.int32)
    segment_ids = np.zeros((n, seq), np.int32)
    offsets = np.full((n, seq, 2), NO_OFFSET, np.int64)
    max_context = np.zeros((n, seq), bool)
    for row, window in enumerate(rows):
        length = len(window.ids)
        input_ids[row, :length] = window.ids
        input_mask[row, :length] = 1
        segment_ids[row, window.context_start : length] = 1
        context = slice(window.context_start, window.context_start + len(window.offsets))
        offsets[row, context] = window.offsets
        max_context[row, context] = window.max_context
    index = np.array([w.example_index for w in rows], np.int32).reshape(n)
    starts, ends = np.zeros(n, np.int32), np.zeros(n, np.int32)
    return QAFeatures(input_ids, input_mask, segment_ids, starts, ends, index, offsets, max_context)


@dataclasses.dataclass(frozen=True)
class Window:
    example_index: int
    ids: list[int]  # [CLS] question [SEP] window [SEP]
    context_start: int  # position of the window's first context token
    first_token_in_doc: int  # index of that token among the context's tokens
    offsets: np.ndarray  # [window, 2] character spans of the window's context tokens
    max_context: np.ndarray  # [window] bool
    answer_tokens: tuple[int, int]  # the (first) answer's tokens in the whole context


def windows(
    examples: Sequence[QAExample], tokenizer: Tokenizer, settings: QASettings, stride: int
) -> list[list[Window]]:
    # A special token written in a question or context ("[MASK]") is that token, as
    # transformers' tokenizers read it.
    questions = tokenizer.encode_batch([e.question for e in examples], special_tokens_in_text=True)
    # SQuAD asks several questions about each paragraph: tokenize each context once.
    unique = list(dict.fromkeys(e.context for e in examples))
    spans_of = dict(zip(unique, token_offsets(tokenizer, unique)))
    result = []
    for k, (example, question) in enumerate(zip(examples, questions)):
        context = spans_of[example.context]
        question = question[: settings.max_query_length]
        max_tokens = settings.max_seq_length - len(question) - 3
        answer_tokens = (-1, -1)
        if example.answers and not example.is_impossible:
            first = example.answers[0]
            answer_tokens = answer_token_span(
                context.offsets, first.start, first.start + len(first.text)
            )
        spans = doc_spans(len(context.ids), max_tokens, stride)
        flags = max_context_flags(spans)
        windows = []
        for (start, length), flag in zip(spans, flags):
            ids = [tokenizer.cls_id, *question, tokenizer.sep_id]
            context_start = len(ids)
            ids += context.ids[start : start + length]
            ids.append(tokenizer.sep_id)
            windows.append(
                Window(
                    k,
                    ids,
                    context_start,
                    start,
                    context.offsets[start : start + length],
                    flag,
                    answer_tokens,
                )
            )
        result.append(windows)
    return result
