"""Corpus reading, the input report, the sentence splitter and the demo corpus."""

import gzip
import json
import os

import pytest

from bertjax.data import corpus
from bertjax.data.corpus import InputReport, expand_paths, read_documents
from bertjax.data.demo_corpus import demo_corpus_path
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
    assert report.problems == {}
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


def test_control_characters_removed_and_emptied_documents_skipped(tmp_path):
    path = tmp_path / "ctrl.txt"
    path.write_bytes("\ufeffOne\x00 two\x1b.\nThree\x7f.\n\n\x01\x02\n\x03\n\nLast.\n".encode())
    documents, report = read([path])
    assert documents == [["One two.", "Three."], ["Last."]]
    assert report.control_chars_removed == 7  # BOM, NUL, ESC, DEL and 3 in the emptied document
    assert report.empty_documents == 1


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
    assert report.long_lines_split > 60 and report.invalid_utf8_lines == 0
    assert all(len(s) <= 500 for s in sentences)
    assert "".join(sentences).replace(" ", "") == text.replace(" ", "")


def test_long_documents_are_split(tmp_path):
    path = tmp_path / "one_big_document.txt"
    path.write_text("".join(f"Sentence {i}.\n" for i in range(25)), encoding="utf-8")
    documents, report = read([path], max_document_sentences=10)
    assert [len(d) for d in documents] == [10, 10, 5]
    assert report.long_documents_split == 2 and report.documents == 3


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
    assert any("docs.jsonl:2" in message for message in report.errors)


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
    assert report.unreadable_files == 1 and "cut.txt.gz" in report.errors[0]


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
    first = InputReport(files=1, documents=3, invalid_utf8_lines=2, errors=["x"])
    second = InputReport(files=2, documents=1, bad_json_lines=5, errors=["y"])
    merged = first.merge(second)
    assert merged.files == 3 and merged.documents == 4
    assert merged.problems == {"invalid_utf8_lines": 2, "bad_json_lines": 5}
    d = json.loads(json.dumps(merged.to_dict()))
    assert InputReport.from_dict(d) == merged
    text = str(merged)
    assert "invalid_utf8_lines: 2" in text and "bad_json_lines: 5" in text and "y" in text


# ----------------------------------------------------------------------------- demo corpus


def test_demo_corpus_builds_once_is_large_and_deterministic(tmp_path):
    path = demo_corpus_path(tmp_path / "cache")
    assert path.stat().st_size >= 1_000_000
    mtime = path.stat().st_mtime_ns
    assert demo_corpus_path(tmp_path / "cache") == path  # reused, not rebuilt
    assert path.stat().st_mtime_ns == mtime
    rebuilt = demo_corpus_path(tmp_path / "other")
    assert rebuilt.read_bytes() == path.read_bytes()
    assert not [p for p in os.listdir(tmp_path / "cache") if p.endswith(".tmp")]
    documents, report = read([path])
    assert len(documents) > 300
    assert report.problems == {}
    assert documents[0][0] == 'The "assert" statement'  # the first pydoc topic
    assert all(line and line == line.strip() for d in documents[:50] for line in d)
