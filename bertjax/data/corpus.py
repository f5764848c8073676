"""Streaming corpus reading: files, globs, directories, .gz, and a report of bad input.

Two formats:
- google-research/bert's: plain text, one sentence per line, a blank line between documents.
- JSON Lines (files named *.jsonl or *.json, optionally .gz): one document per line, an object
  with a "text" field that is split into sentences by bertjax.data.sentences.

Bad input never stops the run: undecodable bytes become U+FFFD, control characters are
removed, empty documents are skipped, over-long lines are split, malformed JSON lines are
skipped, and an unreadable (e.g. truncated .gz) file keeps the documents read before the error.
Each kind is counted in an InputReport.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import pathlib
import re
import zlib
from collections.abc import Iterator, Sequence

from bertjax.data.sentences import split_sentences

DEFAULT_MAX_LINE_CHARS = 2000
DEFAULT_MAX_DOCUMENT_SENTENCES = 10_000
JSON_SUFFIXES = (".jsonl", ".json")
_MAX_ERROR_MESSAGES = 20
# Text-format lines are read in pieces of at most this many bytes, so that a file without line
# breaks never sits in memory whole; each piece is then split like any over-long line.
MAX_LINE_BYTES = 1 << 20

# C0/C1 control characters except tab, line feed and carriage return (whitespace), plus the
# byte-order mark and interlinear annotation marks, which carry no text.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufeff\ufff9-\ufffb]")


@dataclasses.dataclass
class InputReport:
    """Counts of what was read and of each kind of bad input that was repaired or skipped."""

    files: int = 0
    bytes: int = 0
    documents: int = 0
    sentences: int = 0
    invalid_utf8_lines: int = 0  # lines whose undecodable bytes were replaced by U+FFFD
    control_chars_removed: int = 0
    empty_documents: int = 0  # documents with nothing left after cleaning, skipped
    long_lines_split: int = 0  # lines longer than max_line_chars, split into pieces
    long_documents_split: int = 0  # documents longer than max_document_sentences, split
    bad_json_lines: int = 0  # JSON Lines input: not a JSON object, skipped
    missing_text_lines: int = 0  # JSON Lines input: no string "text" field, skipped
    empty_files: int = 0  # files that held no document
    unreadable_files: int = 0  # files that failed while reading (documents before kept)
    errors: list[str] = dataclasses.field(default_factory=list)  # first messages, for the user

    def add_error(self, message: str) -> None:
        """Keeps the first few error messages so that the report stays small."""
        if len(self.errors) < _MAX_ERROR_MESSAGES:
            self.errors.append(message)

    def to_dict(self) -> dict:
        """A JSON-serialisable copy."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> InputReport:
        """Rebuilds a report from to_dict's output."""
        return cls(**d)

    def merge(self, other: InputReport) -> InputReport:
        """Adds other's counts into self (e.g. from parallel workers) and returns self."""
        for field in dataclasses.fields(self):
            if field.name == "errors":
                for message in other.errors:
                    self.add_error(message)
            else:
                setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))
        return self

    @property
    def problems(self) -> dict[str, int]:
        """The non-zero counts of bad input."""
        counts = dataclasses.asdict(self)
        for name in ("files", "bytes", "documents", "sentences", "errors"):
            counts.pop(name)
        return {name: count for name, count in counts.items() if count}

    def __str__(self) -> str:
        head = (
            f"input: {self.files} files, {self.bytes / 1e6:.1f} MB, {self.documents} documents, "
            f"{self.sentences} sentences"
        )
        problems = self.problems
        if not problems:
            return head + "; no bad input"
        lines = [head + "; repaired or skipped:"]
        lines += [f"  {name}: {count}" for name, count in problems.items()]
        lines += [f"  ! {message}" for message in self.errors]
        return "\n".join(lines)


def expand_paths(paths: Sequence[str | os.PathLike] | str | os.PathLike) -> list[pathlib.Path]:
    """Files named by paths: files, globs, directories (recursive); sorted and de-duplicated."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ValueError("no input paths given; pass files, globs or directories")
    files: list[pathlib.Path] = []
    for raw in paths:
        path = os.fspath(raw)
        if os.path.isdir(path):
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
    unique: dict[pathlib.Path, None] = {}
    for file in files:
        unique.setdefault(file, None)
    return list(unique)


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
        report.files += 1
        before = yielded
        read = reader.json_documents if is_json_lines(file) else reader.text_documents
        try:
            for document in read(file):
                yielded += 1
                yield document
        except (OSError, EOFError, zlib.error) as err:
            report.unreadable_files += 1
            report.add_error(f"{file}: {type(err).__name__}: {err}")
        if yielded == before:
            report.empty_files += 1
    if yielded == 0:
        names = ", ".join(repr(str(f)) for f in files[:5]) + (" ..." if len(files) > 5 else "")
        raise ValueError(f"input {names} holds no text: no documents were found")


def _raw_lines(f, max_bytes: int | None) -> Iterator[bytes]:
    """Lines of a binary file; with max_bytes, long lines in pieces cut between characters."""
    if max_bytes is None:
        yield from f
        return
    carry = b""
    while True:
        raw = carry + f.readline(max_bytes)
        carry = b""
        if not raw:
            return
        if not raw.endswith(b"\n") and len(raw) >= max_bytes:
            # An incomplete UTF-8 character (lead + continuation bytes) goes to the next piece.
            cut = len(raw) - 1
            while cut > len(raw) - 4 and raw[cut] & 0xC0 == 0x80:
                cut -= 1
            if raw[cut] >= 0xC0:
                raw, carry = raw[:cut], raw[cut:]
        yield raw


class _Reader:
    """Line cleaning shared by both formats; updates the report as it goes."""

    def __init__(self, report: InputReport, max_line_chars: int, max_document_sentences: int):
        self.report = report
        self.max_line_chars = max_line_chars
        self.max_document_sentences = max_document_sentences

    def _lines(self, path: pathlib.Path, max_bytes: int | None) -> Iterator[str | None]:
        """Decoded, control-free lines of a (possibly gzipped) file.

        None stands for a line that held only control characters: it is neither text nor a
        document separator. With max_bytes, longer lines come in pieces.
        """
        report = self.report
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rb") as f:
            for raw in _raw_lines(f, max_bytes):
                report.bytes += len(raw)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    line = raw.decode("utf-8", errors="replace")
                    report.invalid_utf8_lines += 1
                if _CONTROL.search(line):
                    line, removed = _CONTROL.subn("", line)
                    report.control_chars_removed += removed
                    if not line.strip():
                        yield None
                        continue
                yield line

    def _split_long(self, sentence: str) -> list[str]:
        """Pieces of at most max_line_chars, cut at sentence ends, else spaces, else anywhere."""
        limit = self.max_line_chars
        self.report.long_lines_split += 1
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

    def _emit(self, document: list[str]) -> Iterator[list[str]]:
        """Yields a finished document, split if it is too long, counting it."""
        report = self.report
        limit = self.max_document_sentences
        if len(document) > limit:
            report.long_documents_split += 1
        for start in range(0, len(document), limit):
            part = document[start : start + limit]
            report.documents += 1
            report.sentences += len(part)
            yield part

    def text_documents(self, path: pathlib.Path) -> Iterator[list[str]]:
        """google-research/bert's format: a sentence per line, blank line between documents."""
        limit = self.max_line_chars
        document: list[str] = []
        emptied = False  # the document so far had lines, all of them cleaned away
        for line in self._lines(path, MAX_LINE_BYTES):
            if line is None:
                emptied = not document
                continue
            line = line.strip()
            if not line:
                if document:
                    yield from self._emit(document)
                elif emptied:
                    self.report.empty_documents += 1
                document, emptied = [], False
                continue
            if len(document) >= self.max_document_sentences:
                # Flush early so that a file without blank lines never sits in memory whole.
                self.report.long_documents_split += 1
                yield from self._emit(document)
                document = []
            if len(line) > limit:
                document.extend(self._split_long(line))
            else:
                document.append(line)
        if document:
            yield from self._emit(document)
        elif emptied:
            self.report.empty_documents += 1

    def json_documents(self, path: pathlib.Path) -> Iterator[list[str]]:
        """JSON Lines: one object per line with a "text" field, split into sentences."""
        report = self.report
        limit = self.max_line_chars
        # A JSON record must be parsed whole: its line is read whole.
        for line_number, line in enumerate(self._lines(path, None), start=1):
            if line is None or not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                report.bad_json_lines += 1
                report.add_error(f"{path}:{line_number}: not JSON ({err})")
                continue
            if not isinstance(record, dict):
                report.bad_json_lines += 1
                kind = type(record).__name__
                report.add_error(f"{path}:{line_number}: a JSON {kind}, not an object")
                continue
            text = record.get("text")
            if not isinstance(text, str):
                report.missing_text_lines += 1
                report.add_error(f'{path}:{line_number}: no string field "text"')
                continue
            # JSON escapes can smuggle control characters past the raw-line cleaning.
            if _CONTROL.search(text):
                text, removed = _CONTROL.subn("", text)
                report.control_chars_removed += removed
            document: list[str] = []
            for sentence in split_sentences(text):
                if len(sentence) > limit:
                    document.extend(self._split_long(sentence))
                else:
                    document.append(sentence)
            if document:
                yield from self._emit(document)
            else:
                report.empty_documents += 1
