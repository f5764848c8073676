"""Files wherever a user points: a local path or `gs://bucket/path`, through one layer.

Every path the library reads or writes that a user gave (corpora, prepared data, work
directories, exports, task files, predictions) goes through `fs.path`, which returns a
`pathlib.Path` for a local path and an `etils.epath.Path` (backed by fsspec's gcsfs) for
`gs://`. Both have the same methods (`/`, `open`, `read_text`, `glob`, `iterdir`, `exists`,
`mkdir`, `unlink`), so the code above this layer does not branch on where a file lives.
Checkpoints go to Orbax, which takes the same strings (tensorstore writes the arrays).

The cloud libraries are an optional extra: a `gs://` path without them ends in one line
naming the extra, before anything is written. Failures of the object store (no such bucket
or object, no credentials, no permission) become `StorageError`, whose message names the
path and what to do.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import tempfile
from collections.abc import Iterator

from etils import epath

# The schemes a path may carry; anything else with "://" is refused by name.
GCS_SCHEME = "gs://"
GCS_EXTRA = "pip install 'bertjax[gcs]'"

# What `path` returns: pathlib.Path on disk, epath.Path on GCS (the same interface).
AnyPath = pathlib.Path | epath.Path


class StorageError(ValueError):
    """A path that cannot be read or written; the message names it and what to do."""


def is_remote(p: str | os.PathLike) -> bool:
    """Whether `p` names an object in a bucket (`gs://...`) rather than a local file."""
    return str(p).startswith(GCS_SCHEME)


def path(p: str | os.PathLike) -> AnyPath:
    """The path `p` names, local or `gs://`; a scheme this library cannot reach is named.

    Raises StorageError, before anything is read or written, for `gs://` without the `gcs`
    extra installed and for a scheme other than gs:// (s3://, http://, ...).
    """
    if isinstance(p, epath.Path) and is_remote(p):
        return p
    text = os.fspath(p)
    if is_remote(text):
        require_gcs(text)
        if text.rstrip("/") == GCS_SCHEME.rstrip("/") or text[len(GCS_SCHEME) :].startswith("/"):
            raise StorageError(f"{text}: not a GCS path; write gs://<bucket>/<path>")
        return epath.Path(text)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise StorageError(
            f"{text}: {scheme}:// paths are not supported; use a local path or gs://"
        )
    return pathlib.Path(text)


def require_gcs(p: str) -> None:
    """Raises StorageError naming the extra to install when gcsfs is missing."""
    if importlib.util.find_spec("gcsfs") is None:
        raise StorageError(f"{p}: gs:// paths need the gcs extra; install it with {GCS_EXTRA}")


def join(base: str | os.PathLike, *parts: str) -> str:
    """`base/part/...` as a string, for libraries that take strings (Orbax, tensorstore)."""
    return os.fspath(path(base).joinpath(*parts))


def write_bytes(target: str | os.PathLike, data: bytes) -> None:
    """Writes a whole file so that a reader sees the old content or the new, never a part.

    Locally through a temporary file and a rename; on GCS an object appears only when its
    upload completes, so one write is already all or nothing.
    """
    target = path(target)
    with errors(target, "write"):
        if is_remote(target):
            target.write_bytes(data)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def write_text(target: str | os.PathLike, text: str) -> None:
    """`write_bytes` of UTF-8 text."""
    write_bytes(target, text.encode("utf-8"))


def read_bytes(source: str | os.PathLike) -> bytes:
    source = path(source)
    with errors(source, "read"):
        return source.read_bytes()


def read_text(source: str | os.PathLike) -> str:
    return read_bytes(source).decode("utf-8")


def makedirs(directory: str | os.PathLike) -> AnyPath:
    """Creates a directory (a no-op on GCS, whose directories are name prefixes)."""
    directory = path(directory)
    with errors(directory, "create"):
        directory.mkdir(parents=True, exist_ok=True)
    return directory


@contextlib.contextmanager
def errors(target: str | os.PathLike, action: str) -> Iterator[None]:
    """Turns the object store's failures into StorageError naming `target` and the cause.

    Local OSErrors pass through unchanged (their messages already name the file); a remote
    missing object stays FileNotFoundError (callers test for it) with the path as its message,
    a missing bucket, missing credentials or a refused permission become StorageErrors.
    """
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        if not is_remote(target):
            raise
        if isinstance(e, FileNotFoundError):
            bucket = bucket_of(target)
            if not _bucket_exists(bucket):
                raise StorageError(
                    f"{target}: cannot {action}: the bucket {bucket} does not exist"
                ) from e
            raise FileNotFoundError(f"{target}: no such file") from e
        message = describe_remote_error(e)
        if message is None:
            raise
        raise StorageError(f"{target}: cannot {action}: {message}") from e


def kind(p: str | os.PathLike) -> str | None:
    """What is at `p`, local or `gs://`: "file", "directory", or None for nothing.

    On GCS the store is asked directly, so a missing bucket, missing credentials or a refused
    permission raise StorageError naming the path, where `is_dir()` / `is_file()` (which
    swallow the store's errors) would read as "not there".
    """
    p = path(p)
    if not is_remote(p):
        return "directory" if p.is_dir() else "file" if p.is_file() else None
    import fsspec  # the gs backend is present: path() checked the extra

    try:
        with errors(p, "read"):
            info = fsspec.filesystem("gs").info(os.fspath(p))
    except FileNotFoundError:
        return None
    return "directory" if info.get("type") == "directory" else "file"


def size(p: str | os.PathLike) -> int:
    """The size of the file at `p` in bytes, local or `gs://`."""
    p = path(p)
    if not is_remote(p):
        return p.stat().st_size
    with errors(p, "read"):
        return int(p.stat().length)


def bucket_of(p: str | os.PathLike) -> str:
    """`gs://bucket` of a `gs://bucket/...` path."""
    return GCS_SCHEME + os.fspath(p)[len(GCS_SCHEME) :].split("/", 1)[0]


def _bucket_exists(bucket: str) -> bool:
    try:
        return epath.Path(bucket).exists()
    except Exception:  # a store that cannot answer: let the caller's error stand
        return True


def describe_remote_error(e: BaseException) -> str | None:
    """What went wrong talking to GCS, in words; None for errors that are not the store's."""
    text = " ".join(str(e).split())  # one line: the store's messages may span several
    name = type(e).__name__
    if "DefaultCredentialsError" in name or "credentials were not found" in text:
        return (
            "no Google Cloud credentials found; run `gcloud auth application-default login` "
            "or set GOOGLE_APPLICATION_CREDENTIALS"
        )
    # gcsfs raises a 403 as OSError("Forbidden: <path>..."), a 401 as HttpError.
    if (
        isinstance(e, PermissionError)
        or text.startswith("Forbidden")
        or "403" in text
        or "401" in text
    ):
        return (
            f"permission denied ({text.strip() or name}); check the account's access to the bucket"
        )
    if isinstance(e, (ConnectionError, TimeoutError)) or "HttpError" in name:
        return f"{name}: {text.strip()}"
    return None
