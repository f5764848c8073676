"""Streaming corpus reading: files, globs, directories, .gz, and a report of bad input.

Two formats:
- google-research/bert's: plain text, one sentence per line, a blank line between documents.
- JSON Lines (files named *.jsonl or *.json, optionally .gz): one document per line, an object
  with a "text" field that is split into sentences by bertjax.data.sentences.

Text is UTF-8, or UTF-16 / UTF-32 when the file (after gunzipping) opens with a byte-order mark.

Bad input never stops the run: undecodable bytes become U+FFFD, control characters are
removed, empty documents are skipped, over-long lines are split, malformed JSON lines are
skipped, binary files (images, archives, executables, random bytes) are skipped, and an
unreadable (e.g. truncated .gz) file keeps the documents read before the error. Each kind is
counted in an InputReport, which also names the first few files and lines where it was found.
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

from bertjax import fs
from bertjax.data.sentences import split_sentences
from bertjax.textfile import BYTE_COUNT_CODEC, UTF8_BOM, sniff
from bertjax.textfile import open_binary as _open_binary

DEFAULT_MAX_LINE_CHARS = 2000
DEFAULT_MAX_DOCUMENT_SENTENCES = 10_000
JSON_SUFFIXES = (".jsonl", ".json")
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
    missing_text_lines: int = _kind("lines")  # JSON Lines input: no string "text" field, skipped
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


def _files_under(directory: pathlib.Path) -> list[pathlib.Path]:
    # Hidden files and directories (".git", ".DS_Store") are never corpus text.
    return sorted(
        file
        for file in directory.rglob("*")
        if file.is_file() and not any(p.startswith(".") for p in file.relative_to(directory).parts)
    )


def is_json_lines(path: pathlib.Path) -> bool:
    """Whether path is read as JSON Lines (by its name, ignoring a .gz suffix)."""
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return name.endswith(JSON_SUFFIXES)


def read_documents(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    report: InputReport,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    max_document_sentences: int = DEFAULT_MAX_DOCUMENT_SENTENCES,
) -> Iterator[list[str]]:
    """Streams documents (lists of sentences) from files, globs or directories into report."""
    if max_line_chars < 16:
        raise ValueError(f"max_line_chars={max_line_chars} is too small; use at least 16")
    if max_document_sentences < 1:
        raise ValueError(f"max_document_sentences={max_document_sentences} must be >= 1")
    files = expand_paths(paths)
    reader = _Reader(report, max_line_chars, max_document_sentences)
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

    def __init__(self, report: InputReport, max_line_chars: int, max_document_sentences: int):
        self.report = report
        self.max_line_chars = max_line_chars
        self.max_document_sentences = max_document_sentences
        self.path = ""
        self._kinds_in_file: set[str] = set()
        self._last_place: dict[str, str] = {}  # per kind
        self.line = 0  # the number of the line that _lines read last

    def _note(self, kind: str, line: int | None = None, reason: str = "", count: int = 1):
        """Counts bad input of kind in the current file, at a line when given."""
        place = self.path if line is None else f"{self.path}:{line}"
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
        yielded = 0
        try:
            encoding, detail = sniff(path)
            if not encoding:
                self._note("binary_files", reason=detail)
                return
            if encoding != "utf-8":
                self._note("utf16_utf32_files", reason=detail)
            read = self.json_documents if is_json_lines(path) else self.text_documents
            for document in read(path, encoding):
                yielded += 1
                yield document
        except (OSError, EOFError, zlib.error) as err:
            self._note("unreadable_files", reason=f"{type(err).__name__}: {err}")
        if yielded == 0:
            self._note("empty_files")

    def _lines(
        self, path: pathlib.Path, encoding: str, max_bytes: int | None
    ) -> Iterator[str | None]:
        """The decoded, control-free lines of a (possibly gzipped) file; self.line numbers them.

        None stands for a line that held only control characters: it is neither text nor a
        document separator. With max_bytes, longer lines come in pieces (with one number).
        """
        self.line = 0
        with _open_binary(path) as f:
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
        """JSON Lines: one object per line with a "text" field, split into sentences."""
        limit = self.max_line_chars
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
            text = record.get("text")
            if not isinstance(text, str):
                self._note("missing_text_lines", line_number, 'no string field "text"')
                continue
            # JSON escapes can smuggle control characters past the raw-line cleaning.
            if _CONTROL.search(text):
                text, removed = _CONTROL.subn("", text)
                self._note("control_chars_removed", line_number, count=removed)
            document: list[str] = []
            for sentence in split_sentences(text):
                if len(sentence) > limit:
                    document.extend(self._split_long(sentence, line_number))
                else:
                    document.append(sentence)
            if document:
                yield from self._emit(document, line_number)
            else:
                self._note("empty_documents", line_number)
