"""What train.py and finetune.py share: the flags, the multi-host start, one-line failures.

A job is `job(config, workdir)`; `run(job, ...)` parses the flags, turns jax's persistent
compilation cache on (bertjax.engine.compilation_cache: a second run loads the programs the first
compiled), starts the distributed runtime when asked, runs the job, and turns a failure into
one line and a non-zero exit (`--verbose` shows the traceback). A bad `--config.FIELD=VALUE`
override is reported in one line too, with the closest existing field when the name is
misspelt.
"""

from __future__ import annotations

import gc
import importlib.util
import logging as python_logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from bertjax.engine import compilation_cache, host_memory
from bertjax.engine import settings as settings_lib
from bertjax.storage import fs

FLAGS = flags.FLAGS

# The storage clients below bertjax log each failed request, often with a traceback (and
# asyncio the requests they abandon), while bertjax retries it and reports in one line what
# finally failed. Their records are shown with --verbose only.
STORAGE_CLIENT_LOGGERS = ("gcsfs", "fsspec", "aiohttp", "asyncio", "google", "urllib3")

# Allocations (less deallocations) between two young collections of Python's cyclic garbage
# collector; Python's default is 700. Tracing and lowering a program make and drop millions of
# small objects, and at 700 the collector runs thousands of times while a command compiles,
# each time walking every young object (docs/compiling.md, "Python's garbage collector").
# Cyclic garbage is still freed, in fewer, larger collections.
GC_YOUNG_THRESHOLD = 50_000


def collect_garbage_less_often() -> None:
    """Python's young garbage collections every GC_YOUNG_THRESHOLD allocations instead of 700
    (older generations keep their defaults): for a process that compiles many programs."""
    gc.set_threshold(GC_YOUNG_THRESHOLD)


def define_flags(default_config: str, default_workdir: str, what: str) -> None:
    """The --config file flag (with its --config.FIELD overrides) and the common flags."""
    # ml_collections applies the --config.FIELD overrides of sys.argv as the flag is defined.
    _reporting_bad_overrides(
        lambda: config_flags.DEFINE_config_file(
            "config", default_config, f"{what} config file.", lock_config=True
        ),
        sys.argv,
        default_config,
    )
    flags.DEFINE_string("workdir", default_workdir, "Where checkpoints, metrics and data go.")
    flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (multi-host).")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process).")
    flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).")
    flags.DEFINE_integer("process_id", None, "This process's index (multi-process).")
    flags.DEFINE_bool("verbose", False, "Show the traceback of a failure, not just its message.")
    flags.DEFINE_string(
        "compilation_cache",
        None,
        "Where compiled programs are kept for the next run: a directory, gs://bucket/path, "
        f"or '{compilation_cache.OFF}' (default: ${compilation_cache.DIRECTORY_VARIABLE}, "
        "else ~/.cache/bertjax/xla; JAX_COMPILATION_CACHE_DIR, when set, wins).",
    )


def run(
    job: Callable[[Any, str], Any], default_config: str, expected: tuple[type[BaseException], ...]
) -> None:
    """Runs `job(FLAGS.config, FLAGS.workdir)` as a command; `expected` failures are shown
    by their message alone, any other also by its type."""

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
        # Library chatter (Orbax logs every save at INFO) would drown the progress bar.
        logging.set_verbosity(logging.WARNING)
        if not FLAGS.verbose:
            for name in STORAGE_CLIENT_LOGGERS:
                python_logging.getLogger(name).setLevel(python_logging.CRITICAL + 1)
        try:
            # A work directory that cannot be reached (gs:// without the gcs extra, another
            # scheme) is named before anything starts or is written.
            fs.path(FLAGS.workdir)
            # Before anything compiles: programs compiled earlier would not be kept.
            compilation_cache.enable(
                compilation_cache.CacheSettings.from_environment(directory=FLAGS.compilation_cache)
            )
            # The distributed runtime must start before anything touches a device.
            if FLAGS.distributed or FLAGS.coordinator_address:
                jax.distributed.initialize(
                    coordinator_address=FLAGS.coordinator_address,
                    num_processes=FLAGS.num_processes,
                    process_id=FLAGS.process_id,
                )
            job(FLAGS.config, FLAGS.workdir)
        except KeyboardInterrupt:
            _end_after_failure("interrupted")
        except Exception as e:
            if FLAGS.verbose:
                raise
            if isinstance(e, (*expected, fs.StorageError, compilation_cache.CompilationCacheError)):
                _end_after_failure(f"error: {e}")
            _end_after_failure(f"error: {type(e).__name__}: {e} (--verbose shows where)")

    def parse_flags(argv: list[str]) -> list[str]:
        return _reporting_bad_overrides(lambda: FLAGS(argv), argv, default_config)

    collect_garbage_less_often()
    # Before jax creates its CPU client (bertjax.engine.host_memory): a CPU step's buffers then
    # reuse the pages the step before it wrote instead of faulting in fresh ones.
    host_memory.keep_freed_memory()
    app.run(main, flags_parser=parse_flags)


# How long a failed command waits for library threads still running before it ends.
FAILURE_GRACE_SECONDS = 5.0


def _end_after_failure(message: str) -> NoReturn:
    """Prints `message` and ends the process with status 1, waiting at most
    FAILURE_GRACE_SECONDS for the threads still running.

    Python's own exit waits for every non-daemon thread. After a storage outage Orbax's
    background commit thread can keep retrying a checkpoint's files for minutes (gcsfs's
    retries, outside bertjax's budget), so a run whose failure was already reported in one
    line would hang instead of ending. What the run wrote is closed by then: the loop's
    `finally` blocks ran before the failure reached this point.
    """
    print(message, file=sys.stderr)
    deadline = time.monotonic() + FAILURE_GRACE_SECONDS
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    python_logging.shutdown()  # flushes the log handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _reporting_bad_overrides(parse: Callable[[], Any], argv: list[str], default_config: str):
    """Runs a step of flag parsing; a bad --config override ends in one line."""
    try:
        return parse()
    except flags.Error as e:
        raise SystemExit(f"error: {e}") from None
    except (AttributeError, KeyError, ValueError, TypeError) as e:
        message = _unknown_field(argv, default_config) or f"bad --config override: {e}"
        raise SystemExit(f"error: {message}") from None


def _config_path(argv: list[str], default_config: str) -> str:
    for index, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
    return default_config


def _unknown_field(argv: list[str], default_config: str) -> str | None:
    """A message naming the first --config.FIELD override that the config does not have."""
    path = _config_path(argv, default_config)
    spec = importlib.util.spec_from_file_location("_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        field = arg[len("--config.") :].split("=", 1)[0]
        try:
            settings_lib.config_value(config, field)
        except (KeyError, AttributeError):
            guess = settings_lib.suggest_field(config, field)
            hint = f"; did you mean config.{guess}?" if guess else ""
            return f"config.{field} is not a field of {path}{hint}"
    return None
