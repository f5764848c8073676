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

Transient failures (HTTP 408, 429, 5xx, dropped or refused connections) are retried here,
once for every client in the process: every request of the process's gcsfs instance, which
this module, epath and so Orbax's directory operations share, is retried with bounded
exponential backoff and jitter for up to `retry_policy().deadline` seconds (Google's client
libraries' defaults; `BERTJAX_GCS_RETRY_SECONDS` changes the budget), and tensorstore, which
writes the checkpoints' arrays, gets the same budget through `tensorstore_retries`. Permanent
answers (400, 401, 403, 404, 412) are never retried. A fault that outlasts the budget raises
`StorageUnavailableError`, one line naming the path and the last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import glob as globbing
import importlib.util
import json
import logging
import os
import pathlib
import random
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence

from etils import epath

# The schemes a path may carry; anything else with "://" is refused by name.
GCS_SCHEME = "gs://"
GCS_EXTRA = "pip install 'bertjax[gcs]'"

# What `path` returns: pathlib.Path on disk, epath.Path on GCS (the same interface).
AnyPath = pathlib.Path | epath.Path


logger = logging.getLogger(__name__)


class StorageError(ValueError):
    """A path that cannot be read or written; the message names it and what to do."""


class StorageUnavailableError(StorageError):
    """GCS kept failing transiently (unreachable, overloaded) for the whole retry budget.

    Not an OSError on purpose: libraries above gcsfs read some OSErrors as "not there"
    (fsspec's `isdir`), and an unreachable store must never pass for an empty one.
    """

    def __init__(self, target: str, detail: str):
        super().__init__(f"{target}: {detail}")
        self.target = target
        self.detail = detail


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
        gcs_filesystem()  # its requests retried before epath (and Orbax) use it
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
            # mkstemp makes the file private (0600); give it what `open` would have.
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(target: str | os.PathLike, text: str) -> None:
    """`write_bytes` of UTF-8 text."""
    write_bytes(target, text.encode("utf-8"))


def read_bytes(source: str | os.PathLike) -> bytes:
    source = path(source)
    with errors(source, "read"):
        return source.read_bytes()


def read_text(source: str | os.PathLike) -> str:
    return read_bytes(source).decode("utf-8")


def copy(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copies one file's bytes to `target` (whole, as `write_bytes`), local or gs:// either side."""
    write_bytes(target, read_bytes(source))


def move(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Moves a file or a directory tree to `target` (same storage on both sides).

    Locally one rename. On GCS, where a directory is a name prefix, every object under it is
    copied on the server and then deleted: not atomic, so callers move only what no reader
    relies on (a damaged checkpoint step, say).
    """
    source, target = path(source), path(target)
    with errors(source, "move"):
        if not is_remote(source):
            target.parent.mkdir(parents=True, exist_ok=True)
            source.rename(target)
            return
        store = gcs_filesystem()
        # Copy on the server, then delete (gcsfs's mv tries an API for hierarchical-namespace
        # buckets first and logs an error on the others).
        store.copy(_object_name(source), _object_name(target), recursive=True)
        store.rm(_object_name(source), recursive=True)
        invalidate_listings()


def write_if_generation(target: str | os.PathLike, data: bytes, generation: int) -> int | None:
    """GCS only: writes the object `target` if its live generation is `generation` (0: if
    there is none); its new generation, or None when the precondition failed.

    The store checks the precondition with the write, so of several writers that read the
    same generation exactly one succeeds.
    """
    target = path(target)
    if not is_remote(target):
        raise StorageError(f"{target}: conditional writes apply to gs:// objects only")
    from fsspec.asyn import sync

    store = gcs_filesystem()
    bucket, key = _object_name(target).split("/", 1)
    header = json.dumps({"name": key})
    # One multipart upload (metadata, then the bytes), as gcsfs's own simple upload sends it,
    # with the generation precondition it has no argument for.
    body = (
        (
            f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{header}\n--==0==\n"
            "Content-Type: application/octet-stream\n\n"
        ).encode()
        + data
        + b"\n--==0==--"
    )
    with errors(target, "write"):
        try:
            written = sync(
                store.loop,
                store._call,
                "POST",
                f"{store._location}/upload/storage/v1/b/{urllib.parse.quote(bucket)}/o",
                uploadType="multipart",
                headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                data=body,
                json_out=True,
                ifGenerationMatch=str(int(generation)),
            )
        except FileExistsError:  # gcsfs's name for "precondition failed" (HTTP 412)
            return None
        finally:
            store.invalidate_cache(_object_name(target))
    return int(written["generation"])


def remove_if_generation(target: str | os.PathLike, generation: int) -> None:
    """GCS only: deletes the object `target` if its live generation is still `generation`;
    otherwise (another writer replaced it, or it is gone) leaves the store as it is."""
    target = path(target)
    if not is_remote(target):
        raise StorageError(f"{target}: conditional deletes apply to gs:// objects only")
    from fsspec.asyn import sync

    store = gcs_filesystem()
    bucket, key = _object_name(target).split("/", 1)
    with errors(target, "delete"):
        try:
            sync(
                store.loop,
                store._call,
                "DELETE",
                "b/{}/o/{}",
                bucket,
                key,
                ifGenerationMatch=str(int(generation)),
            )
        except (FileNotFoundError, FileExistsError):  # gone, or replaced by another writer
            pass
        finally:
            store.invalidate_cache(_object_name(target))


def stat_remote(target: str | os.PathLike) -> dict:
    """The object store's record of a gs:// object, fresh (not from a cached listing): its
    `generation`, `updated` (server time, RFC 3339) and `size`. FileNotFoundError if absent."""
    target = path(target)
    store = gcs_filesystem()
    with errors(target, "stat"):
        store.invalidate_cache(_object_name(target))
        return store.info(_object_name(target))


def server_time(directory: str | os.PathLike) -> float:
    """The object store's clock now (unix seconds), read from a probe object it stamps.

    For deciding the age of objects by their `updated` time without trusting this host's
    clock. The probe is deleted again.
    """
    probe = path(directory) / f".clock-{uuid.uuid4().hex}"
    write_bytes(probe, b"")
    try:
        return parse_time(stat_remote(probe)["updated"])
    finally:
        remove(probe)


def parse_time(stamp: str) -> float:
    """Unix seconds of an RFC 3339 time as GCS writes it ("2026-12-01T06:17:48.99171Z")."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def remove(target: str | os.PathLike) -> None:
    """Deletes one file; no error when it is already gone."""
    target = path(target)
    with errors(target, "delete"):
        if not is_remote(target):
            target.unlink(missing_ok=True)
            return
        store = gcs_filesystem()
        try:
            store.rm_file(_object_name(target))
        except FileNotFoundError:
            pass
        store.invalidate_cache(_object_name(target))


def gcs_filesystem():
    """The process's gcsfs filesystem: the instance epath (and so Orbax's step listing) uses,
    so that what this layer writes or moves is not hidden by a stale cached listing."""
    import fsspec

    store = fsspec.filesystem("gs", finalize_on_close=True)  # epath's arguments: its instance
    if not getattr(store, "_bertjax_retries", False):
        _retry_requests(store)
    return store


def invalidate_listings(p: str | os.PathLike | None = None) -> None:
    """Forgets the cached GCS listings (of `p`, or all) of this layer's gcsfs instance, so the
    next listing sees other writers' objects."""
    gcs_filesystem().invalidate_cache(None if p is None else _object_name(p))


def _object_name(p: str | os.PathLike) -> str:
    """`bucket/key` of `gs://bucket/key`, as gcsfs takes it."""
    return os.fspath(p)[len(GCS_SCHEME) :]


def makedirs(directory: str | os.PathLike) -> AnyPath:
    """Creates a directory (a no-op on GCS, whose directories are name prefixes)."""
    directory = path(directory)
    if is_remote(directory):
        # Nothing to create; but gcsfs's mkdir would create a missing *bucket*, so name it.
        require_bucket(directory)
        return directory
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
    except StorageUnavailableError as e:
        # The request's own name for the object may be a bucket or an upload session: name
        # what the caller asked for, and what it was doing.
        if e.detail.startswith("cannot "):
            raise
        raise StorageUnavailableError(os.fspath(target), f"cannot {action}: {e.detail}") from e
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
    try:
        with errors(p, "read"):
            info = gcs_filesystem().info(os.fspath(p))
    except FileNotFoundError:
        return None
    return "directory" if info.get("type") == "directory" else "file"


def bucket_of(p: str | os.PathLike) -> str:
    """`gs://bucket` of a `gs://bucket/...` path."""
    return GCS_SCHEME + os.fspath(p)[len(GCS_SCHEME) :].split("/", 1)[0]


def require_bucket(p: str | os.PathLike) -> None:
    """Raises StorageError naming the bucket of a `gs://` path when that bucket does not exist."""
    if is_remote(p) and not _bucket_exists(bucket_of(p)):
        raise StorageError(f"{os.fspath(p)}: the bucket {bucket_of(p)} does not exist")


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


# Listing, ranged reads and removal: what prepared data (bertjax.data) needs beyond whole files.


def filesystem(p: str | os.PathLike):
    """The fsspec filesystem of a `gs://` path (gcsfs), for what epath does not offer."""
    require_gcs(os.fspath(p))
    return gcs_filesystem()


def _remote(p: str) -> str:
    """A `gs://` URL of what gcsfs returns ("bucket/key", without the scheme)."""
    return p if p.startswith(GCS_SCHEME) else GCS_SCHEME + p


def glob(pattern: str | os.PathLike) -> list[str]:
    """Sorted paths matching a glob (`*`, `?`, `[...]`, `**`), files and directories."""
    text = os.fspath(pattern)
    if not is_remote(text):
        return sorted(globbing.glob(text, recursive=True))
    store = filesystem(text)
    with errors(text, "list"):
        store.invalidate_cache()  # another process may have written since the last listing
        return sorted(_remote(p) for p in store.glob(text))


def files_under(directory: str | os.PathLike) -> list[AnyPath]:
    """Every file below a directory (recursively), sorted by its path within it; hidden files
    and directories (a leading ".": ".git", ".DS_Store") are left out."""
    directory = path(directory)
    if not is_remote(directory):
        found = (f for f in directory.rglob("*") if f.is_file())
    else:
        store = filesystem(directory)
        with errors(directory, "list"):
            store.invalidate_cache()
            found = (path(_remote(p)) for p in store.find(os.fspath(directory)))
    return sorted(
        (f for f in found if not any(p.startswith(".") for p in relative_parts(f, directory))),
        key=lambda f: relative_parts(f, directory),
    )


def relative_parts(p: AnyPath, directory: AnyPath) -> tuple[str, ...]:
    """The parts of `p` below `directory` (`p` lies below it)."""
    if not is_remote(p):
        return pathlib.PurePath(p).relative_to(directory).parts
    return tuple(os.fspath(p)[len(os.fspath(directory).rstrip("/")) + 1 :].split("/"))


def is_dir(p: str | os.PathLike) -> bool:
    """Whether `p` is a directory (on GCS: a prefix that some object lies under)."""
    p = path(p)
    with errors(p, "read"):
        return p.is_dir()


def is_file(p: str | os.PathLike) -> bool:
    """Whether `p` is a file (on GCS: an object)."""
    p = path(p)
    with errors(p, "read"):
        return p.is_file()


def size(p: str | os.PathLike) -> int:
    """The size of a file in bytes."""
    p = path(p)
    with errors(p, "read"):
        if not is_remote(p):
            return p.stat().st_size
        return int(filesystem(p).size(os.fspath(p)))


def read_ranges(
    paths: Sequence[str | os.PathLike], starts: Sequence[int], ends: Sequence[int]
) -> list[bytes]:
    """Bytes `[starts[i], ends[i])` of file `paths[i]` for each i (all local or all gs://).

    On GCS every range is its own request and all are in flight together, so a batch of
    scattered reads costs about one round trip and nothing beyond the ranges is downloaded.
    """
    if not paths:
        return []
    first = path(paths[0])
    with errors(first, "read"):
        if not is_remote(first):
            pieces = []
            for p, start, end in zip(paths, starts, ends, strict=True):
                with open(p, "rb") as f:
                    f.seek(start)
                    pieces.append(f.read(end - start))
            return pieces
        return filesystem(first).cat_ranges(
            [os.fspath(p) for p in paths], list(starts), list(ends), on_error="raise"
        )


def remove_tree(directory: str | os.PathLike) -> None:
    """Removes a directory and everything below it; nothing happens when it does not exist."""
    directory = path(directory)
    with errors(directory, "remove"):
        if not is_remote(directory):
            if directory.is_dir():
                shutil.rmtree(directory)
            return
        store = filesystem(directory)
        store.invalidate_cache()
        if store.find(os.fspath(directory)):
            store.rm(os.fspath(directory), recursive=True)


# ----------------------------------------------------------------------------- retries

RETRY_ENV = "BERTJAX_GCS_RETRY_SECONDS"
# How long one request may keep failing transiently before it fails for good: the deadline
# of Google's Python client libraries (google-api-core's retry default).
RETRY_SECONDS = 120.0
# The waits between attempts, as Google's client libraries draw them: each one uniform below
# a cap that starts at 1 s and doubles up to 32 s (the Java client's and tensorstore's
# maximum), so that clients that failed together do not all come back at the same moment.
RETRY_INITIAL_DELAY = 1.0
RETRY_MAX_DELAY = 32.0
RETRY_MULTIPLIER = 2.0
# HTTP statuses that may succeed when sent again: request timeout, too many requests, and the
# server's own failures. Any other answer (400, 401, 403, 404, 412) would come back the same.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter: attempts until `deadline` seconds."""

    deadline: float
    initial_delay: float = RETRY_INITIAL_DELAY
    max_delay: float = RETRY_MAX_DELAY
    multiplier: float = RETRY_MULTIPLIER

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The waits before the second, third, ... attempt (without the deadline's cut)."""
        rng = rng or random.Random()
        cap = self.initial_delay
        while True:
            yield rng.uniform(0.0, cap)
            cap = min(cap * self.multiplier, self.max_delay)


def retry_policy() -> RetryPolicy:
    """The retry budget of GCS requests: `RETRY_SECONDS`, or `BERTJAX_GCS_RETRY_SECONDS`."""
    text = os.environ.get(RETRY_ENV)
    if not text:
        return RetryPolicy(RETRY_SECONDS)
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise StorageError(f"{RETRY_ENV}={text!r} is invalid; must be a number of seconds > 0")
    # A budget shorter than the default waits (tests) shortens them too.
    return RetryPolicy(
        seconds,
        initial_delay=min(RETRY_INITIAL_DELAY, seconds),
        max_delay=min(RETRY_MAX_DELAY, seconds),
    )


def tensorstore_retries() -> dict:
    """Tensorstore's context resource `gcs_request_retries` with the budget of `retry_policy`.

    Tensorstore counts attempts rather than time and waits min(initial * 2**n, max) plus a
    little jitter between them: as many retries as those waits take to fill the deadline.
    """
    policy = retry_policy()
    waited, cap, retries = 0.0, policy.initial_delay, 0
    while waited < policy.deadline:
        waited += cap
        retries += 1
        cap = min(cap * policy.multiplier, policy.max_delay)
    return {
        "max_retries": retries,
        "initial_delay": f"{policy.initial_delay:g}s",
        "max_delay": f"{policy.max_delay:g}s",
    }


def is_transient(error: BaseException) -> bool:
    """Whether a failed GCS request may succeed when sent again (see TRANSIENT_STATUSES)."""
    # gcsfs's answers for 404, 412 and 403 (OSError "Forbidden: ..."), and a 400's ValueError.
    if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError, ValueError)):
        return False
    status = getattr(error, "code", None)  # gcsfs's HttpError
    if not isinstance(status, int):
        status = getattr(error, "status", None)  # aiohttp's ClientResponseError
    if isinstance(status, int):
        return status in TRANSIENT_STATUSES
    import aiohttp
    import requests

    # Refused, reset or dropped connections, a truncated body, a timeout; gcsfs raises a 502
    # as requests' ProxyError (a ConnectionError).
    return isinstance(
        error,
        (
            aiohttp.ClientConnectionError,
            aiohttp.ClientPayloadError,
            asyncio.TimeoutError,
            ConnectionError,
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
        ),
    )


# When a request last spent its whole budget (time.monotonic()), or None once one succeeded.
# Requests that start within a budget after that try once: a run that is stopping because
# the store is down does not wait out a budget for each of its closing writes.
_down_since: float | None = None
_down_lock = threading.Lock()


def _mark_down(now: float) -> None:
    global _down_since
    with _down_lock:
        _down_since = now


def _mark_up() -> None:
    global _down_since
    if _down_since is not None:
        with _down_lock:
            _down_since = None


def _known_down(started: float, policy: RetryPolicy) -> bool:
    since = _down_since
    return since is not None and since <= started < since + policy.deadline


async def with_retries(attempt: Callable[[], Awaitable], target: Callable[[], str]):
    """`await attempt()`, again after each transient failure while the budget lasts.

    Raises the first permanent error as it is, and StorageUnavailableError naming
    `target()` and the last error once the budget is spent.
    """
    policy = retry_policy()
    started = time.monotonic()
    delays = policy.delays()
    tries = 0
    while True:
        tries += 1
        try:
            result = await attempt()
        except Exception as error:
            if not is_transient(error):
                raise
            now = time.monotonic()
            left = policy.deadline - (now - started)
            last = f"last error: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
            if left <= 0:
                _mark_down(now)
                raise StorageUnavailableError(
                    target(),
                    f"GCS did not answer for {now - started:.0f} s ({tries} attempts, the "
                    f"retry budget; {RETRY_ENV} changes it); {last}",
                ) from error
            if _known_down(started, policy):
                raise StorageUnavailableError(
                    target(),
                    f"GCS is unreachable (another request just spent the whole retry budget of "
                    f"{policy.deadline:g} s); {last}",
                ) from error
            delay = min(next(delays), left)
            logger.debug("%s: %s; trying again in %.1f s", target(), error, delay)
            await asyncio.sleep(delay)
            continue
        _mark_up()
        return result


def _retry_requests(store) -> None:
    """Sends every HTTP request of the gcsfs instance `store` through `with_retries`.

    gcsfs retries each request 6 times itself (about 30 s); its request function is taken
    without that loop, so that one policy, with one budget, decides.
    """
    send = type(store)._request
    send = getattr(send, "__wrapped__", send)  # gcsfs's request without its retry decorator

    async def request(method, path, *args, **kwargs):
        return await with_retries(
            lambda: send(store, method, path, *args, **kwargs),
            lambda: _request_target(store, path, args, kwargs),
        )

    store._request = request
    store._bertjax_retries = True


def _request_target(store, path: str, args: tuple, kwargs: dict) -> str:
    """`gs://bucket/object` of a gcsfs request, as far as its URL and parameters tell."""
    url = urllib.parse.urlsplit(store._format_path(path, args))
    query = urllib.parse.parse_qs(url.query)
    match = re.search(r"/b/([^/]+)(?:/o/([^/?]+))?", url.path)
    if match is None:
        return urllib.parse.urlunsplit(url._replace(query=""))
    bucket, key = match.group(1), match.group(2)
    if key is None:  # a listing (prefix=), an upload (name= or in the body), the bucket
        key = kwargs.get("prefix") or kwargs.get("name") or (query.get("name") or [None])[0]
        if key is None and isinstance(kwargs.get("data"), (bytes, bytearray)):
            found = re.search(rb'"name": "([^"]+)"', bytes(kwargs["data"][:4096]))
            key = found.group(1).decode() if found else None
    name = urllib.parse.unquote(bucket)
    return f"{GCS_SCHEME}{name}/{urllib.parse.unquote(key)}" if key else f"{GCS_SCHEME}{name}"
