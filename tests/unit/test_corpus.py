"""Corpus reading, the input report, the sentence splitter and the demo corpus."""

import codecs
import gzip
import itertools
import json
import os
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertjax.data import corpus
from bertjax.data.corpus import MAX_PLACES, InputReport, expand_paths, read_documents
from bertjax.data.demo_corpus import demo_corpus_path, demo_documents
from bertjax.data.sentences import split_sentences


def read(paths, **kwargs):
    report = InputReport()
    return list(read_documents(paths, report, **kwargs)), report


# ----------------------------------------------------------------------------- sentences


SPLIT_CASES = [
    (
        "Hello world. This is a test! Is it? Yes.",
        ["Hello world.", "This is a test!", "Is it?", "Yes."],
    ),
    ("Mr. Smith met Dr. Jones. They talked.", ["Mr. Smith met Dr. Jones.", "They talked."]),
    ("Use a tool, e.g. a hammer. Or i.e. not.", ["Use a tool, e.g. a hammer.", "Or i.e. not."]),
    (
        "J. R. R. Tolkien wrote it. The U.S. Army agreed.",
        ["J. R. R. Tolkien wrote it.", "The U.S. Army agreed."],
    ),
    ('He said "Stop!" Then he left.', ['He said "Stop!"', "Then he left."]),
    ("(It ended.) Next one (really?) starts.", ["(It ended.)", "Next one (really?) starts."]),
    (
        "Pi is 3.14 exactly. See version 2.0.1 now.",
        ["Pi is 3.14 exactly.", "See version 2.0.1 now."],
    ),
    ("Wait... What?! No way... no.", ["Wait...", "What?!", "No way... no."]),
    ("It costs approx. five dollars. ok then", ["It costs approx. five dollars. ok then"]),
    (
        "Line one\ncontinues here. Next.\n\nNew paragraph",
        ["Line one continues here.", "Next.", "New paragraph"],
    ),
    ("  spaced   out.   ", ["spaced out."]),
    ("", []),
    (
        "我喜欢机器学习。东京是日本的首都！你好吗？",
        ["我喜欢机器学习。", "东京是日本的首都！", "你好吗？"],
    ),
    ("他说：「我很好。」然后走了。", ["他说：「我很好。」", "然后走了。"]),
    (
        "東京は日本の首都です。ひらがなとカタカナ！",
        ["東京は日本の首都です。", "ひらがなとカタカナ！"],
    ),
    ("Mixed English. 中文句子。More English?", ["Mixed English.", "中文句子。", "More English?"]),
]


@pytest.mark.parametrize("text, expected", SPLIT_CASES)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


# ----------------------------------------------------------------------------- formats


def test_google_format_documents_and_clean_report(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("First doc, line one.\nLine two.\n\n\n\nSecond doc.\n", encoding="utf-8")
    documents, report = read([path])
    assert documents == [["First doc, line one.", "Line two."], ["Second doc."]]
    assert report.files == 1 and report.documents == 2 and report.sentences == 3
    assert report.bytes == path.stat().st_size
    assert report.problems == {} and report.places == {}
    assert "no bad input" in str(report)


def test_bad_bytes_are_replaced_and_counted(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"Good line.\nBad \xff\xfe bytes here.\nAlso \xc3 bad.\n\nFine.\n")
    documents, report = read([path])
    assert documents == [
        ["Good line.", "Bad \ufffd\ufffd bytes here.", "Also \ufffd bad."],
        ["Fine."],
    ]
    assert report.invalid_utf8_lines == 2
    assert report.places["invalid_utf8_lines"] == [f"{path}:2", f"{path}:3"]


def test_control_characters_removed_and_emptied_documents_skipped(tmp_path):
    path = tmp_path / "ctrl.txt"
    text = "\ufeffOne\x00 two\x1b.\nThree\ufeff\x7f.\n\n\x01\x02\n\x03\n\nLast.\n"
    path.write_bytes(text.encode())
    documents, report = read([path])
    assert documents == [["One two.", "Three."], ["Last."]]
    # NUL, ESC, a BOM inside the text, DEL and 3 in the emptied document; the BOM that opens
    # the file only marks its encoding.
    assert report.control_chars_removed == 7
    assert report.empty_documents == 1
    assert report.places["control_chars_removed"] == [f"{path}:{n}" for n in (1, 2, 4, 5)]
    assert report.places["empty_documents"] == [f"{path}:4"]


def test_overlong_lines_are_split(tmp_path):
    words = " ".join(f"word{i}" for i in range(400))  # about 3,000 characters, no sentence end
    cjk = "漢" * 130  # no spaces at all: cut anywhere
    path = tmp_path / "long.txt"
    path.write_text(f"Short.\n{words}\n{cjk}\n", encoding="utf-8")
    documents, report = read([path], max_line_chars=100)
    (document,) = documents
    assert report.long_lines_split == 2
    assert all(len(s) <= 100 for s in document)
    assert " ".join(document[1:-2]) == words  # cut at spaces: no word is broken
    assert "".join(document[-2:]) == cjk


def test_file_without_line_breaks_is_read_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 4096)
    text = "".join(f"字{i} 🙂 word{i}" + (". " if i % 7 == 0 else " ") for i in range(20_000))
    path = tmp_path / "one_line.txt"
    path.write_text(text, encoding="utf-8")  # about 300 kB, no line break at all
    documents, report = read([path], max_line_chars=500)
    sentences = [s for d in documents for s in d]
    assert report.long_lines_split == 1 and report.invalid_utf8_lines == 0  # one line, in pieces
    assert all(len(s) <= 500 for s in sentences)
    assert "".join(sentences).replace(" ", "") == text.replace(" ", "")


def test_long_documents_are_split(tmp_path):
    path = tmp_path / "one_big_document.txt"
    path.write_text("".join(f"Sentence {i}.\n" for i in range(25)), encoding="utf-8")
    documents, report = read([path], max_document_sentences=10)
    assert [len(d) for d in documents] == [10, 10, 5]
    assert report.long_documents_split == 1 and report.documents == 3
    assert report.places["long_documents_split"] == [f"{path}:1"]


def test_json_lines_with_bad_lines(tmp_path):
    records = [
        json.dumps({"text": "First doc. It has two sentences.", "id": 1}),
        "{not json",
        json.dumps({"title": "no text field"}),
        json.dumps({"text": 42}),
        json.dumps(["a", "list"]),
        "",
        json.dumps({"text": "   "}),
        json.dumps({"text": "Second\u0000 doc。第二句。"}),
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(records) + "\n", encoding="utf-8")
    documents, report = read([path])
    assert documents == [["First doc.", "It has two sentences."], ["Second doc。", "第二句。"]]
    assert report.bad_json_lines == 2
    assert report.missing_text_lines == 2
    assert report.empty_documents == 1
    assert report.control_chars_removed == 1
    bad_json = report.places["bad_json_lines"]
    assert bad_json[0].startswith(f"{path}:2 (not JSON: Expecting property name")
    assert bad_json[1] == f"{path}:5 (a JSON list, not an object)"
    assert report.places["missing_text_lines"] == [
        f'{path}:{n} (no string field "text")' for n in (3, 4)
    ]
    assert report.places["empty_documents"] == [f"{path}:7"]
    assert report.places["control_chars_removed"] == [f"{path}:8"]


def test_gzip_is_read_transparently_and_truncated_gzip_keeps_what_was_read(tmp_path):
    text = "".join(f"Document {i} sentence.\nMore text {i}.\n\n" for i in range(3000))
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "From JSON. Compressed."}) + "\n")
    documents, report = read([tmp_path / "a.txt.gz", tmp_path / "b.jsonl.gz"])
    assert len(documents) == 3001 and documents[-1] == ["From JSON.", "Compressed."]
    json_line = json.dumps({"text": "From JSON. Compressed."}) + "\n"
    assert report.bytes == len(text.encode()) + len(json_line)
    data = (tmp_path / "a.txt.gz").read_bytes()
    (tmp_path / "cut.txt.gz").write_bytes(data[: len(data) // 2])
    documents, report = read([tmp_path / "cut.txt.gz"])
    assert 0 < len(documents) < 3000
    assert report.unreadable_files == 1
    assert report.places["unreadable_files"][0].startswith(f"{tmp_path / 'cut.txt.gz'} (EOFError")


def test_globs_and_directories_are_recursive_sorted_and_skip_hidden(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    for name in ["b/2.txt", "a/deep/1.txt", "a/0.txt", "b/1.txt", ".git/x.txt", "a/.hidden.txt"]:
        (tmp_path / name).write_text(f"From {name}.\n", encoding="utf-8")
    documents, report = read([tmp_path])
    assert [d[0] for d in documents] == [
        "From a/0.txt.",
        "From a/deep/1.txt.",
        "From b/1.txt.",
        "From b/2.txt.",
    ]
    documents, _ = read([str(tmp_path / "b" / "*.txt"), str(tmp_path / "**" / "1.txt")])
    # Sorted per pattern, and a file matched twice is read once.
    assert [d[0] for d in documents] == ["From b/1.txt.", "From b/2.txt.", "From a/deep/1.txt."]
    # A single path string is one path, not a sequence of characters.
    assert len(read(str(tmp_path / "a"))[0]) == 2
    assert expand_paths(tmp_path / "a") == sorted(expand_paths(tmp_path / "a"))


def test_missing_and_empty_inputs_raise_errors_naming_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        read([tmp_path / "nowhere.txt"])
    with pytest.raises(FileNotFoundError, match=r"\*\.nothing"):
        read([str(tmp_path / "*.nothing")])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="empty_dir"):
        read([tmp_path / "empty_dir"])
    with pytest.raises(ValueError, match="no input paths"):
        read([])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.txt"):
        read([empty])


def test_empty_file_among_others_is_counted(tmp_path):
    (tmp_path / "a.txt").write_text("Text.\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("", encoding="utf-8")
    documents, report = read([tmp_path])
    assert documents == [["Text."]] and report.files == 2 and report.empty_files == 1


def test_reading_is_streaming(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("".join(f"Doc {i}.\n\n" for i in range(10_000)), encoding="utf-8")
    report = InputReport()
    stream = read_documents([path], report)
    assert next(stream) == ["Doc 0."]
    assert report.documents == 1 and report.bytes < path.stat().st_size // 10
    stream.close()


def test_report_merge_dict_and_str():
    first = InputReport(files=1, documents=3)
    first.note("invalid_utf8_lines", "a.txt:1")
    first.note("invalid_utf8_lines", "a.txt:9", new_file=False)
    second = InputReport(files=2, documents=1)
    second.note("bad_json_lines", "b.jsonl:4 (not JSON)", count=5)
    second.note("invalid_utf8_lines", "c.txt:2")
    merged = first.merge(second)
    assert merged.files == 3 and merged.documents == 4
    assert merged.problems == {"invalid_utf8_lines": 3, "bad_json_lines": 5}
    assert merged.places["invalid_utf8_lines"] == ["a.txt:1", "a.txt:9", "c.txt:2"]
    assert merged.files_with == {"invalid_utf8_lines": 2, "bad_json_lines": 1}
    d = json.loads(json.dumps(merged.to_dict()))
    assert InputReport.from_dict(d) == merged
    assert InputReport.from_dict({**d, "errors": ["from an older manifest"]}) == merged
    assert str(merged).splitlines()[1:] == [
        "  invalid_utf8_lines: a.txt:1, a.txt:9, c.txt:2 (3 lines in 2 files)",
        "  bad_json_lines: b.jsonl:4 (not JSON), ... (5 lines in 1 file)",
    ]
    with pytest.raises(ValueError, match="'bad_lines' is not a kind of bad input"):
        merged.note("bad_lines", "x.txt:1")


def test_every_kind_of_bad_input_names_its_files_and_lines(tmp_path):
    """Each repaired or skipped kind lists its first places, then how many and in how many files."""
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("\n  \n\t\n", encoding="utf-8")
    (tmp_path / "long_line.txt").write_text("Short.\n" + "word " * 50 + "\n", encoding="utf-8")
    (tmp_path / "control.txt").write_text("Fine.\nBell\x07 rings.\n", encoding="utf-8")
    # 1000 lines with an invalid byte each: the first five are named, then the count.
    (tmp_path / "latin1.txt").write_bytes(b"Caf\xe9 au lait.\n\n" * 1000)
    (tmp_path / "long_doc.txt").write_text("\n\nOne.\nTwo.\nThree.\nFour.\n", encoding="utf-8")
    (tmp_path / "emptied.txt").write_text("Text.\n\n\x01\n", encoding="utf-8")
    (tmp_path / "records.jsonl").write_text('{"text": "Fine."}\n[1]\n{"id": 2}\n', encoding="utf-8")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    (tmp_path / "utf16.txt").write_bytes(codecs.BOM_UTF16_LE + "Wide text.\n".encode("utf-16-le"))
    data = gzip.compress(b"Document one.\n\n" * 10_000)
    (tmp_path / "truncated.txt.gz").write_bytes(data[: len(data) // 2])
    pq.write_table(pa.table({"body": ["No text column."]}), tmp_path / "table.parquet")
    rows = pa.table({"text": [f"Row {i}." for i in range(40)]})
    pq.write_table(rows, tmp_path / "groups.parquet", row_group_size=20)
    column = pq.ParquetFile(tmp_path / "groups.parquet").metadata.row_group(1).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    groups = bytearray((tmp_path / "groups.parquet").read_bytes())
    groups[start + 10 : start + column.total_compressed_size - 10] = b"\xab" * (
        column.total_compressed_size - 20
    )
    (tmp_path / "groups.parquet").write_bytes(bytes(groups))
    documents, report = read([tmp_path], max_line_chars=200, max_document_sentences=3)
    assert sorted(report.problems) == sorted(InputReport.kinds())
    lines = {line.split(":")[0].strip(): line for line in str(report).splitlines()[1:]}
    assert sorted(lines) == sorted(InputReport.kinds())

    def at(name, line=None):
        return f"{tmp_path / name}" + ("" if line is None else f":{line}")

    latin1 = ", ".join(at("latin1.txt", n) for n in range(1, 10, 2))
    assert (
        lines["invalid_utf8_lines"] == f"  invalid_utf8_lines: {latin1}, ... (1000 lines in 1 file)"
    )
    assert lines["control_chars_removed"] == (
        f"  control_chars_removed: {at('control.txt', 2)}, {at('emptied.txt', 3)} "
        "(2 characters in 2 files)"
    )
    assert (
        lines["empty_documents"]
        == f"  empty_documents: {at('emptied.txt', 3)} (1 document in 1 file)"
    )
    assert (
        lines["long_lines_split"]
        == f"  long_lines_split: {at('long_line.txt', 2)} (1 line in 1 file)"
    )
    assert lines["long_documents_split"] == (
        f"  long_documents_split: {at('long_doc.txt', 3)} (1 document in 1 file)"
    )
    assert lines["bad_json_lines"] == (
        f"  bad_json_lines: {at('records.jsonl', 2)} (a JSON list, not an object) "
        "(1 line in 1 file)"
    )
    assert lines["missing_text_lines"] == (
        f'  missing_text_lines: {at("records.jsonl", 3)} (no string field "text") '
        "(1 line in 1 file)"
    )
    assert (
        lines["utf16_utf32_files"] == f"  utf16_utf32_files: {at('utf16.txt')} (UTF-16-LE) (1 file)"
    )
    assert lines["binary_files"] == f"  binary_files: {at('image.png')} (a PNG image) (1 file)"
    # The binary file is not counted as empty, and the truncated one kept its first documents.
    assert lines["empty_files"] == f"  empty_files: {at('blank.txt')}, {at('empty.txt')} (2 files)"
    assert lines["unreadable_files"].startswith(
        f"  unreadable_files: {at('truncated.txt.gz')} (EOFError: "
    )
    assert lines["missing_text_columns"] == (
        f"  missing_text_columns: {at('table.parquet')} (no column 'text'; its columns: body) "
        "(1 file)"
    )
    assert lines["unreadable_row_groups"].startswith(
        f"  unreadable_row_groups: {at('groups.parquet', 'row group 1 of 2 (rows 21-40)')} ("
    )
    assert lines["unreadable_row_groups"].endswith("(1 row group in 1 file)")
    assert ["Wide text."] in documents and ["Fine."] in documents and ["Row 19."] in documents


# ----------------------------------------------------------------------------- binary files


def binary_samples(directory):
    """{file name: reason the report gives} for one file of each kind of binary input."""
    rng = np.random.default_rng(0)
    samples = {
        "image.png": (b"\x89PNG\r\n\x1a\n" + rng.bytes(3000), "a PNG image"),
        "photo.jpg": (b"\xff\xd8\xff\xe0" + rng.bytes(3000), "a JPEG image"),
        "anim.gif": (b"GIF89a" + rng.bytes(3000), "a GIF image"),
        "paper.pdf": (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" + rng.bytes(3000), "a PDF document"),
        "notes.txt": (gzip.compress(b"Hidden text.\n" * 100), "gzip data in a file not named .gz"),
        "program": (b"\x7fELF\x02\x01\x01" + bytes(200), "an ELF executable"),
        "random.bin": (rng.bytes(20_000), "not UTF-8 text: "),
        "wide_without_mark.txt": ("No byte-order mark.\n".encode("utf-16-le") * 50, "NUL bytes: "),
        "zeros.dat": (b"text" + bytes(100), "NUL bytes: 100 in the first 104 bytes"),
        "inner.png.gz": (gzip.compress(b"\x89PNG\r\n\x1a\n" + bytes(100)), "a PNG image"),
    }
    with zipfile.ZipFile(directory / "archive.zip", "w") as archive:
        archive.writestr("inside.txt", "Zipped text.\n" * 100)
    reasons = {"archive.zip": "a ZIP archive"}
    for name, (data, reason) in samples.items():
        (directory / name).write_bytes(data)
        reasons[name] = reason
    return reasons


def test_binary_files_are_skipped_and_named(tmp_path):
    reasons = binary_samples(tmp_path)
    (tmp_path / "good.txt").write_text("Good text.\nStill good.\n\nMore.\n", encoding="utf-8")
    # A stray NUL or a few bad bytes do not make a file binary: they are repaired.
    (tmp_path / "stray.txt").write_bytes(b"Stray\x00 NUL and caf\xe9.\n")
    documents, report = read([tmp_path])
    assert documents == [["Good text.", "Still good."], ["More."], ["Stray NUL and caf\ufffd."]]
    assert report.binary_files == len(reasons) and report.files == len(reasons) + 2
    assert report.empty_files == 0 and report.invalid_utf8_lines == 1
    named = {}
    for place in report.places["binary_files"]:
        path, reason = place.split(" (", 1)
        named[os.path.basename(path)] = reason[:-1]
    assert len(named) == MAX_PLACES  # the first few are named, the rest counted
    for name, reason in named.items():
        assert reason.startswith(reasons[name]), (name, reason)
    for name, reason in reasons.items():
        assert corpus.sniff(tmp_path / name)[0] == "", name
        assert corpus.sniff(tmp_path / name)[1].startswith(reason), name
    assert f"({len(reasons)} files)" in report.describe("binary_files")


def test_only_binary_input_fails_naming_the_files(tmp_path):
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(ValueError, match=r"holds no text.*image.png \(a PNG image\)"):
        read([tmp_path])


# ----------------------------------------------------------------------------- UTF-16 / UTF-32

WIDE_TEXT = "Ein Satz über Bären.\nZweiter Satz 🙂.\n\n日本語の文。\n"
WIDE_DOCUMENTS = [["Ein Satz über Bären.", "Zweiter Satz 🙂."], ["日本語の文。"]]


@pytest.mark.parametrize(
    "name, mark, codec",
    [
        ("UTF-16-LE", codecs.BOM_UTF16_LE, "utf-16-le"),
        ("UTF-16-BE", codecs.BOM_UTF16_BE, "utf-16-be"),
        ("UTF-32-LE", codecs.BOM_UTF32_LE, "utf-32-le"),
        ("UTF-32-BE", codecs.BOM_UTF32_BE, "utf-32-be"),
    ],
)
def test_utf16_and_utf32_with_a_byte_order_mark_are_decoded(tmp_path, name, mark, codec):
    data = mark + WIDE_TEXT.encode(codec)
    (tmp_path / "plain.txt").write_bytes(data)
    (tmp_path / "packed.txt.gz").write_bytes(gzip.compress(data))
    record = json.dumps({"text": "Aus JSON. Zweiter Satz."}, ensure_ascii=False) + "\n"
    (tmp_path / "records.jsonl").write_bytes(mark + record.encode(codec))
    documents, report = read([tmp_path])
    assert documents == WIDE_DOCUMENTS + WIDE_DOCUMENTS + [["Aus JSON.", "Zweiter Satz."]]
    assert report.problems == {"utf16_utf32_files": 3}
    assert report.places["utf16_utf32_files"] == [
        f"{tmp_path / file} ({name})" for file in ("packed.txt.gz", "plain.txt", "records.jsonl")
    ]
    assert report.bytes == 2 * len(data) + len(mark + record.encode(codec))


def test_utf16_long_lines_and_bad_code_units_are_repaired(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 64)  # read in pieces of 64 characters
    words = " ".join(f"wort{i}" for i in range(100))
    lone_surrogate = b"\x00\xd8"  # a high surrogate with no low one after it
    data = (
        codecs.BOM_UTF16_LE
        + "First.\n".encode("utf-16-le")
        + "Bad ".encode("utf-16-le")
        + lone_surrogate
        + " unit.\n".encode("utf-16-le")
        + f"{words}\n".encode("utf-16-le")
    )
    path = tmp_path / "wide.txt"
    path.write_bytes(data)
    (document,), report = read([path], max_line_chars=40)
    assert document[:2] == ["First.", "Bad \ufffd unit."]
    # Pieces are cut without regard to words, as for UTF-8 text.
    assert "".join(document[2:]).replace(" ", "") == words.replace(" ", "")
    assert all(len(s) <= 40 for s in document)
    assert report.places["invalid_utf8_lines"] == [f"{path}:2"]
    # Every piece of line 3 is longer than 40 characters: the line is counted once.
    assert report.places["long_lines_split"] == [f"{path}:3"] and report.long_lines_split == 1


# ----------------------------------------------------------------------------- demo corpus


def test_demo_corpus_builds_once_is_large_and_deterministic(demo_corpus):
    # The session's build (conftest.py's demo_corpus): a second whole build parses the
    # standard library again (seconds), so the byte-for-byte comparison of two builds is in
    # tests/integration/test_demo_corpus_runs.py; here the documents it starts with are drawn
    # twice and compared.
    path = demo_corpus
    assert path.stat().st_size >= 1_000_000
    mtime = path.stat().st_mtime_ns
    assert demo_corpus_path(path.parent) == path  # reused, not rebuilt
    assert path.stat().st_mtime_ns == mtime
    assert not [p for p in os.listdir(path.parent) if p.endswith(".tmp")]
    first = list(itertools.islice(demo_documents(), 60))
    assert list(itertools.islice(demo_documents(), 60)) == first
    documents, report = read([path])
    assert len(documents) > 300
    assert report.problems == {}
    assert documents[:60] == first
    assert documents[0][0] == 'The "assert" statement'  # the first pydoc topic
    assert all(line and line == line.strip() for d in documents[:50] for line in d)
