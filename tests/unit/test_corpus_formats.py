"""Corpora as they ship: parquet, zstd- and gzip-compressed JSON Lines, text fields and ids,
and the bad input of each, named."""

import codecs
import gzip
import io
import json
import pathlib
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertjax.data import corpus, formats, mixture, prepare
from bertjax.data.corpus import InputReport, ReadSettings, read_documents
from bertjax.data.demo_sources import write_sources
from bertjax.data.prepare import main as prepare_main

RECORDS = [
    {
        "id": f"doc-{i}",
        "text": f"Document {i} begins here. It has a second sentence about {i * 7} things.",
        "raw_content": f"Raw content {i}. Another line.",
        "meta": {"source": "web", "summary": f"Summary {i}. Short."},
    }
    for i in range(250)
]


def read(paths, **settings):
    report = InputReport()
    return list(read_documents(paths, report, settings=ReadSettings(**settings))), report


def json_lines(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def zstd_frames(data: bytes, frames: int = 3) -> bytes:
    """data compressed as several zstd frames (as some tools write long files)."""
    step = len(data) // frames + 1
    return b"".join(
        zstandard.ZstdCompressor(write_checksum=True).compress(data[i : i + step])
        for i in range(0, len(data), step)
    )


def write_parquet(path, records, row_group_size=60, **columns):
    table = pa.table(columns or {key: [r[key] for r in records] for key in records[0]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """The same records as JSON Lines and in each format a corpus ships in."""
    monkeypatch.setattr(corpus, "PARQUET_BATCH_ROWS", 16)  # several batches per row group
    data = json_lines(RECORDS)
    (tmp_path / "plain.jsonl").write_bytes(data)
    (tmp_path / "gz.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "gz.json.gz").write_bytes(gzip.compress(data))  # RedPajama-V2's naming
    (tmp_path / "pile.jsonl.zst").write_bytes(zstd_frames(data))
    (tmp_path / "dclm.jsonl.zstd").write_bytes(zstd_frames(data, frames=1))
    write_parquet(tmp_path / "web.parquet", RECORDS)
    return tmp_path


@pytest.mark.parametrize(
    "name", ["gz.jsonl.gz", "gz.json.gz", "pile.jsonl.zst", "dclm.jsonl.zstd", "web.parquet"]
)
def test_each_format_reads_the_documents_of_its_json_lines(shipped, name):
    expected, expected_report = read([shipped / "plain.jsonl"])
    documents, report = read([shipped / name])
    assert documents == expected and len(documents) == len(RECORDS)
    assert (report.documents, report.sentences) == (len(RECORDS), 2 * len(RECORDS))
    assert report.problems == {}
    if name != "web.parquet":  # compressed files count their decompressed bytes
        assert report.bytes == expected_report.bytes


@pytest.mark.parametrize("name", ["plain.jsonl", "pile.jsonl.zst", "web.parquet"])
@pytest.mark.parametrize(
    "field, first", [("raw_content", "Raw content 0."), ("meta.summary", "Summary 0.")]
)
def test_text_field_is_a_setting_with_dotted_paths_for_nested_fields(shipped, name, field, first):
    documents, report = read([shipped / name], text_field=field)
    assert len(documents) == len(RECORDS) and documents[0][0] == first
    assert report.problems == {}


def test_parquet_reads_only_the_text_and_id_columns(shipped, monkeypatch):
    asked = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, **kwargs):
        asked.append(kwargs["columns"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    read([shipped / "web.parquet"], text_field="meta.summary", id_field="id")
    assert asked and all(columns == ["id", "meta"] for columns in asked)
    assert len(asked) == 5  # one call per row group (250 rows in groups of 60)


def test_id_field_names_documents_in_the_report(tmp_path):
    records = [{"id": "a1", "text": "Fine."}, {"id": "b2", "body": "no text"}, {"text": 7}]
    (tmp_path / "x.jsonl.zst").write_bytes(zstd_frames(json_lines(records), frames=1))
    write_parquet(tmp_path / "y.parquet", [], key=["k1", "k2"], text=["Fine.", None])
    _, report = read([tmp_path / "x.jsonl.zst"], id_field="id")
    assert report.missing_text_lines == 2  # the JSON record with no id is named by line alone
    assert report.places["missing_text_lines"] == [
        f'{tmp_path / "x.jsonl.zst"}:2 [id b2] (no string field "text")',
        f'{tmp_path / "x.jsonl.zst"}:3 (no string field "text")',
    ]
    _, report = read([tmp_path / "y.parquet"], id_field="key")
    assert report.places["missing_text_lines"] == [
        f'{tmp_path / "y.parquet"}:row 2 [key k2] (null "text")'
    ]


def test_truncated_zstd_frame_names_the_file_and_offset_and_keeps_what_was_read(shipped):
    # Blocks of zstd's 128 KiB: a cut in the middle leaves whole blocks before it.
    rng = random.Random(0)  # text that compresses little, so that blocks are many
    records = [
        {"text": " ".join(f"{rng.getrandbits(40):x}" for _ in range(30)) + "."} for _ in range(2000)
    ]
    (shipped / "many.jsonl").write_bytes(json_lines(records))
    data = zstd_frames(json_lines(records), frames=1)
    cut = shipped / "cut.jsonl.zst"
    cut.write_bytes(data[: len(data) // 2])
    documents, report = read([cut])
    expected, _ = read([shipped / "many.jsonl"])
    assert 0 < len(documents) < len(records) and documents == expected[: len(documents)]
    assert report.unreadable_files == 1
    (place,) = report.places["unreadable_files"]
    assert place.startswith(f"{cut} (TruncatedFrameError: {cut}: truncated zstd frame: the frame")
    assert f"begins at byte 0 is cut off at byte {len(data) // 2}, the end of the file" in place
    # A cut in the last of several frames: the frames before it are read whole.
    frames = (shipped / "pile.jsonl.zst").read_bytes()
    cut.write_bytes(frames[:-10])
    documents, report = read([cut])
    assert len(documents) >= 2 * len(RECORDS) // 3 - 1 and report.unreadable_files == 1
    assert f"the frame that begins at byte {len(frames) - 10 - 1}" not in str(report)
    (place,) = report.places["unreadable_files"]
    assert f"is cut off at byte {len(frames) - 10}, the end of the file" in place


def test_corrupt_zstd_data_is_an_unreadable_file(tmp_path):
    data = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(json_lines(RECORDS)))
    data[-4:] = b"\0\0\0\0"  # the checksum no longer matches
    (tmp_path / "bad.jsonl.zst").write_bytes(bytes(data))
    (tmp_path / "good.jsonl").write_bytes(json_lines(RECORDS[:1]))
    _, report = read([tmp_path / "bad.jsonl.zst", tmp_path / "good.jsonl"])
    assert report.unreadable_files == 1
    assert "CorruptFrameError" in report.places["unreadable_files"][0]
    assert "corrupt zstd data in the frame that begins at byte 0" in str(report)


def test_zstd_stream_seeks_back_to_its_start(shipped):
    with formats.open_binary(shipped / "pile.jsonl.zst") as f:
        head = f.read(100)
        f.seek(0)
        assert f.read(100) == head and f.tell() == 100
        assert head + f.read() == json_lines(RECORDS)


def test_truncated_parquet_and_a_corrupt_row_group_are_named(shipped):
    data = (shipped / "web.parquet").read_bytes()
    (shipped / "cut.parquet").write_bytes(data[: len(data) // 2])
    documents, report = read([shipped / "cut.parquet", shipped / "plain.jsonl"])
    assert len(documents) == len(RECORDS)  # the run goes on with the other files
    assert report.unreadable_files == 1
    assert report.places["unreadable_files"][0].startswith(
        f"{shipped / 'cut.parquet'} (OSError: not a readable parquet file: Parquet magic bytes"
    )
    # Garbage in the text column of row group 1 (rows 61-120): that group alone is skipped.
    column = pq.ParquetFile(shipped / "web.parquet").metadata.row_group(1).column(1)
    assert column.path_in_schema == "text"
    start = column.dictionary_page_offset or column.data_page_offset
    corrupt = bytearray(data)
    corrupt[start + 20 : start + column.total_compressed_size - 20] = b"\xab" * (
        column.total_compressed_size - 40
    )
    (shipped / "bad.parquet").write_bytes(bytes(corrupt))
    documents, report = read([shipped / "bad.parquet"])
    expected, _ = read([shipped / "plain.jsonl"])
    assert documents == expected[:60] + expected[120:]
    assert report.unreadable_row_groups == 1
    assert report.places["unreadable_row_groups"][0].startswith(
        f"{shipped / 'bad.parquet'}:row group 1 of 5 (rows 61-120) ("
    )


def test_missing_text_column_names_the_columns_it_has(shipped):
    report = InputReport()
    with pytest.raises(ValueError, match="holds no text") as err:
        list(
            read_documents([shipped / "web.parquet"], report, settings=ReadSettings("auto", "body"))
        )
    expected = (
        f"{shipped / 'web.parquet'} (no column 'body'; its columns: id, text, raw_content, "
        "meta.source, meta.summary)"
    )
    assert report.places["missing_text_columns"] == [expected]
    assert expected in str(err.value)
    write_parquet(shipped / "ints.parquet", [], text=[1, 2])
    _, report = read([shipped / "ints.parquet", shipped / "plain.jsonl"])
    assert report.places["missing_text_columns"] == [
        f"{shipped / 'ints.parquet'} (column 'text' holds int64, not text)"
    ]


def test_mixed_encodings_in_one_source_are_decoded_or_repaired_and_counted(tmp_path):
    # A zstd file with one Latin-1 line among UTF-8 ones, a UTF-16 file, a parquet binary
    # column with a bad byte: every document is kept, each repair counted where it was made.
    lines = json_lines(RECORDS[:3]).replace(b"Document 1 ", b"Caf\xe9 1 ")
    (tmp_path / "a.jsonl.zst").write_bytes(zstd_frames(lines, frames=1))
    wide = codecs.BOM_UTF16_LE + json_lines(RECORDS[3:5]).decode().encode("utf-16-le")
    (tmp_path / "b.jsonl").write_bytes(wide)
    texts = [b"Binary column. Fine.", b"Bad byte \xff here."]
    write_parquet(tmp_path / "c.parquet", [], text=pa.array(texts, type=pa.binary()))
    documents, report = read([tmp_path])
    assert len(documents) == 7
    assert documents[1][0] == "Caf\ufffd 1 begins here."
    assert documents[6] == ["Bad byte \ufffd here."]
    assert report.invalid_utf8_lines == 2 and report.utf16_utf32_files == 1
    assert report.places["invalid_utf8_lines"] == [
        f"{tmp_path / 'a.jsonl.zst'}:2",
        f"{tmp_path / 'c.parquet'}:row 2",
    ]


def test_format_setting_overrides_the_name(tmp_path):
    (tmp_path / "records.txt.zst").write_bytes(zstd_frames(json_lines(RECORDS[:2]), frames=1))
    documents, _ = read([tmp_path / "records.txt.zst"], format="jsonl")
    assert documents[0] == ["Document 0 begins here.", "It has a second sentence about 0 things."]
    documents, _ = read([tmp_path / "records.txt.zst"])  # by name: text, a record per line
    assert documents[0][0].startswith('{"id": "doc-0"')
    assert formats.file_format("x/y.JSON.GZ") == "jsonl"
    assert formats.file_format("x/y.parquet") == "parquet"
    assert formats.file_format("x/y.txt.zstd") == "text"


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(format="csv"), r"format='csv' is invalid; choose one of \('auto', 'text'"),
        (dict(text_field=""), r"text_field='' is invalid; give the field that holds the text"),
        (dict(text_field="meta..x"), r"text_field='meta..x' is invalid; give a field name"),
        (dict(id_field="a."), r"id_field='a.' is invalid"),
    ],
)
def test_bad_read_settings_are_one_line_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        ReadSettings(**settings)


def test_field_value_prefers_a_dotted_key_then_walks_nested_fields():
    record = {"meta.x": "flat", "meta": {"x": "nested", "y": {"z": 3}}}
    assert corpus.field_value(record, "meta.x") == "flat"
    assert corpus.field_value(record, "meta.y.z") == 3
    assert corpus.field_value(record, "meta.q") is None
    assert corpus.field_value({"a": "s"}, "a.b") is None


def test_zstd_files_are_sniffed_decompressed(tmp_path):
    buffer = io.BytesIO(zstd_frames(b"Plain text.\n\nSecond document.\n", frames=1))
    (tmp_path / "t.txt.zst").write_bytes(buffer.getvalue())
    documents, report = read([tmp_path / "t.txt.zst"])
    assert documents == [["Plain text."], ["Second document."]] and report.problems == {}


def test_prepare_from_parquet_writes_the_shards_of_its_json_lines(shipped, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    kwargs = dict(max_seq_length=32, vocab_size=300, workers=1, eval_fraction=0.1, verbose=False)
    from_json = prepare([str(shipped / "plain.jsonl")], out / "json", **kwargs)
    from_parquet = prepare(
        [str(shipped / "web.parquet")],
        out / "parquet",
        read_settings=ReadSettings(text_field="text", id_field="id"),
        **kwargs,
    )
    assert from_parquet["splits"] == from_json["splits"]
    assert from_parquet["settings"]["id_field"] == "id"
    for split in ("train", "eval"):
        for name in sorted(p.name for p in (out / "json" / split).iterdir()):
            assert (out / "parquet" / split / name).read_bytes() == (
                out / "json" / split / name
            ).read_bytes()


def test_prepare_command_line_reads_a_nested_text_field(shipped, tmp_path):
    manifest = prepare_main(
        [
            "--input",
            str(shipped / "web.parquet"),
            "--output",
            str(tmp_path / "out"),
            "--text_field",
            "meta.summary",
            "--id_field",
            "id",
            "--format",
            "parquet",
            "--vocab_size",
            "300",
            "--workers",
            "1",
            "--max_seq_length",
            "32",
        ]
    )
    settings = manifest["settings"]
    assert (settings["format"], settings["text_field"], settings["id_field"]) == (
        "parquet",
        "meta.summary",
        "id",
    )
    assert manifest["input_report"]["documents"] == len(RECORDS)


def test_demo_sources_deal_documents_to_three_shipped_formats(tmp_path):
    documents = [[f"Document {i} one.", f"And two {i}."] for i in range(10)]
    sources = mixture.parse_sources(write_sources(documents, tmp_path))
    assert [(s.name, s.weight) for s in sources] == [("web", 0.6), ("books", 0.3), ("wiki", 0.1)]
    assert [pathlib.Path(s.paths[0]).name for s in sources] == [
        "web.parquet",
        "books.jsonl.zst",
        "wiki.json.gz",
    ]
    for slot, source in enumerate(sources):
        read, report = read_with(source)
        assert read == documents[slot::3] and report.problems == {}


def read_with(source):
    report = InputReport()
    return list(read_documents(list(source.paths), report, settings=source.read_settings)), report
