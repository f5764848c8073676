"""A three-source mixture in three shipped formats, made from a corpus (by default the demo one).

    python -m bertjax.data.demo_sources runs/demo_sources

deals the demo corpus's documents in turn to three sources and writes each as a corpus of that
kind ships: ``web.parquet`` (FineWeb's parquet, text in "text"), ``books.jsonl.zst`` (The
Pile's zstd JSON Lines) and ``wiki.json.gz`` (RedPajama-V2's gzipped JSON, text in
"raw_content"); it prints the ``data.sources`` setting that mixes them 0.6 / 0.3 / 0.1.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Iterable

import zstandard

from bertjax.data import formats
from bertjax.data.corpus import InputReport, read_documents
from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.storage import fs

# (name, file, weight, text field): a source of each format.
DEMO_SOURCES = (
    ("web", "web.parquet", 0.6, "text"),
    ("books", "books.jsonl.zst", 0.3, "text"),
    ("wiki", "wiki.json.gz", 0.1, "raw_content"),
)
# Rows per parquet row group: several groups even for a small corpus.
ROW_GROUP_ROWS = 500


def write_sources(documents: Iterable[list[str]], directory: str | os.PathLike) -> str:
    """Writes documents (lists of sentences), dealt in turn, as DEMO_SOURCES into directory;
    returns the data.sources setting of the three."""
    directory = fs.makedirs(directory)
    dealt: list[list[dict]] = [[] for _ in DEMO_SOURCES]
    for index, document in enumerate(documents):
        slot = index % len(DEMO_SOURCES)
        field = DEMO_SOURCES[slot][3]
        dealt[slot].append({"id": f"doc-{index}", field: " ".join(document)})
    pa, pq, _ = formats.pyarrow_modules()
    entries = []
    for (name, file, weight, field), records in zip(DEMO_SOURCES, dealt):
        path = directory / file
        if file.endswith(".parquet"):
            table = pa.table({key: [r[key] for r in records] for key in ("id", field)})
            with fs.errors(path, "write"), path.open("wb") as f:
                pq.write_table(table, f, row_group_size=ROW_GROUP_ROWS)
        else:
            lines = "".join(json.dumps(r) + "\n" for r in records).encode()
            compress = (
                zstandard.ZstdCompressor().compress if file.endswith(".zst") else gzip.compress
            )
            with fs.errors(path, "write"), path.open("wb") as f:
                f.write(compress(lines))
        entry = f"{name}={path}:{weight:g}"
        entries.append(entry + (f":text_field={field}" if field != "text" else "") + ":id_field=id")
    return ",".join(entries)


def demo_sources(directory: str | os.PathLike) -> str:
    """The demo corpus as DEMO_SOURCES in directory (written once); their data.sources."""
    directory = fs.path(directory)
    corpus = demo_corpus_path(directory)
    documents = read_documents([str(corpus)], InputReport())
    return write_sources(documents, directory)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bertjax.data.demo_sources DIRECTORY")
    print(demo_sources(sys.argv[1]))
