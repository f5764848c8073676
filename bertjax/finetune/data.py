"""Task files read into records: the readers every fine-tuning task shares.

    read_split(path, layout, name, require_labels, label) -> Split of Records (texts, label,
                                                            id, line number)
    record_fault(split, err)                             -> TaskDataError naming file and line

Formats: CSV, TSV (GLUE's), JSON Lines, CoNLL (`token TAG` lines). How a label field's raw
value becomes a label is the task's: a `LabelReader` (TEXT_LABEL, NUMBER_LABEL, or one of the
task's own). What a task makes of the records (its heads, its encoding) lives with the task
(bertjax/tasks/<name>/).

Bad input raises TaskDataError, one message naming the file, the line and what is wrong:
an empty file, a missing column, an empty text, a label that is not what the reader expects.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

from bertjax.finetune.layouts import CONLL, JSONL, TSV, Layout
from bertjax.storage import fs, textfile
from bertjax.text import features as features_lib

# The CoNLL-2003 files start documents with this line; it is not a sentence.
_DOCSTART = "-DOCSTART-"


class TaskDataError(ValueError):
    """Task data that cannot be used; the message names the file, the line and the problem."""


@dataclasses.dataclass(frozen=True)
class LabelReader:
    """How a label field's raw value (a string, or a JSON value) becomes a task's label.

    `parse(raw, where, field)` returns the label or raises TaskDataError; `where` is "<file>
    line <n>" and `field` names the label field, for the message. `numeric`: the labels are
    numbers whether written as text or as JSON numbers, so a JSON Lines file is not held to
    writing every label the same way (it is otherwise: 1 and "1" would be two labels).
    """

    parse: Callable[[Any, str, str], Any]
    numeric: bool = False


def _text_label(raw: Any, where: str, field: str) -> str:
    if isinstance(raw, (dict, list)) or raw is None:
        raise TaskDataError(f"{where}: label {raw!r} in {field} is not a single label")
    label = str(raw).strip()
    if not label:
        raise TaskDataError(f"{where}: {field} is empty")
    return label


def _number_label(raw: Any, where: str, field: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(raw, bool) or not math.isfinite(value):
        raise TaskDataError(f"{where}: label {raw!r} in {field} is not a finite number")
    return value


# One label, as text (a class name, a target text).
TEXT_LABEL = LabelReader(_text_label)
# A finite number (a regression target, a similarity score).
NUMBER_LABEL = LabelReader(_number_label, numeric=True)


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
    path: str | os.PathLike,
    layout: Layout,
    name: str,
    require_labels: bool,
    label: LabelReader = TEXT_LABEL,
) -> Split:
    """Reads one file; `require_labels`: a file without its label column is an error;
    `label` reads the label field's values (CoNLL tags are always text)."""
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
            records, has_labels, skipped = _read_jsonl(path, layout, label)
        else:
            records, has_labels, skipped = _read_delimited(path, layout, label)
    except textfile.TextFileError as err:
        raise TaskDataError(f"{err} ({name} data)") from None
    if not records:
        raise TaskDataError(f"{path} holds no examples ({name} data)")
    if require_labels and not has_labels:
        where = "tags" if layout.format == CONLL else f"label column {layout.label_field!r}"
        raise TaskDataError(f"{path}: no {where}; {name} data needs labels")
    return Split(name, str(path), records, has_labels, skipped)


def _label_value(path, line: int, raw: Any, layout: Layout, label: LabelReader) -> Any:
    # The field named too: a seq2seq target or an embedding score is a "label" here.
    return label.parse(raw, f"{path} line {line}", f"field {layout.label_field!r}")


def _text(path, line: int, value: Any, field: str | int) -> str:
    if not isinstance(value, str):
        raise TaskDataError(
            f"{path} line {line}: field {field!r} holds {type(value).__name__} {value!r}, not text"
        )
    if not value.strip():
        raise TaskDataError(f"{path} line {line}: the text in {field!r} is empty")
    return value


def _read_delimited(path: fs.AnyPath, layout: Layout, label_reader: LabelReader):
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
            label = _label_value(path, line, row[label_at], layout, label_reader)
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


def _read_jsonl(path: fs.AnyPath, layout: Layout, label_reader: LabelReader):
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
            # Numbers read from either; a list of labels counts by its elements.
            values = [] if label_reader.numeric else raw if isinstance(raw, list) else [raw]
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
            label = _label_value(path, line, raw, layout, label_reader)
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


# ----------------------------------------------------------------------------- faults


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
