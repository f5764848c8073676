"""Compile once: jax's persistent compilation cache, on by default for bertjax's commands.

XLA compiles one program per distinct shape a run meets (each training width, each
evaluation width), and on a CPU that is about half of a short fine-tuning command. jax can
keep compiled programs on disk and load them in the next process, but it keeps nothing
unless told where. `enable()` tells it, once per process, before anything compiles: the
commands (bertjax.cli, so train.py and finetune.py) and `bertjax.Model.load` call it, so
the next run of a command, its next seed or the next task of the same shapes loads its
programs instead of compiling them. jax keys an entry by the program, its shapes, its
compile options, the devices, jax's version and the cache's own path, so a stale entry is
never loaded (and a moved cache starts empty).

Where, in order of precedence:
- a user who configured jax's cache already (JAX_COMPILATION_CACHE_DIR set, even empty,
  `jax.config.update("jax_compilation_cache_dir", ...)`, or jax_enable_compilation_cache
  off) keeps exactly their settings: nothing here changes them;
- the command's `--compilation_cache` flag, else the BERTJAX_COMPILATION_CACHE variable: a
  directory, local or `gs://bucket/path` (every host of a TPU pod slice, and every restart
  after a preemption, then reads one cache), or `off`;
- else the user's cache directory: $XDG_CACHE_HOME/bertjax/xla (~/.cache/bertjax/xla).

A local cache is kept under BERTJAX_COMPILATION_CACHE_MAX_GB gigabytes (default 2) by a
prune at start-up that deletes the least recently used entries down to half the limit. jax's
own bound (jax_compilation_cache_max_size) takes a file lock and lists the whole directory
at every read and write, which slowed a cold run of the test suite by 40 %. A bucket is not
pruned here: a lifecycle rule on it (delete objects older than N days) bounds it better.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Mapping

import jax

from bertjax.storage import fs

# The variables a user sets: where the cache lives (or "off"), and its bound.
DIRECTORY_VARIABLE = "BERTJAX_COMPILATION_CACHE"
MAX_GB_VARIABLE = "BERTJAX_COMPILATION_CACHE_MAX_GB"
# jax's own variable: set (even empty), it means the user configured jax's cache.
JAX_DIRECTORY_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
JAX_MIN_COMPILE_TIME_VARIABLE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
OFF = "off"
_OFF_WORDS = (OFF, "0", "false", "no", "none", "")
DEFAULT_MAX_GB = 2.0
# jax writes only programs that took at least this long to compile (its default is 1 s). On
# a CPU most of a run's programs compile in well under a second, and loading one costs a
# file read, so every program is kept.
MIN_COMPILE_TIME_SECS = 0.0
# The endings of the files jax writes in a cache directory (an entry, and the access time
# that jax's own bound keeps): a prune deletes nothing else, whatever directory it is given.
_ENTRY_SUFFIXES = ("-cache", "-atime")


class CompilationCacheError(ValueError):
    """A cache setting that cannot be used; the message names the variable and the value."""


@dataclasses.dataclass(frozen=True)
class CacheSettings:
    """Where compiled programs are kept (None: nowhere) and the bound of a local cache."""

    directory: str | None
    max_bytes: int

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, directory: str | None = None
    ) -> CacheSettings:
        """The settings the variables give (default: this process's environment);
        `directory` (a command's flag) wins over BERTJAX_COMPILATION_CACHE."""
        environ = os.environ if environ is None else environ
        chosen = directory if directory is not None else environ.get(DIRECTORY_VARIABLE)
        if chosen is None:
            chosen = str(default_directory(environ))
        elif chosen.strip().lower() in _OFF_WORDS:
            chosen = None
        raw = environ.get(MAX_GB_VARIABLE, str(DEFAULT_MAX_GB))
        try:
            gigabytes = float(raw)
        except ValueError:
            gigabytes = math.nan
        if not (math.isfinite(gigabytes) and gigabytes > 0):
            raise CompilationCacheError(
                f"{MAX_GB_VARIABLE}={raw!r} is invalid: give a positive number of gigabytes "
                f"(e.g. {DEFAULT_MAX_GB:g}), or set {DIRECTORY_VARIABLE}={OFF} to keep no cache"
            )
        return cls(chosen, int(gigabytes * 1024**3))


def default_directory(environ: Mapping[str, str] | None = None) -> pathlib.Path:
    """The user's cache directory for compiled programs: $XDG_CACHE_HOME/bertjax/xla, else
    ~/.cache/bertjax/xla."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "bertjax" / "xla"


def configured_by_user(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process's jax cache was configured before bertjax looked: then bertjax
    leaves it exactly as it is (on, off or elsewhere)."""
    environ = os.environ if environ is None else environ
    return (
        JAX_DIRECTORY_VARIABLE in environ
        or jax.config.jax_compilation_cache_dir is not None
        or not jax.config.jax_enable_compilation_cache
    )


def enable(settings: CacheSettings | None = None) -> str | None:
    """Keeps this process's compiled programs in the settings' directory (default:
    `CacheSettings.from_environment()`), unless jax's cache was configured already; returns
    the directory jax's cache uses now (None: none). Call it before the first compile:
    programs compiled earlier are not written. Calling it again changes nothing."""
    if configured_by_user():
        return jax.config.jax_compilation_cache_dir or None
    settings = CacheSettings.from_environment() if settings is None else settings
    if settings.directory is None:
        return None
    if fs.is_remote(settings.directory):
        fs.require_gcs(settings.directory)  # a bucket without the gcs extra: one line
    else:
        try:
            os.makedirs(settings.directory, exist_ok=True)
        except OSError as err:
            raise CompilationCacheError(
                f"cannot make the compilation cache directory {settings.directory} "
                f"({err.strerror}); give another one (--compilation_cache=DIR or "
                f"{DIRECTORY_VARIABLE}=DIR), or '{OFF}' to keep no cache"
            ) from None
        prune(pathlib.Path(settings.directory), settings.max_bytes)
    if JAX_MIN_COMPILE_TIME_VARIABLE not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_SECS)
    jax.config.update("jax_compilation_cache_dir", settings.directory)
    return settings.directory


def prune(directory: pathlib.Path, limit_bytes: int) -> int:
    """Once jax's entries in `directory` hold more than `limit_bytes`, deletes the least
    recently used until they hold half that; returns how many it deleted. jax does not touch
    an entry it loads, so "used" is the later of its write and its last read as the file
    system records it (atime, which most mounts update about once a day). Files that are not
    jax's entries are neither counted nor deleted."""
    if not directory.is_dir():
        return 0
    entries = []
    for entry in directory.iterdir():
        if entry.name.endswith(_ENTRY_SUFFIXES):
            try:
                entries.append((entry.stat(), entry))
            except FileNotFoundError:  # deleted by another process meanwhile
                continue
    total = sum(stat.st_size for stat, _ in entries)
    if total <= limit_bytes:
        return 0
    deleted = 0
    for stat, entry in sorted(entries, key=lambda pair: max(pair[0].st_atime, pair[0].st_mtime)):
        if total <= limit_bytes // 2:
            break
        entry.unlink(missing_ok=True)
        total -= stat.st_size
        deleted += 1
    return deleted
