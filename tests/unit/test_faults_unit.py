"""The unit tests of test_faults.py (tests/parity/)."""

import json

import pytest

from bertjax.data import corpus
from bertjax.finetune import data as finetune_data
from bertjax.finetune.layouts import CONLL, CSV, JSONL, Layout
from bertjax.storage import textfile
from bertjax.tasks.labels import data as label_data

CSV_LAYOUT = Layout(CSV, ("sentence",), "label")
CSV_TEXT = "sentence,label\nthe café is open,yes\nit is closed,no\n"


def test_equal_json_numbers_are_one_label(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [("good", 1), ("bad", 0.0), ("fine", 1.0), ("poor", 0), ("ok", 1)]
    path.write_text("".join(json.dumps({"text": t, "label": v}) + "\n" for t, v in rows))
    layout = Layout(JSONL, ("text",), "label")
    split = finetune_data.read_split(path, layout, "train", True)
    head = label_data.head_for("classification", split)
    assert head.labels == ("0", "1")


def test_a_file_mixing_label_types_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [("good", 1), ("bad", 0), ("fine", "1")]
    path.write_text("".join(json.dumps({"text": t, "label": v}) + "\n" for t, v in rows))
    layout = Layout(JSONL, ("text",), "label")
    with pytest.raises(finetune_data.TaskDataError) as err:
        finetune_data.read_split(path, layout, "train", True)
    message = str(err.value)
    assert "\n" not in message
    assert f"{path} line 3: label '1' is a string, but line 1's label 1 is a number" in message


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32", "utf-8-sig"])
def test_task_files_with_a_byte_order_mark_decode(tmp_path, encoding):
    path = tmp_path / "train.csv"
    mark = {"utf-16-be": b"\xfe\xff"}.get(encoding, b"")
    path.write_bytes(mark + CSV_TEXT.encode(encoding))
    split = finetune_data.read_split(path, CSV_LAYOUT, "train", True)
    assert [r.texts for r in split.records] == [("the café is open",), ("it is closed",)]
    assert [r.label for r in split.records] == ["yes", "no"]


def test_binary_and_undecodable_task_files_are_named(tmp_path):
    png = tmp_path / "train.csv"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    with pytest.raises(finetune_data.TaskDataError, match=f"{png}: not a text file .a PNG image"):
        finetune_data.read_split(png, CSV_LAYOUT, "train", True)
    bad = tmp_path / "dev.csv"
    bad.write_bytes(b"sentence,label\nfine,yes\ncaf\xe9 latin-1,no\n")
    with pytest.raises(finetune_data.TaskDataError) as err:
        finetune_data.read_split(bad, CSV_LAYOUT, "validation", True)
    assert str(err.value).startswith(f"{bad} line 3: byte 0xe9 at column 4 is not UTF-8")
    conll = tmp_path / "train.conll"
    conll.write_bytes("EU B-ORG\nrejects O\n".encode("utf-16"))
    split = finetune_data.read_split(conll, Layout(CONLL), "train", True)
    assert split.records[0].texts == ("EU", "rejects")


def test_corpora_and_task_files_share_one_reader():
    assert corpus.sniff is textfile.sniff
