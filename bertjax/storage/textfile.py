"""Reading text files, shared by pretraining's corpora and fine-tuning's task files.

`sniff(path)` judges a file from its first bytes: UTF-8 (with or without its mark), UTF-16 or
UTF-32 with a byte-order mark, or not text at all (a known binary format, NUL bytes, mostly
undecodable bytes). Corpora (bertjax.data.corpus) then repair what they can and count it;
task files, which must be exact, are read by `read_lines`, which names the file (and line)
of anything it cannot decode.
"""

from __future__ import annotations

import codecs
import gzip
import io
import os
import zlib
from collections.abc import Iterator

from bertjax.storage import fs


class TextFileError(ValueError):
    """A file that is not text, or not decodable; the message names the file (and line)."""


# Reads of a gs:// file go to the store in pieces of this size.
REMOTE_BUFFER_BYTES = 1 << 22
# Whether a file is text is judged from its first SNIFF_BYTES (after gunzipping).
SNIFF_BYTES = 1 << 16
# A text file may hold a stray NUL or a few bad bytes, which are repaired; a binary file is full
# of them. Shares of the sniffed bytes above which a file is binary:
MAX_NUL_SHARE = 0.01
MAX_UNDECODABLE_SHARE = 0.3
# Byte-order marks of the wide encodings: (mark, Python codec, name in the report). UTF-32-LE's
# mark begins with UTF-16-LE's, so it is tried first. The codecs read the mark themselves.
_BYTE_ORDER_MARKS = (
    (b"\xff\xfe\x00\x00", "utf-32", "UTF-32-LE"),
    (b"\x00\x00\xfe\xff", "utf-32", "UTF-32-BE"),
    (b"\xff\xfe", "utf-16", "UTF-16-LE"),
    (b"\xfe\xff", "utf-16", "UTF-16-BE"),
)
UTF8_BOM = b"\xef\xbb\xbf"
# How the wide encodings count bytes per character (the same for either byte order).
BYTE_COUNT_CODEC = {"utf-16": "utf-16-le", "utf-32": "utf-32-le"}
# Leading bytes of common binary formats. gzip data is only text when its name ends in .gz.
_MAGIC_NUMBERS = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"%PDF-", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"PK\x05\x06", "a ZIP archive"),
    (b"\x1f\x8b", "gzip data in a file not named .gz"),
    (b"\x7fELF", "an ELF executable"),
    (b"\xfd7zXZ\x00", "xz data"),
    (b"\x28\xb5\x2f\xfd", "zstd data"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
)


def open_binary(path: str | os.PathLike):
    """The file's bytes (local or gs://), gunzipped when its name ends in .gz."""
    path = fs.path(path)
    with fs.errors(path, "read"):
        raw = path.open("rb")
    if fs.is_remote(path):
        # fsspec's file object has no readline(size), which long lines are read with.
        raw = io.BufferedReader(raw, buffer_size=REMOTE_BUFFER_BYTES)
    if not path.name.lower().endswith(".gz"):
        return raw
    gunzipped = gzip.GzipFile(fileobj=raw, mode="rb")
    gunzipped.myfileobj = raw  # the file GzipFile closes with itself, as gzip.open's own
    return gunzipped


def sniff(path: str | os.PathLike, opener=open_binary) -> tuple[str, str]:
    """(encoding, detail): how to read a file, judged from its first SNIFF_BYTES.

    The encoding is "utf-8", or "utf-16" / "utf-32" when a byte-order mark says so (detail then
    names it, e.g. "UTF-16-LE"), or "" for a file that is not text (detail says why). A .gz file
    is judged by its gunzipped bytes; `opener` may decompress others.
    """
    head = b""
    with opener(path) as f:
        # In small reads: a truncated .gz file still shows its beginning (reading it then keeps
        # the documents before the damage, and reports the file).
        try:
            while len(head) < SNIFF_BYTES and (block := f.read(min(4096, SNIFF_BYTES - len(head)))):
                head += block
        except (EOFError, zlib.error):
            pass
    for mark, encoding, name in _BYTE_ORDER_MARKS:
        if head.startswith(mark):
            return encoding, name
    for magic, what in _MAGIC_NUMBERS:
        if head.startswith(magic):
            return "", what
    nuls = head.count(0)
    if nuls > 1 and nuls >= MAX_NUL_SHARE * len(head):
        return "", f"NUL bytes: {nuls} in the first {len(head)} bytes"
    # An incremental decoder leaves a character cut at the end of head out of the count.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
    decoded = len(decoder.decode(head).encode()) + len(decoder.getstate()[0])
    undecodable = len(head) - decoded
    if undecodable > MAX_UNDECODABLE_SHARE * len(head):
        return "", (
            f"not UTF-8 text: {undecodable / len(head):.0%} of the first {len(head)} bytes "
            "do not decode"
        )
    return "utf-8", ""


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a text file, line endings kept (as `open(newline="")` gives them).

    UTF-8 (a leading mark is dropped), or UTF-16 / UTF-32 when a byte-order mark says so.
    Raises TextFileError naming the file when it is not text (an image, an archive, random
    bytes), and the file and line when a line does not decode.
    """
    path = fs.path(path)
    encoding, detail = sniff(path)
    if not encoding:
        raise TextFileError(f"{path}: not a text file ({detail}); expected UTF-8 text")
    with open_binary(path) as f:
        if encoding == "utf-8":
            if f.read(len(UTF8_BOM)) != UTF8_BOM:
                f.seek(0)
            for line, raw in enumerate(f, start=1):
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise TextFileError(
                        f"{path} line {line}: byte {raw[err.start]:#04x} at column "
                        f"{err.start + 1} is not UTF-8; save the file as UTF-8"
                    ) from None
            return
        text = io.TextIOWrapper(f, encoding=encoding, newline="")
        line = 0
        try:
            for line, piece in enumerate(text, start=1):  # noqa: B007 - read after the loop
                yield piece
        except UnicodeDecodeError as err:
            raise TextFileError(
                f"{path} line {line + 1}: not valid {detail} ({err.reason}); save the file as UTF-8"
            ) from None
