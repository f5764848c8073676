"""The label tasks' data: files read into records (bertjax.finetune.data), labels mapped to
ids, records encoded to arrays.

    load_task(data settings, task, tokenizer) -> TaskData: all of the below for every file
    head_for(task, train, labels)    -> HeadSpec: the labels found in training (or GLUE's)
    encode(split, head, tokenizer)   -> Examples: [n, max_seq_length] arrays and labels

Labels are read per task (LABEL_READERS): one class name (classification), a finite number
(regression), a set of class names (multi-label: a JSON list, or a string cut at the layout's
label_separator), CoNLL tags (token labels). Sentence tasks are encoded by
`bertjax.text.features.encode`: [CLS] A [SEP] or [CLS] A [SEP] B [SEP], pairs cut longest-first, as
google-research/bert's run_classifier does. Token tasks are encoded word by word
(`model.encode_words`): the first sub-word of each word carries its tag.

Bad input raises TaskDataError naming the file, the line and what is wrong; here: a label in
validation or test data that the training data never has.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertjax.capability import HeadSpec
from bertjax.finetune.data import (
    NUMBER_LABEL,
    TEXT_LABEL,
    LabelReader,
    Split,
    TaskDataError,
    read_split,
    record_fault,
)
from bertjax.finetune.layouts import TRAIN, UNLABELED
from bertjax.finetune.settings import FinetuneDataSettings
from bertjax.finetune.task import Examples, TaskData
from bertjax.tasks.labels import model
from bertjax.tasks.labels.model import (
    MULTI_LABEL,
    REGRESSION,
)
from bertjax.text import features as features_lib
from bertjax.text.tokenizer import Tokenizer

# Texts per call to the encoder: bounds the memory of its padded intermediate arrays.
_ENCODE_CHUNK = 4096


def _label_set(separator: str | None) -> LabelReader:
    """A multi-label field: a JSON list of labels, or a string cut at `separator`."""

    def parse(raw: Any, where: str, field: str) -> tuple[str, ...]:
        if isinstance(raw, list):
            labels = [str(x).strip() for x in raw]
        elif isinstance(raw, str):
            parts = raw.split(separator) if separator else [raw]
            labels = [p.strip() for p in parts if p.strip()]
        else:
            raise TaskDataError(
                f"{where}: label {raw!r} in {field} is neither a list nor a string of labels "
                "(multi_label)"
            )
        if any(not label for label in labels):
            raise TaskDataError(f"{where}: an empty label in {raw!r} ({field})")
        return tuple(dict.fromkeys(labels))  # each label once, in the order given

    return LabelReader(parse)


def label_reader(task: str, separator: str | None) -> LabelReader:
    """How `task` reads a label field (token tags come from CoNLL files, as text)."""
    if task == REGRESSION:
        return NUMBER_LABEL
    if task == MULTI_LABEL:
        return _label_set(separator)
    return TEXT_LABEL


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
    inputs = model.encode_words(tokenizer, [list(r.texts) for r in split.records], max_seq_length)
    ids = {label: k for k, label in enumerate(head.labels)}
    labels = np.full(inputs.input_ids.shape, model.IGNORE_LABEL, np.int32)  # [n, seq]
    word_labels = []
    for row, (record, where) in enumerate(zip(split.records, inputs.word_positions)):
        gold = (
            np.asarray([ids[tag] for tag in record.label], np.int32)
            if split.has_labels
            else np.full(len(where), model.IGNORE_LABEL, np.int32)
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

    def read(path: str, name: str, require_labels: bool) -> Split:
        label = label_reader(task, layout[path].label_separator)
        return read_split(path, layout[path], name, require_labels, label)

    train = read(data.train, TRAIN, True)
    head = head_for(task, train, data.labels)
    validation = [read(path, name, True) for name, path in data.validation]
    test = [read(path, name, False) for name, path in data.test]
    # Distillation's unlabeled examples: read as a test split is, labels or not.
    unlabeled = [read(data.unlabeled, UNLABELED, False)] if data.unlabeled else []
    for split in (train, *validation, *test):
        check_labels(split, head, train.path)
    splits = (train, *validation, *test, *unlabeled)
    encoded = [encode(split, head, tokenizer, data.max_seq_length) for split in splits]
    notes = []
    for split, examples in zip(splits, encoded):
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
        head,
        encoded[0],
        encoded[1 : 1 + len(validation)],
        encoded[1 + len(validation) : 1 + len(validation) + len(test)],
        notes,
        unlabeled=encoded[-1] if unlabeled else None,
    )
