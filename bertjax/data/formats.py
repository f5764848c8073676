"""How corpus files are stored: the format a file is read as, and its decompression.

Formats (by name unless a source says otherwise):

- ``text``: google-research/bert's one sentence per line, a blank line between documents;
- ``jsonl``: JSON Lines (``*.jsonl``, ``*.json``), one object per line, text in a field;
- ``parquet``: ``*.parquet`` files (FineWeb, wikimedia/wikipedia), text in a column.

Text and JSON Lines may be compressed with gzip (``.gz``) or zstd (``.zst``, ``.zstd``: The
Pile, DCLM). zstd is decompressed here, streaming, frame by frame, so that a file that ends
inside a frame is told apart from one that ends between frames: the ``zstandard`` library's
own reader returns what it could and no error for the former.
"""

from __future__ import annotations

import importlib
import io
import os
from types import ModuleType

import zstandard

from bertjax.storage import fs
from bertjax.storage.textfile import REMOTE_BUFFER_BYTES
from bertjax.storage.textfile import open_binary as _open_gzip_or_plain

FORMATS = ("auto", "text", "jsonl", "parquet")
GZIP_SUFFIXES = (".gz",)
ZSTD_SUFFIXES = (".zst", ".zstd")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
# Compressed bytes read from the file at a time.
_ZSTD_READ_BYTES = 1 << 17


PARQUET_EXTRA = "pip install 'bertjax[corpora]'"


def pyarrow_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(pyarrow, pyarrow.parquet, pyarrow.compute), imported on first use: the import is
    slow, and runs that read no parquet need not pay for it; without pyarrow, one line that
    names the extra to install."""
    try:
        return tuple(
            importlib.import_module(name)
            for name in ("pyarrow", "pyarrow.parquet", "pyarrow.compute")
        )
    except ImportError:
        raise ValueError(
            f"reading parquet files needs pyarrow; install it with {PARQUET_EXTRA}"
        ) from None


class TruncatedFrameError(EOFError):
    """A zstd file that ends inside a frame; the message names the file and byte offsets."""


class CorruptFrameError(OSError):
    """zstd data that does not decode; the message names the file and the byte offset."""


def strip_compression(name: str) -> str:
    """A file name without its compression suffix (lower case)."""
    name = name.lower()
    for suffix in GZIP_SUFFIXES + ZSTD_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def is_zstd(path: str | os.PathLike) -> bool:
    """Whether a file is read through zstd decompression (by its name)."""
    return os.fspath(path).lower().endswith(ZSTD_SUFFIXES)


def file_format(path: str | os.PathLike, format: str = "auto") -> str:
    """The format a file is read as: `format`, or with "auto" the one its name says."""
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is invalid; choose one of {FORMATS}")
    if format != "auto":
        return format
    name = strip_compression(os.path.basename(os.fspath(path)))
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSON_SUFFIXES):
        return "jsonl"
    return "text"


def open_binary(path: str | os.PathLike):
    """The file's bytes (local or gs://), decompressed when its name ends in .gz, .zst, .zstd."""
    if not is_zstd(path):
        return _open_gzip_or_plain(path)
    path = fs.path(path)
    with fs.errors(path, "read"):
        raw = path.open("rb")
    return io.BufferedReader(_ZstdFrames(raw, str(path)), buffer_size=REMOTE_BUFFER_BYTES)


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a zstd file of one or more frames, read in order.

    Seeking is supported to where reading already passed (restarting from the beginning), which
    is what a reader that peeks at a file's first bytes and goes back needs.
    """

    def __init__(self, raw, name: str):
        self._raw = raw
        self._name = name
        self._start()

    def _start(self) -> None:
        self._decompressor = zstandard.ZstdDecompressor().decompressobj()
        self._consumed = 0  # compressed bytes given to decompressors so far
        self._frame_start = 0  # compressed offset where the current frame began
        self._in_frame = False  # the current decompressor has been given bytes
        self._pending = b""  # decompressed bytes not yet handed out
        self._position = 0  # decompressed bytes handed out
        self._done = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("zstd streams seek from the start or the position only")
        if offset < self._position:
            self._raw.seek(0)
            self._start()
        while self._position < offset and self.read(min(offset - self._position, 1 << 20)):
            pass
        return self._position

    def readinto(self, buffer) -> int:
        while not self._pending and not self._done:
            self._decompress_more()
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        self._position += count
        return count

    def _decompress_more(self) -> None:
        data = self._raw.read(_ZSTD_READ_BYTES)
        if not data:
            self._done = True
            if self._in_frame:
                raise TruncatedFrameError(
                    f"{self._name}: truncated zstd frame: the frame that begins at byte "
                    f"{self._frame_start} is cut off at byte {self._consumed}, the end of the "
                    f"file, after {self._position + len(self._pending)} decompressed bytes"
                )
            return
        out = []
        while data:
            offset = self._consumed
            try:
                out.append(self._decompressor.decompress(data))
            except zstandard.ZstdError as err:
                self._done = True
                self._pending += b"".join(out)
                raise CorruptFrameError(
                    f"{self._name}: corrupt zstd data in the frame that begins at byte "
                    f"{self._frame_start} (read up to byte {offset + len(data)}): {err}"
                ) from None
            self._in_frame = True
            if not self._decompressor.eof:
                self._consumed += len(data)
                break
            # A frame ended inside this read: the rest is the next frame's.
            rest = self._decompressor.unused_data
            self._consumed += len(data) - len(rest)
            self._frame_start = self._consumed
            self._decompressor = zstandard.ZstdDecompressor().decompressobj()
            self._in_frame = False
            data = rest
        self._pending += b"".join(out)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()
