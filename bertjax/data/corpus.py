"""Streaming corpus reading: files, globs, directories, .gz, and a report of bad input.

Three formats (bertjax.data.formats tells them apart by name, or a source names one):
- google-research/bert's: plain text, one sentence per line, a blank line between documents.
- JSON Lines (files named *.jsonl or *.json): one document per line, an object whose text field
  (ReadSettings.text_field: "text", RedPajama's "raw_content", a dotted path such as
  "meta.summary" for a nested one) is split into sentences by bertjax.data.sentences.
- Parquet (*.parquet): one document per row, its text column read row group by row group in
  batches of rows, and no other column (but the id column, when one is named).
Text and JSON Lines may be compressed: .gz, or zstd's .zst / .zstd.

Text is UTF-8, or UTF-16 / UTF-32 when the file (decompressed) opens with a byte-order mark.

Bad input never stops the run: undecodable bytes become U+FFFD, control characters are
removed, empty documents are skipped, over-long lines are split, malformed JSON lines are
skipped, binary files (images, archives, executables, random bytes) are skipped, a parquet file
without the text column is skipped, an unreadable row group of a parquet file is skipped, and an
unreadable (e.g. truncated .gz or .zst, or not parquet at all) file keeps the documents read
before the error. Each kind is counted in an InputReport, which also names the first few files
and lines (rows, row groups; documents by their id when ReadSettings.id_field names one) where
it was found.
"""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import os
import pathlib
import re
import zlib
from collections.abc import Iterator, Sequence

from bertjax.data import formats
from bertjax.data.formats import open_binary
from bertjax.data.sentences import split_sentences
from bertjax.storage import fs
from bertjax.storage.textfile import BYTE_COUNT_CODEC, UTF8_BOM, sniff

DEFAULT_MAX_LINE_CHARS = 2000
DEFAULT_MAX_DOCUMENT_SENTENCES = 10_000
# Rows of a parquet row group converted to Python at a time: bounds memory whatever the size
# of the row groups (FineWeb's hold about a hundred thousand documents).
PARQUET_BATCH_ROWS = 1024
# A document's id is shown in the report up to this many characters.
MAX_ID_CHARS = 60
# The report names at most this many places (file, line) for each kind of bad input.
MAX_PLACES = 5
# Text-format lines are read in pieces of at most this many bytes, so that a file without line
# breaks never sits in memory whole; each piece is then split like any over-long line.
MAX_LINE_BYTES = 1 << 20

# C0/C1 control characters except tab, line feed and carriage return (whitespace), plus the
# byte-order mark and interlinear annotation marks, which carry no text.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufeff\ufff9-\ufffb]")


def _kind(unit: str):
    """A count field of InputReport that is a kind of bad input, counted in unit."""
    return dataclasses.field(default=0, metadata={"unit": unit})


@dataclasses.dataclass
class InputReport:
    """Counts of what was read and of each kind of bad input that was repaired or skipped.

    For each kind, ``places`` keeps the first few places it was found ("path:line" or "path",
    with a reason in parentheses where one helps) and ``files_with`` how many files had it.
    """

    files: int = 0
    bytes: int = 0
    documents: int = 0
    sentences: int = 0
    # Lines whose undecodable bytes were replaced by U+FFFD.
    invalid_utf8_lines: int = _kind("lines")
    control_chars_removed: int = _kind("characters")
    empty_documents: int = _kind("documents")  # nothing left after cleaning, skipped
    long_lines_split: int = _kind("lines")  # longer than max_line_chars, split into pieces
    long_documents_split: int = _kind("documents")  # over max_document_sentences, split
    bad_json_lines: int = _kind("lines")  # JSON Lines input: not a JSON object, skipped
    # JSON Lines or parquet input: no string text field (or a null one), skipped
    missing_text_lines: int = _kind("lines")
    missing_text_columns: int = _kind("files")  # parquet without the text column, skipped
    unreadable_row_groups: int = _kind("row groups")  # parquet, skipped (the rest is read)
    utf16_utf32_files: int = _kind("files")  # decoded from UTF-16 or UTF-32 (byte-order mark)
    binary_files: int = _kind("files")  # not text (a known format, NUL or undecodable bytes)
    empty_files: int = _kind("files")  # held no document
    unreadable_files: int = _kind("files")  # failed while reading (documents before it kept)
    places: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    files_with: dict[str, int] = dataclasses.field(default_factory=dict)

    @staticmethod
    def kinds() -> list[str]:
        """Names of the count fields that are kinds of bad input."""
        return list(_UNITS)

    def note(self, kind: str, place: str, *, count: int = 1, new_file: bool = True) -> None:
        """Counts count of kind at place ("path:line" or "path (reason)").

        new_file says that place is in a file not yet counted for this kind.
        """
        if kind not in _UNITS:
            raise ValueError(f"{kind!r} is not a kind of bad input; choose one of {list(_UNITS)}")
        setattr(self, kind, getattr(self, kind) + count)
        places = self.places.setdefault(kind, [])
        if len(places) < MAX_PLACES and (not places or places[-1] != place):
            places.append(place)
        if new_file:
            self.files_with[kind] = self.files_with.get(kind, 0) + 1

    def to_dict(self) -> dict:
        """A JSON-serialisable copy."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> InputReport:
        """Rebuilds a report from to_dict's output (fields it does not know are ignored)."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in d.items() if name in names})

    def merge(self, other: InputReport) -> InputReport:
        """Adds other's counts into self (e.g. from parallel workers) and returns self."""
        for field in dataclasses.fields(self):
            if field.name == "places":
                for kind, places in other.places.items():
                    mine = self.places.setdefault(kind, [])
                    mine.extend(places[: MAX_PLACES - len(mine)])
            elif field.name == "files_with":
                for kind, count in other.files_with.items():
                    self.files_with[kind] = self.files_with.get(kind, 0) + count
            else:
                setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))
        return self

    @property
    def problems(self) -> dict[str, int]:
        """The non-zero counts of bad input."""
        return {kind: getattr(self, kind) for kind in self.kinds() if getattr(self, kind)}

    def describe(self, kind: str) -> str:
        """One line for kind: its first places, then its counts."""
        unit = _UNITS[kind]
        count = getattr(self, kind)
        counts = f"{count} {unit if count != 1 else unit[:-1]}"
        files = self.files_with.get(kind, 0)
        if unit != "files" and files:
            counts += f" in {files} file{'s' if files != 1 else ''}"
        places = self.places.get(kind, [])
        # A count of characters says nothing of how many lines held them.
        hidden = len(places) == MAX_PLACES if unit == "characters" else len(places) < count
        return f"{kind}: {', '.join(places)}{', ...' if hidden else ''} ({counts})"

    def __str__(self) -> str:
        head = (
            f"input: {self.files} files, {self.bytes / 1e6:.1f} MB, {self.documents} documents, "
            f"{self.sentences} sentences"
        )
        problems = self.problems
        if not problems:
            return head + "; no bad input"
        return "\n".join(
            [head + "; repaired or skipped:"] + ["  " + self.describe(k) for k in problems]
        )


_UNITS = {
    f.name: f.metadata["unit"] for f in dataclasses.fields(InputReport) if "unit" in f.metadata
}


def expand_paths(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
) -> list[fs.AnyPath]:
    """Files named by paths: files, globs, directories (recursive); sorted and de-duplicated.

    Local paths and `gs://` ones alike (a `gs://` directory is a prefix of object names).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ValueError("no input paths given; pass files, globs or directories")
    files: list[fs.AnyPath] = []
    for raw in paths:
        path = os.fspath(raw)
        if fs.is_remote(path):
            found = _remote_files(path)
        elif os.path.isdir(path):
            found = _files_under(pathlib.Path(path))
        elif os.path.isfile(path):
            found = [pathlib.Path(path)]
        elif glob.has_magic(path):
            found = []
            for match in sorted(glob.glob(path, recursive=True)):
                if os.path.isdir(match):
                    found.extend(_files_under(pathlib.Path(match)))
                elif os.path.isfile(match):
                    found.append(pathlib.Path(match))
            if not found:
                raise FileNotFoundError(f"input glob {path!r} matches no files")
        else:
            raise FileNotFoundError(f"input path {path!r} does not exist")
        if not found:
            raise FileNotFoundError(f"input directory {path!r} contains no files")
        files.extend(found)
    unique: dict[fs.AnyPath, None] = {}
    for file in files:
        unique.setdefault(file, None)
    return list(unique)


def _remote_files(path: str) -> list[fs.AnyPath]:
    """Files named by a `gs://` file, glob or directory (prefix), as expand_paths finds them."""
    fs.path(path)  # a gs:// path without the gcs extra ends here, in one line
    if glob.has_magic(path[len(fs.GCS_SCHEME) :]):
        found: list[fs.AnyPath] = []
        for match in fs.glob(path):
            if fs.is_file(match):
                found.append(fs.path(match))
            else:
                found.extend(fs.files_under(match))
        if not found:
            fs.require_bucket(path)
            raise FileNotFoundError(f"input glob {path!r} matches no files")
        return found
    if fs.is_file(path):
        return [fs.path(path)]
    if fs.is_dir(path):
        return fs.files_under(path)
    fs.require_bucket(path)
    raise FileNotFoundError(f"input path {path!r} does not exist")


@dataclasses.dataclass(frozen=True)
class ReadSettings:
    """How a corpus's files are read: their format and where the text (and an id) lies."""

    format: str = "auto"  # one of formats.FORMATS; "auto": by each file's name
    text_field: str = "text"  # JSON Lines field or parquet column; a dotted path for nested
    id_field: str = ""  # names documents in the report (JSON Lines, parquet); "": none

    def __post_init__(self):
        if self.format not in formats.FORMATS:
            raise ValueError(f"format={self.format!r} is invalid; choose one of {formats.FORMATS}")
        for name in ("text_field", "id_field"):
            value = getattr(self, name)
            if not isinstance(value, str) or (value and "" in value.split(".")):
                raise ValueError(
                    f"{name}={value!r} is invalid; give a field name or a dotted path such as "
                    "'meta.text'"
                )
        if not self.text_field:
            raise ValueError("text_field='' is invalid; give the field that holds the text")


def field_value(record: dict, dotted: str):
    """record's value at a field name or a dotted path of nested fields (None when absent).

    A key that itself holds dots is found before the nested path it could also mean.
    """
    if dotted in record:
        return record[dotted]
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _files_under(directory: pathlib.Path) -> list[pathlib.Path]:
    # Hidden files and directories (".git", ".DS_Store") are never corpus text.
    return sorted(
        file
        for file in directory.rglob("*")
        if file.is_file() and not any(p.startswith(".") for p in file.relative_to(directory).parts)
    )


def read_documents(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    report: InputReport,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    max_document_sentences: int = DEFAULT_MAX_DOCUMENT_SENTENCES,
    settings: ReadSettings | None = None,
) -> Iterator[list[str]]:
    """Streams documents (lists of sentences) from files, globs or directories into report.

    settings: the files' format and text field (default: by name, "text").
    """
    if max_line_chars < 16:
        raise ValueError(f"max_line_chars={max_line_chars} is too small; use at least 16")
    if max_document_sentences < 1:
        raise ValueError(f"max_document_sentences={max_document_sentences} must be >= 1")
    files = expand_paths(paths)
    reader = _Reader(report, max_line_chars, max_document_sentences, settings or ReadSettings())
    yielded = 0
    for file in files:
        for document in reader.file_documents(file):
            yielded += 1
            yield document
    if yielded == 0:
        names = ", ".join(repr(str(f)) for f in files[:5]) + (" ..." if len(files) > 5 else "")
        found = "; ".join(report.describe(kind) for kind in report.problems)
        raise ValueError(
            f"input {names} holds no text: no documents were found"
            + (f" ({found})" if found else "")
        )


class _Reader:
    """Line cleaning shared by both formats; updates the report as it goes."""

    def __init__(
        self,
        report: InputReport,
        max_line_chars: int,
        max_document_sentences: int,
        settings: ReadSettings,
    ):
        self.report = report
        self.settings = settings
        self.document_id = ""  # the id of the record being read, when the settings name a field
        self.max_line_chars = max_line_chars
        self.max_document_sentences = max_document_sentences
        self.path = ""
        self._kinds_in_file: set[str] = set()
        self._last_place: dict[str, str] = {}  # per kind
        self.line = 0  # the number of the line that _lines read last

    def _note(self, kind: str, line: int | str | None = None, reason: str = "", count: int = 1):
        """Counts bad input of kind in the current file, at a line (or "row N") when given."""
        place = self.path if line is None else f"{self.path}:{line}"
        if self.document_id and line is not None:
            place += f" [{self.settings.id_field} {self.document_id}]"
        if reason:
            place += f" ({reason})"
        if _UNITS[kind] == "lines" and self._last_place.get(kind) == place:
            return  # another piece of a line already counted
        self._last_place[kind] = place
        new_file = kind not in self._kinds_in_file
        self._kinds_in_file.add(kind)
        self.report.note(kind, place, count=count, new_file=new_file)

    def file_documents(self, path: pathlib.Path) -> Iterator[list[str]]:
        """The documents of one file; a binary or unreadable file is counted, not raised."""
        self.path = str(path)
        self._kinds_in_file = set()
        self.report.files += 1
        self.document_id = ""
        yielded = 0
        try:
            format = formats.file_format(path, self.settings.format)
            if format == "parquet":
                documents = self.parquet_documents(path)
            else:
                encoding, detail = sniff(path, open_binary)
                if not encoding:
                    self._note("binary_files", reason=detail)
                    return
                if encoding != "utf-8":
                    self._note("utf16_utf32_files", reason=detail)
                read = self.json_documents if format == "jsonl" else self.text_documents
                documents = read(path, encoding)
            for document in documents:
                yielded += 1
                yield document
        except (OSError, EOFError, zlib.error) as err:
            self._note("unreadable_files", reason=f"{type(err).__name__}: {err}")
        # A parquet file without the text column is counted as that alone.
        if yielded == 0 and "missing_text_columns" not in self._kinds_in_file:
            self._note("empty_files")

    def _lines(
        self, path: pathlib.Path, encoding: str, max_bytes: int | None
    ) -> Iterator[str | None]:
        """The decoded, control-free lines of a (possibly gzipped) file; self.line numbers them.

        None stands for a line that held only control characters: it is neither text nor a
        document separator. With max_bytes, longer lines come in pieces (with one number).
        """
        self.line = 0
        with open_binary(path) as f:
            if encoding == "utf-8":
                pieces = self._utf8_pieces(f, max_bytes)
            else:
                pieces = self._wide_pieces(f, encoding, max_bytes)
            for line in pieces:
                if _CONTROL.search(line):
                    line, removed = _CONTROL.subn("", line)
                    self._note("control_chars_removed", self.line, count=removed)
                    if not line.strip():
                        yield None
                        continue
                yield line

    def _utf8_pieces(self, f, max_bytes: int | None) -> Iterator[str]:
        """Lines of a UTF-8 file; with max_bytes, long lines in pieces cut between characters.

        Undecodable bytes become U+FFFD. Counts bytes, numbers lines (self.line).
        """
        report = self.report
        if f.read(len(UTF8_BOM)) == UTF8_BOM:
            report.bytes += len(UTF8_BOM)  # the file's encoding mark, not text
        else:
            f.seek(0)
        line_start = True  # whether the next piece begins a line
        carry = b""
        while True:
            raw = carry + (f.readline(max_bytes) if max_bytes else f.readline())
            carry = b""
            if not raw:
                return
            if max_bytes and not raw.endswith(b"\n") and len(raw) >= max_bytes:
                # An incomplete UTF-8 character (lead + continuation bytes) goes to the next piece.
                cut = len(raw) - 1
                while cut > len(raw) - 4 and raw[cut] & 0xC0 == 0x80:
                    cut -= 1
                if raw[cut] >= 0xC0:
                    raw, carry = raw[:cut], raw[cut:]
            report.bytes += len(raw)
            self.line += line_start
            line_start = raw.endswith(b"\n")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = raw.decode("utf-8", errors="replace")
                self._note("invalid_utf8_lines", self.line)
            yield line

    def _wide_pieces(self, f, encoding: str, max_chars: int | None) -> Iterator[str]:
        """_utf8_pieces for UTF-16 / UTF-32: a bad code unit becomes U+FFFD and marks its line."""
        report = self.report
        # newline="\n": lines end where UTF-8 lines end, nowhere else, and keep their ending.
        text = io.TextIOWrapper(f, encoding=encoding, errors="replace", newline="\n")
        count_codec = BYTE_COUNT_CODEC[encoding]
        report.bytes += len("\ufeff".encode(count_codec))  # the codec consumes the mark
        line_start = True
        while piece := text.readline(-1 if max_chars is None else max_chars):
            report.bytes += len(piece.encode(count_codec, errors="replace"))
            self.line += line_start
            line_start = piece.endswith("\n")
            if "\ufffd" in piece:
                self._note("invalid_utf8_lines", self.line)
            yield piece

    def _split_long(self, sentence: str, line: int) -> list[str]:
        """Pieces of at most max_line_chars, cut at sentence ends, else spaces, else anywhere."""
        limit = self.max_line_chars
        self._note("long_lines_split", line)
        pieces: list[str] = []
        for part in split_sentences(sentence):
            while len(part) > limit:
                cut = part.rfind(" ", limit // 2, limit + 1)
                cut = cut if cut > 0 else limit
                pieces.append(part[:cut].rstrip())
                part = part[cut:].lstrip()
            if part:
                pieces.append(part)
        return pieces

    def _emit(self, document: list[str], line: int) -> Iterator[list[str]]:
        """Yields a finished document that began at line, split if it is too long, counting it."""
        report = self.report
        limit = self.max_document_sentences
        if len(document) > limit:
            self._note("long_documents_split", line)
        for start in range(0, len(document), limit):
            part = document[start : start + limit]
            report.documents += 1
            report.sentences += len(part)
            yield part

    def text_documents(self, path: pathlib.Path, encoding: str) -> Iterator[list[str]]:
        """google-research/bert's format: a sentence per line, blank line between documents."""
        limit = self.max_line_chars
        document: list[str] = []
        start = 0  # the line the document began on
        emptied = False  # the document so far had lines, all of them cleaned away
        split = False  # the document was already flushed in part
        for line in self._lines(path, encoding, MAX_LINE_BYTES):
            if not start:
                start = self.line
            if line is None:
                emptied = not document
                continue
            line = line.strip()
            if not line:
                if document:
                    yield from self._emit(document, start)
                elif emptied:
                    self._note("empty_documents", start)
                document, emptied, start, split = [], False, 0, False
                continue
            if len(document) >= self.max_document_sentences:
                # Flush early so that a file without blank lines never sits in memory whole.
                if not split:
                    self._note("long_documents_split", start)
                yield from self._emit(document, start)
                document, split = [], True
            if len(line) > limit:
                document.extend(self._split_long(line, self.line))
            else:
                document.append(line)
        if document:
            yield from self._emit(document, start)
        elif emptied:
            self._note("empty_documents", start)

    def json_documents(self, path: pathlib.Path, encoding: str) -> Iterator[list[str]]:
        """JSON Lines: one object per line with a text field, split into sentences."""
        text_field, id_field = self.settings.text_field, self.settings.id_field
        # A JSON record must be parsed whole: its line is read whole.
        for line in self._lines(path, encoding, None):
            line_number = self.line
            if line is None or not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                self._note("bad_json_lines", line_number, f"not JSON: {err}")
                continue
            if not isinstance(record, dict):
                kind = type(record).__name__
                self._note("bad_json_lines", line_number, f"a JSON {kind}, not an object")
                continue
            self.document_id = _shown_id(field_value(record, id_field)) if id_field else ""
            text = field_value(record, text_field)
            if not isinstance(text, str):
                self._note("missing_text_lines", line_number, f'no string field "{text_field}"')
                continue
            yield from self._text_document(text, line_number)
        self.document_id = ""

    def _text_document(self, text: str, line: int | str) -> Iterator[list[str]]:
        """One record's text (JSON Lines, parquet) as a document, cleaned and counted."""
        limit = self.max_line_chars
        # JSON escapes (and parquet's strings) can hold control characters no line cleaned.
        if _CONTROL.search(text):
            text, removed = _CONTROL.subn("", text)
            self._note("control_chars_removed", line, count=removed)
        document: list[str] = []
        for sentence in split_sentences(text):
            if len(sentence) > limit:
                document.extend(self._split_long(sentence, line))
            else:
                document.append(sentence)
        if document:
            yield from self._emit(document, line)
        else:
            self._note("empty_documents", line)

    def parquet_documents(self, path: pathlib.Path) -> Iterator[list[str]]:
        """Parquet: one document per row; only the text (and id) column is read, a row group
        at a time in batches of PARQUET_BATCH_ROWS rows. An unreadable row group is skipped and
        named; the rows after it are still read."""
        pa, pq, pc = formats.pyarrow_modules()
        text_field, id_field = self.settings.text_field, self.settings.id_field
        remote = fs.is_remote(path)
        if remote:
            with fs.errors(path, "read"):
                source = fs.path(path).open("rb")
        else:
            source = str(path)
        try:
            try:
                parquet = pq.ParquetFile(source)
            except (pa.ArrowException, OSError) as err:
                reason = " ".join(str(err).split())
                raise OSError(f"not a readable parquet file: {reason}") from None
            schema = parquet.schema_arrow
            text_path = _column_path(pa, schema, text_field)
            if text_path is None:
                columns = ", ".join(_column_names(pa, schema)) or "none"
                self._note(
                    "missing_text_columns",
                    reason=f"no column {text_field!r}; its columns: {columns}",
                )
                return
            text_type = _column_type(schema, text_path)
            if not (_is_string(pa, text_type) or _is_binary(pa, text_type)):
                self._note(
                    "missing_text_columns",
                    reason=f"column {text_field!r} holds {text_type}, not text",
                )
                return
            id_path = _column_path(pa, schema, id_field) if id_field else None
            columns = sorted({text_path[0]} | ({id_path[0]} if id_path else set()))
            row = 0
            groups = parquet.metadata.num_row_groups
            for group in range(groups):
                group_rows = parquet.metadata.row_group(group).num_rows
                first_row = row
                try:
                    batches = parquet.iter_batches(
                        batch_size=PARQUET_BATCH_ROWS, row_groups=[group], columns=columns
                    )
                    for batch in batches:
                        texts = _values(pc, batch, text_path)
                        self.report.bytes += int(pc.sum(pc.binary_length(texts)).as_py() or 0)
                        ids = _values(pc, batch, id_path).to_pylist() if id_path else None
                        for i, text in enumerate(texts.to_pylist()):
                            row += 1
                            self.document_id = _shown_id(ids[i]) if ids else ""
                            yield from self._row_document(text, row, text_field)
                        self.document_id = ""
                except (pa.ArrowException, OSError) as err:
                    self.document_id = ""
                    reason = f"{type(err).__name__}: {' '.join(str(err).split())}"
                    self._note(
                        "unreadable_row_groups",
                        f"row group {group} of {groups} (rows {first_row + 1}-"
                        f"{first_row + group_rows})",
                        reason,
                    )
                    row = first_row + group_rows
        finally:
            if remote:
                source.close()

    def _row_document(self, text, row: int, text_field: str) -> Iterator[list[str]]:
        """A parquet row's text (str, bytes or None) as a document."""
        place = f"row {row}"
        if text is None:
            self._note("missing_text_lines", place, f'null "{text_field}"')
            return
        if isinstance(text, bytes):  # a binary column: meant to be UTF-8, not checked by parquet
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                text = text.decode("utf-8", errors="replace")
                self._note("invalid_utf8_lines", place)
        yield from self._text_document(text, place)


def _shown_id(value) -> str:
    """A document id as the report shows it (empty when the record has none)."""
    if value is None:
        return ""
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_ID_CHARS else text[: MAX_ID_CHARS - 3] + "..."


def _column_path(pa, schema, dotted: str) -> list[str] | None:
    """The names leading to a (possibly nested) parquet column, or None when it has none."""
    if dotted in schema.names:
        return [dotted]
    parts = dotted.split(".")
    if parts[0] not in schema.names:
        return None
    type_ = schema.field(parts[0]).type
    for part in parts[1:]:
        if not pa.types.is_struct(type_) or type_.get_field_index(part) < 0:
            return None
        type_ = type_.field(part).type
    return parts


def _column_type(schema, path: list[str]):
    type_ = schema.field(path[0]).type
    for part in path[1:]:
        type_ = type_.field(part).type
    return type_


def _column_names(pa, schema) -> list[str]:
    """Every column, nested ones as dotted paths (what a text field may name)."""

    def names(prefix: str, type_) -> list[str]:
        if not pa.types.is_struct(type_):
            return [prefix]
        return [n for f in type_ for n in names(f"{prefix}.{f.name}", f.type)]

    return [n for field in schema for n in names(field.name, field.type)]


def _is_string(pa, type_) -> bool:
    return (
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or (pa.types.is_string_view(type_))
    )


def _is_binary(pa, type_) -> bool:
    return pa.types.is_binary(type_) or pa.types.is_large_binary(type_)


def _values(pc, batch, path: list[str]):
    """A batch's values of a (possibly nested) column."""
    values = batch.column(path[0])
    for part in path[1:]:
        values = pc.struct_field(values, part)
    return values
