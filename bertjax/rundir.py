"""A run directory: its layout (named here once), the lock, compatibility checks, loading.

A work directory (`--workdir`) is laid out as:

    corpus/            the built-in demo corpus, when no input was given
    data/              prepared instances and their tokenizer (unless data.dir points elsewhere)
    checkpoints/       Orbax step directories (params, opt_state, meta)
    tokenizer.model    a copy of the data's tokenizer, so the checkpoints open on their own
    metrics.jsonl      one JSON object per logged step
    tensorboard/       TensorBoard event files
    run.lock           who is training here now (host and process id)

    best/              fine-tuning: the parameters of the best epoch (Orbax)

Every other module takes these names from here.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import time
from typing import Any

from bertjax import checkpoint as checkpoint_lib
from bertjax.model import ARCHITECTURE_FIELDS, BertConfig
from bertjax.settings import ConfigError
from bertjax.tokenizer import SENTENCEPIECE_FILE, Tokenizer

DATA_DIR = "data"
CORPUS_DIR = "corpus"
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
LOCK_FILE = "run.lock"
# Where a fine-tuning run keeps its best checkpoint (by the task's metric), beside
# checkpoints/ (the latest state, for resuming).
BEST_CHECKPOINT_DIR = "best"
# The tokenizer beside the checkpoints: sentencepiece's model (the name a prepared data
# directory uses too).
TOKENIZER_COPY = SENTENCEPIECE_FILE


class IncompatibleCheckpointError(ConfigError):
    """A checkpoint that does not fit the run's tokenizer or model; the message says how."""


class WorkdirLockedError(RuntimeError):
    """Another live run holds the work directory."""


def checkpoint_dir(path: str | os.PathLike) -> pathlib.Path:
    """The checkpoint directory of a workdir, or `path` itself when it is one already."""
    path = pathlib.Path(path)
    return path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path


def check_compatible(meta: dict, tokenizer: Tokenizer, model_config: BertConfig, what: str) -> None:
    """Fails, naming the difference, unless a checkpoint fits this run's tokenizer and model.

    Checked on the checkpoint's small meta item before any array is read, so a config
    mistake is reported as one rather than as an unreadable checkpoint.
    """
    if meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise IncompatibleCheckpointError(
            f"{what} was trained with tokenizer {meta['tokenizer_fingerprint'][:12]}, but the "
            f"run's data uses {tokenizer.fingerprint[:12]}; point config.data.dir at the data "
            "it was trained on"
        )
    source = meta["model_config"]
    # scan_layers changes how the layers are stored, so the saved arrays' shapes with it.
    for field in (*ARCHITECTURE_FIELDS, "scan_layers"):
        if source[field] != getattr(model_config, field):
            raise IncompatibleCheckpointError(
                f"{what} has a model with {field}={source[field]!r}, this run's config.model "
                f"gives {getattr(model_config, field)!r}"
            )


def load(workdir: str | os.PathLike, step: int | None = None) -> tuple[BertConfig, Any, Tokenizer]:
    """(config, params, tokenizer) of a run, from its latest (or the given) checkpoint.

    Reads the parameters only, never the optimizer state, and places them on this
    machine's first device whatever mesh they were saved from.
    """
    workdir = pathlib.Path(workdir)
    checkpoints = workdir / CHECKPOINT_DIR
    if not checkpoints.is_dir():
        raise FileNotFoundError(
            f"{workdir} has no {CHECKPOINT_DIR}/ directory: is it a bertjax work directory?"
        )
    _, params, meta = checkpoint_lib.restore_params(checkpoints, step=step)
    config = BertConfig.from_dict(meta["model_config"])
    tokenizer = Tokenizer.load(
        workdir / TOKENIZER_COPY, expected_fingerprint=meta["tokenizer_fingerprint"]
    )
    return config, params, tokenizer


def restore_run_params(
    init_from: str | os.PathLike, tokenizer: Tokenizer, model_config: BertConfig, abstract_params
) -> Any:
    """Parameters of another run (phase 1 for phase 2), placed as `abstract_params` says."""
    directory = checkpoint_dir(init_from)
    check_compatible(
        checkpoint_lib.read_meta(directory),
        tokenizer,
        model_config,
        f"config.init_from={str(init_from)!r}",
    )
    _, params, _ = checkpoint_lib.restore_params(directory, abstract_params=abstract_params)
    return params


class WorkdirLock:
    """Keeps two runs out of one work directory (a second one would delete the first one's
    in-progress save). The lock file names the host and process that hold it; a lock whose
    process is gone (killed on this host) is taken over."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = pathlib.Path(workdir) / LOCK_FILE
        self._held = False

    def acquire(self) -> WorkdirLock:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None and self._age() < 2.0:
                    time.sleep(0.1)  # just created by another process, not yet written
                    continue
                if holder is not None and not self._is_stale(holder):
                    since = time.strftime(
                        "%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0))
                    )
                    raise WorkdirLockedError(
                        f"{self.path.parent} is in use by process {holder.get('pid')} on "
                        f"{holder.get('host')} (since {since}); wait for it to finish or use "
                        f"another --workdir. If that process is gone, delete {self.path}"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale or unreadable: take it over
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._held = True
            return self

    def _age(self) -> float:
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return 0.0

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _is_stale(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False  # another host's process cannot be checked from here
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, TypeError, ValueError):
            return False
        return False

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
