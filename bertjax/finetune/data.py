"""Task data: files read into examples, labels mapped to ids, examples encoded to arrays.

    load_task(data settings, task, tokenizer) -> TaskData: all of the below for every file
    read_split(path, layout, task)   -> Split of Records (texts, label, id, line number)
    head_for(task, train, labels)    -> HeadSpec: the labels found in training (or GLUE's)
    encode(split, head, tokenizer)   -> Examples: [n, max_seq_length] arrays and labels

Sentence tasks are encoded by `bertjax.features.encode`: [CLS] A [SEP] or [CLS] A [SEP] B [SEP],
pairs cut longest-first, as google-research/bert's run_classifier does. Token tasks are
encoded word by word (`heads.encode_words`): the first sub-word of each word carries its tag.

Bad input raises TaskDataError, one message naming the file, the line and what is wrong:
an empty file, a missing column, an empty text, a label in validation or test data that
the training data never has, a label that is not a number (regression).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from bertjax import features as features_lib
from bertjax import fs, heads, textfile
from bertjax.capability import HeadSpec
from bertjax.finetune.layouts import CONLL, JSONL, TRAIN, TSV, Layout
from bertjax.finetune.settings import FinetuneDataSettings
from bertjax.finetune.task import Examples, TaskData
from bertjax.heads import MULTI_LABEL, REGRESSION
from bertjax.tokenizer import Tokenizer

# Texts per call to the encoder: bounds the memory of its padded intermediate arrays.
_ENCODE_CHUNK = 4096
# The CoNLL-2003 files start documents with this line; it is not a sentence.
_DOCSTART = "-DOCSTART-"


class TaskDataError(ValueError):
    """Task data that cannot be used; the message names the file, the line and the problem."""


@dataclasses.dataclass(frozen=True)
class Record:
    """One example as read from its file."""

    line: int  # 1-based line where it starts
    index: str  # its id: the file's id column, else its 0-based position
    texts: tuple[str, ...]  # one text, a pair, or (token tasks) the sentence's words
    label: Any  # str, float, tuple of str (multi-label, token tags), None if unlabelled


@dataclasses.dataclass(frozen=True)
class Split:
    """The examples of one file."""

    name: str  # train, validation, test (MNLI: validation_matched, ...)
    path: str
    records: list[Record]
    has_labels: bool
    skipped: int = 0  # malformed rows skipped (Layout.skip_malformed)


# ----------------------------------------------------------------------------- reading


def read_split(
    path: str | os.PathLike, layout: Layout, task: str, name: str, require_labels: bool
) -> Split:
    """Reads one file; `require_labels`: a file without its label column is an error."""
    path = fs.path(path)
    if fs.kind(path) != "file":
        raise TaskDataError(f"{path}: no such file ({name} data)")
    if fs.size(path) == 0:
        raise TaskDataError(f"{path} is empty ({name} data): it holds no examples")
    try:
        if layout.format == CONLL:
            records, skipped = _read_conll(path), 0
            has_labels = bool(records) and records[0].label is not None
        elif layout.format == JSONL:
            records, has_labels, skipped = _read_jsonl(path, layout, task)
        else:
            records, has_labels, skipped = _read_delimited(path, layout, task)
    except textfile.TextFileError as err:
        raise TaskDataError(f"{err} ({name} data)") from None
    if not records:
        raise TaskDataError(f"{path} holds no examples ({name} data)")
    if require_labels and not has_labels:
        where = "tags" if layout.format == CONLL else f"label column {layout.label_field!r}"
        raise TaskDataError(f"{path}: no {where}; {name} data needs labels")
    return Split(name, str(path), records, has_labels, skipped)


def _label_value(path, line: int, raw: Any, layout: Layout, task: str) -> Any:
    """A label as read, checked for the task: str, float or tuple of str."""
    where = f"{path} line {line}"
    # The field named too: a seq2seq target or an embedding score is a "label" here.
    field = f"field {layout.label_field!r}"
    if task == REGRESSION:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(raw, bool) or not math.isfinite(value):
            raise TaskDataError(
                f"{where}: label {raw!r} in {field} is not a finite number (regression)"
            )
        return value
    if task == MULTI_LABEL:
        if isinstance(raw, list):
            labels = [str(x).strip() for x in raw]
        elif isinstance(raw, str):
            parts = raw.split(layout.label_separator) if layout.label_separator else [raw]
            labels = [p.strip() for p in parts if p.strip()]
        else:
            raise TaskDataError(
                f"{where}: label {raw!r} in {field} is neither a list nor a string of labels "
                "(multi_label)"
            )
        if any(not label for label in labels):
            raise TaskDataError(f"{where}: an empty label in {raw!r} ({field})")
        return tuple(dict.fromkeys(labels))  # each label once, in the order given
    if isinstance(raw, (dict, list)) or raw is None:
        raise TaskDataError(f"{where}: label {raw!r} in {field} is not a single label")
    label = str(raw).strip()
    if not label:
        raise TaskDataError(f"{where}: {field} is empty")
    return label


def _text(path, line: int, value: Any, field: str | int) -> str:
    if not isinstance(value, str):
        raise TaskDataError(
            f"{path} line {line}: field {field!r} holds {type(value).__name__} {value!r}, not text"
        )
    if not value.strip():
        raise TaskDataError(f"{path} line {line}: the text in {field!r} is empty")
    return value


def _read_delimited(path: fs.AnyPath, layout: Layout, task: str):
    delimiter = "\t" if layout.format == TSV else ","
    # TSV files (GLUE's among them) do not quote: a quote character is text.
    quoting = csv.QUOTE_NONE if layout.format == TSV else csv.QUOTE_MINIMAL
    reader = csv.reader(textfile.read_lines(path), delimiter=delimiter, quoting=quoting)
    rows = _rows(reader)
    columns: dict[str | int, int]
    if layout.header:
        first = next(rows, None)
        if first is None:
            raise TaskDataError(f"{path} is empty: no header and no examples")
        _, header = first
        columns = {name.strip(): k for k, name in enumerate(header)}
    else:
        columns = {}

    def position(field: str | int, role: str, required: bool) -> int | None:
        if isinstance(field, int):
            return field
        if field in columns:
            return columns[field]
        if not required:
            return None
        raise TaskDataError(
            f"{path} line 1: no {role} column {field!r}; the header has {list(columns)}"
        )

    text_at = [position(f, "text", True) for f in layout.text_fields]
    label_at = (
        position(layout.label_field, "label", False) if layout.label_field is not None else None
    )
    index_at = position(layout.index_field, "id", False) if layout.index_field else None
    needed = max([*text_at, label_at if label_at is not None else -1]) + 1
    records, skipped = [], 0
    for line, row in rows:
        if len(row) < needed:
            if layout.skip_malformed:
                skipped += 1
                continue
            raise TaskDataError(
                f"{path} line {line}: {len(row)} field(s), but column "
                f"{_field_name(layout, needed - 1, columns)!r} is field {needed}"
            )
        texts = tuple(
            _text(path, line, row[k], field) for k, field in zip(text_at, layout.text_fields)
        )
        label = None
        if label_at is not None:
            label = _label_value(path, line, row[label_at], layout, task)
        index = row[index_at].strip() if index_at is not None else str(len(records))
        records.append(Record(line, index, texts, label))
    return records, label_at is not None, skipped


def _rows(reader) -> Iterator[tuple[int, list[str]]]:
    """(first line number, fields) of each row that is not blank."""
    start = 1
    for row in reader:
        line, start = start, reader.line_num + 1
        if any(field.strip() for field in row):
            yield line, row


def _field_name(layout: Layout, position: int, columns: dict) -> str | int:
    names = {k: name for name, k in columns.items()}
    return names.get(position, position)


def _json_label(raw: Any) -> Any:
    """Equal numbers as one label: 1 and 1.0 are both 1 (lists element by element)."""
    if isinstance(raw, list):
        return [_json_label(value) for value in raw]
    if isinstance(raw, float) and math.isfinite(raw) and raw == int(raw):
        return int(raw)
    return raw


def _json_kind(raw: Any) -> str:
    """What kind of JSON value a label is, for the check that a file writes them one way."""
    if isinstance(raw, bool):
        return "boolean"
    if isinstance(raw, (int, float)):
        return "number"
    return "string" if isinstance(raw, str) else type(raw).__name__


def _read_jsonl(path: fs.AnyPath, layout: Layout, task: str):
    records = []
    labelled = None
    first_kind: tuple[str, int, Any] | None = None  # the first label's kind, line and value
    for line, text in enumerate(textfile.read_lines(path), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as err:
            raise TaskDataError(f"{path} line {line}: not a JSON object ({err})") from None
        if not isinstance(obj, dict):
            raise TaskDataError(f"{path} line {line}: a JSON {type(obj).__name__}, not object")
        for field in layout.text_fields:
            if field not in obj:
                raise TaskDataError(
                    f"{path} line {line}: no text field {field!r}; it has {sorted(obj)}"
                )
        texts = tuple(_text(path, line, obj[field], field) for field in layout.text_fields)
        has_label = layout.label_field is not None and layout.label_field in obj
        if labelled is None:
            labelled = has_label
        elif has_label != labelled:
            state = "has" if has_label else "lacks"
            raise TaskDataError(
                f"{path} line {line}: {state} label field {layout.label_field!r}, unlike "
                "the lines before it; give every example a label, or none"
            )
        label = None
        if has_label:
            raw = _json_label(obj[layout.label_field])
            # Regression reads numbers from either; a multi-label list counts by its elements.
            values = [] if task == REGRESSION else raw if isinstance(raw, list) else [raw]
            for value in values:
                kind = _json_kind(value)
                if first_kind is None:
                    first_kind = (kind, line, value)
                elif kind != first_kind[0]:
                    raise TaskDataError(
                        f"{path} line {line}: label {value!r} is a {kind}, but line "
                        f"{first_kind[1]}'s label {first_kind[2]!r} is a {first_kind[0]}; "
                        "write every label the same way (all numbers or all strings)"
                    )
            label = _label_value(path, line, raw, layout, task)
        index = str(obj[layout.index_field]) if layout.index_field in obj else str(len(records))
        records.append(Record(line, index, texts, label))
    return records, bool(labelled), 0


def _read_conll(path: fs.AnyPath) -> list[Record]:
    records = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    tagged = None

    def close():
        if words:
            label = tuple(tags) if tagged else None
            records.append(Record(start, str(len(records)), tuple(words), label))
            words.clear()
            tags.clear()

    for line, text in enumerate(textfile.read_lines(path), start=1):
        parts = text.split()
        if not parts or parts[0] == _DOCSTART:
            close()
            continue
        if not words:
            start = line
        has_tag = len(parts) > 1
        if tagged is None:
            tagged = has_tag
        elif has_tag != tagged:
            raise TaskDataError(
                f"{path} line {line}: {'a' if has_tag else 'no'} tag after "
                f"{'untagged' if has_tag else 'tagged'} lines; write `token TAG` on every "
                "line, or only tokens"
            )
        words.append(parts[0])
        tags.append(parts[-1])
    close()
    return records


# ----------------------------------------------------------------------------- labels


def _label_order(labels: set[str]) -> list[str]:
    """Numbers in numeric order ("2" before "10"), anything else alphabetically."""
    try:
        return sorted(labels, key=float)
    except ValueError:
        return sorted(labels)


def head_for(task: str, train: Split, labels: Sequence[str] | None = None) -> HeadSpec:
    """The head of a task: the given labels (GLUE's), else those found in the training data."""
    if labels is None:
        if task == REGRESSION:
            labels = ["score"]
        else:
            found: set[str] = set()
            for record in train.records:
                found.update(record.label if isinstance(record.label, tuple) else (record.label,))
            labels = _label_order(found)
    try:
        return HeadSpec(task, tuple(labels))
    except ValueError as err:
        raise TaskDataError(f"{train.path}: {err}") from None


def check_labels(split: Split, head: HeadSpec, train_path: str) -> None:
    """Fails at the first label of `split` that the head does not have."""
    if head.task == REGRESSION or not split.has_labels:
        return
    known = set(head.labels)
    for record in split.records:
        for label in record.label if isinstance(record.label, tuple) else (record.label,):
            if label not in known:
                shown = ", ".join(head.labels[:10]) + (" ..." if len(head.labels) > 10 else "")
                raise TaskDataError(
                    f"{split.path} line {record.line}: label {label!r} never appears in the "
                    f"training data {train_path} (its labels: {shown})"
                )


# ----------------------------------------------------------------------------- encoding


def record_fault(
    split: Split, err: features_lib.InputError, offset: int = 0, field: str = ""
) -> TaskDataError:
    """A text that cannot be encoded, named by its file and line. `offset`: the position in
    the split of the texts' first; `field`: the text's field, when the reader knows it."""
    if err.index is None:
        return TaskDataError(f"{split.path}: {err}")
    record = split.records[offset + err.index]
    what = f"field {field!r}" if field else f"the {err.what}"
    return TaskDataError(f"{split.path} line {record.line}: {what} {err.problem}")


def encode(split: Split, head: HeadSpec, tokenizer: Tokenizer, max_seq_length: int) -> Examples:
    """A split's examples as [n, max_seq_length] arrays, labels per the head."""
    if head.token_level:
        return _encode_words(split, head, tokenizer, max_seq_length)
    n = len(split.records)
    features = {
        name: np.zeros((n, max_seq_length), np.int32)
        for name in ("input_ids", "input_mask", "segment_ids")
    }
    pairs = len(split.records[0].texts) == 2
    for start in range(0, n, _ENCODE_CHUNK):
        chunk = split.records[start : start + _ENCODE_CHUNK]
        with warnings.catch_warnings():
            # Long inputs are cut, as google's run_classifier cuts them; counted below.
            warnings.simplefilter("ignore", features_lib.TruncationWarning)
            try:
                encoded = features_lib.encode(
                    tokenizer,
                    [r.texts[0] for r in chunk],
                    [r.texts[1] for r in chunk] if pairs else None,
                    max_seq_length,
                )
            except features_lib.InputError as err:
                raise record_fault(split, err, start) from None
        width = encoded["input_ids"].shape[1]
        for name in features:
            features[name][start : start + len(chunk), :width] = encoded[name]
    features["labels"] = _sentence_labels(split, head)
    return Examples(
        split.name,
        split.path,
        features,
        [r.index for r in split.records],
        split.has_labels,
        full_rows=int(np.sum(features["input_mask"][:, -1])),
    )


def _sentence_labels(split: Split, head: HeadSpec) -> np.ndarray:
    n = len(split.records)
    if head.task == REGRESSION:
        values = [r.label if split.has_labels else 0.0 for r in split.records]
        return np.asarray(values, np.float32)  # [n]
    ids = {label: k for k, label in enumerate(head.labels)}
    if head.task == MULTI_LABEL:
        targets = np.zeros((n, head.num_outputs), np.float32)  # [n, labels]
        if split.has_labels:
            for row, record in enumerate(split.records):
                targets[row, [ids[label] for label in record.label]] = 1.0
        return targets
    if not split.has_labels:
        return np.zeros(n, np.int32)
    return np.asarray([ids[r.label] for r in split.records], np.int32)  # [n]


def _encode_words(
    split: Split, head: HeadSpec, tokenizer: Tokenizer, max_seq_length: int
) -> Examples:
    inputs = heads.encode_words(tokenizer, [list(r.texts) for r in split.records], max_seq_length)
    ids = {label: k for k, label in enumerate(head.labels)}
    labels = np.full(inputs.input_ids.shape, heads.IGNORE_LABEL, np.int32)  # [n, seq]
    word_labels = []
    for row, (record, where) in enumerate(zip(split.records, inputs.word_positions)):
        gold = (
            np.asarray([ids[tag] for tag in record.label], np.int32)
            if split.has_labels
            else np.full(len(where), heads.IGNORE_LABEL, np.int32)
        )
        kept = where >= 0
        if split.has_labels:
            labels[row, where[kept]] = gold[kept]
        word_labels.append(gold)
    return Examples(
        split.name,
        split.path,
        {
            "input_ids": inputs.input_ids,
            "input_mask": inputs.input_mask,
            "segment_ids": inputs.segment_ids,
            "labels": labels,
        },
        [r.index for r in split.records],
        split.has_labels,
        word_positions=inputs.word_positions,
        word_labels=word_labels,
        full_rows=int(np.sum(inputs.input_mask[:, -1])),
        words_cut=inputs.words_cut,
    )


# ----------------------------------------------------------------------------- a task


def load_task(data: FinetuneDataSettings, task: str, tokenizer: Tokenizer) -> TaskData:
    """Reads, checks and encodes a task's files (settings.FinetuneDataSettings)."""
    layout = dict(data.layouts)
    train = read_split(data.train, layout[data.train], task, TRAIN, require_labels=True)
    head = head_for(task, train, data.labels)
    validation = [
        read_split(path, layout[path], task, name, require_labels=True)
        for name, path in data.validation
    ]
    test = [
        read_split(path, layout[path], task, name, require_labels=False) for name, path in data.test
    ]
    for split in (train, *validation, *test):
        check_labels(split, head, train.path)
    encoded = [
        encode(split, head, tokenizer, data.max_seq_length) for split in (train, *validation, *test)
    ]
    notes = []
    for split, examples in zip((train, *validation, *test), encoded):
        if split.skipped:
            notes.append(f"{split.path}: skipped {split.skipped} malformed row(s)")
        if examples.full_rows:
            notes.append(
                f"{split.path}: {examples.full_rows} of {len(examples)} example(s) fill all "
                f"{data.max_seq_length} positions; longer ones were cut"
            )
        if examples.words_cut:
            notes.append(
                f"{split.path}: {examples.words_cut} word(s) past {data.max_seq_length} "
                "sub-words (or without tokens) get no prediction of their own"
            )
    return TaskData(
        head, encoded[0], encoded[1 : 1 + len(validation)], encoded[1 + len(validation) :], notes
    )
