"""A run directory: its layout (named here once), opening any run, the lock, the checks.

A work directory (`--workdir`) is laid out as:

    corpus/            pretraining: the built-in demo corpus, when no input was given
    data/              pretraining: prepared instances and their tokenizer (unless data.dir
                       points elsewhere)
    checkpoints/       Orbax step directories (params, opt_state, meta): the latest state
    best/              fine-tuning: the parameters of the best epoch by the task's metric
    tokenizer.model    the tokenizer, so the checkpoints open on their own (a WordPiece
                       tokenizer as tokenizer.json)
    metrics.jsonl      one JSON object per logged step
    tensorboard/       TensorBoard event files
    run.lock           who is training here now (host and process id)
    result.json        fine-tuning: the best epoch and its validation metrics
    predictions_<split>.tsv   fine-tuning: the best parameters' predictions of a test file
    seed_<n>/          fine-tuning with several seeds: one such directory per seed, and
    seeds.json         every seed's best value and their median

Every other module takes these names from here. `open_run(path, step)` opens a bertjax
work directory (pretraining or fine-tuning) or a Hugging Face / exported directory and
returns its architecture, tokenizer and head, checked against each other once;
`read_params` then reads its parameters (onto one device or a mesh). `bertjax.load`,
`bertjax.Model.load` and fine-tuning's init_from all open runs this way. Files a run
writes besides checkpoints and metrics go through `write_text`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import jax

from bertjax import capability, encoders
from bertjax.capability import HeadSpec
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import networks, steps
from bertjax.engine.settings import ConfigError
from bertjax.storage import fs, hf
from bertjax.text.directory import load_tokenizer
from bertjax.text.tokenizer import HF_TOKENIZER_FILE, SENTENCEPIECE_FILE, Tokenizer

DATA_DIR = "data"
CORPUS_DIR = "corpus"
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
LOCK_FILE = "run.lock"
# Where a fine-tuning run keeps its best checkpoint (by the task's metric), beside
# checkpoints/ (the latest state, for resuming).
BEST_CHECKPOINT_DIR = "best"
# A tokenizer kept beside a run's checkpoints: sentencepiece's model (the name a prepared
# data directory uses too), or WordPiece's tokenizer.json.
TOKENIZER_FILES = (SENTENCEPIECE_FILE, HF_TOKENIZER_FILE)
RESULT_FILE = "result.json"
SEEDS_FILE = "seeds.json"
SEED_DIR = "seed_{}"
PREDICTIONS_FILE = "predictions_{}.tsv"

# What open_run found.
PRETRAINED = "pretrained"  # a pretraining work directory
FINETUNED = "finetuned"  # a fine-tuning work directory (its checkpoints carry a head)
HUGGING_FACE = "hf"  # a transformers directory, or one Model.save_hf wrote


class IncompatibleCheckpointError(ConfigError):
    """A checkpoint that does not fit the run's tokenizer or model; the message says how."""


class WorkdirLockedError(RuntimeError):
    """Another live run holds the work directory."""


class RunDirectoryError(ValueError):
    """A directory that is no run, or whose parts do not belong together; the message says how."""


def tokenizer_file(tokenizer: Tokenizer) -> str:
    """The name a run directory keeps this tokenizer under."""
    return SENTENCEPIECE_FILE if tokenizer.kind == "sentencepiece" else HF_TOKENIZER_FILE


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes one of a run's small files (results, predictions) whole, local or gs://."""
    fs.write_text(path, text)


@dataclasses.dataclass(frozen=True)
class Run:
    """An opened run: what it is, its architecture, tokenizer and head (parameters come with
    `read_params`)."""

    path: fs.AnyPath
    kind: str  # PRETRAINED, FINETUNED or HUGGING_FACE
    config: Any  # the encoder family's config (bertjax.encoders)
    tokenizer: Tokenizer
    head: HeadSpec | None  # the fine-tuning head its parameters include
    checkpoints: fs.AnyPath | None  # the Orbax directory its parameters come from
    step: int | None  # the step asked for; None: the newest readable one
    best: bool = False  # the checkpoints are a fine-tuning run's best/
    params: Any = None  # HUGGING_FACE: host arrays, read with the config
    fresh: tuple[str, ...] = ()  # HUGGING_FACE: parameter groups the files did not have


def open_run(
    path: str | os.PathLike,
    step: int | None = None,
    *,
    best: bool = True,
    pretraining_heads: bool = True,
    **overrides,
):
    """Opens a bertjax work directory, a bertjax export or a Hugging Face BERT directory.

    `step` picks a checkpoint of a work directory (default: the newest readable one; for a
    fine-tuning run with `best`, its best one). The tokenizer must be the one the checkpoint
    was trained with. `overrides` are encoder config fields (e.g. dtype) of a Hugging Face
    directory. Raises RunDirectoryError, FileNotFoundError, or what reading the files does.
    """
    path = fs.path(path)
    with fs.errors(path, "read"):
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
    if (path / CHECKPOINT_DIR).is_dir():
        use_best = best and step is None and (path / BEST_CHECKPOINT_DIR).is_dir()
        checkpoints = path / (BEST_CHECKPOINT_DIR if use_best else CHECKPOINT_DIR)
        # The small meta item first: a mismatch is found before any array is read.
        meta = checkpoint_lib.read_meta(checkpoints, step=step)
        config = encoders.config_from_dict(meta["model_config"])
        tokenizer = _run_tokenizer(path, meta["tokenizer_fingerprint"], config)
        head = HeadSpec.from_dict(meta["head"]) if "head" in meta else None
        kind = FINETUNED if head is not None else PRETRAINED
        return Run(path, kind, config, tokenizer, head, checkpoints, step, use_best)
    if (path / hf.CONFIG_NAME).is_file():  # transformers: BERT, ModernBERT (bertjax.encoders)
        if step is not None:
            raise RunDirectoryError(
                f"step={step} applies to bertjax work directories; {path} is a Hugging Face "
                "directory with a single set of weights"
            )
        # The encoder family of config.json's model_type reads it.
        config, params, head, fresh = encoders.read_transformers(
            path, pretraining_heads=pretraining_heads, **overrides
        )
        try:
            tokenizer = load_tokenizer(path)
        except FileNotFoundError:
            raise RunDirectoryError(
                f"{path} has a model but no tokenizer: expected tokenizer.json, vocab.txt or "
                "tokenizer.model beside config.json"
            ) from None
        return Run(
            path, HUGGING_FACE, config, tokenizer, head, None, None, params=params, fresh=fresh
        )
    raise RunDirectoryError(
        f"{path} is neither a bertjax work directory (expected {CHECKPOINT_DIR}/ with "
        f"checkpoints and {SENTENCEPIECE_FILE}) nor a Hugging Face BERT directory (expected "
        f"{hf.CONFIG_NAME}, {hf.SAFE_WEIGHTS_NAME} or {hf.TORCH_WEIGHTS_NAME}, and "
        "tokenizer.json or vocab.txt); seeds of a several-seed run are in its seed_<n>/ "
        "directories"
    )


def _run_tokenizer(path: fs.AnyPath, fingerprint: str, config: Any) -> Tokenizer:
    """The tokenizer beside a run's checkpoints, checked against the one they were trained
    with."""
    for name in TOKENIZER_FILES:
        if (path / name).is_file():
            tokenizer = Tokenizer.load(path / name)
            break
    else:
        raise RunDirectoryError(
            f"{path} has checkpoints but no tokenizer beside them "
            f"({' or '.join(TOKENIZER_FILES)}); copy the tokenizer of the data it was "
            "trained on there"
        )
    if tokenizer.fingerprint != fingerprint or tokenizer.vocab_size != config.vocab_size:
        raise RunDirectoryError(
            f"{path}: the checkpoint was trained with tokenizer {fingerprint[:12]} "
            f"({config.vocab_size} pieces), but {path / name} is "
            f"{tokenizer.fingerprint[:12]} ({tokenizer.vocab_size} pieces): its "
            "vocabulary does not match the checkpoint's; put the training data's "
            "tokenizer there"
        )
    return tokenizer


def read_params(run: Run, mesh: jax.sharding.Mesh | None = None) -> tuple[int | None, Any]:
    """(step, parameters) of an opened run: the parameters only, never the optimizer state;
    a pretraining run's as its family's pretraining tree (`read_networks`' model).

    Without a mesh they land on this machine's first device, whatever mesh they were saved
    from; with one, sharded as the run's own model lays them out there. A Hugging Face
    directory's are host arrays (step None).
    """
    step, networks = read_networks(run, mesh)
    return step, networks[""].params


def read_networks(
    run: Run, mesh: jax.sharding.Mesh | None = None
) -> tuple[int | None, dict[str, networks.Network]]:
    """(step, the networks of an opened run by name): "" the model of its family (with the
    groups it lacks freshly made: `fresh`), and for a pretraining run any network trained
    beside it, as its objective opens them (engine.networks, e.g. replaced-token
    detection's "generator")."""
    if run.kind == HUGGING_FACE:
        return None, {"": networks.Network(run.config, run.params, run.fresh)}
    family = encoders.family_of(run.config)
    abstract = None
    if mesh is not None:
        if run.kind == PRETRAINED:
            init = family.pretraining_init(run.config)
        else:  # the layout of the head's capability
            init = capability.of(run.head).init(run.config, run.head)
        abstract = steps.make_state(init, None, mesh).abstract.params
    step, params, meta = checkpoint_lib.restore_params(
        run.checkpoints,
        step=run.step,
        abstract_params=abstract,
        # A pretraining run may hold more than its family's model (engine.networks).
        layout_only=run.kind == PRETRAINED,
    )
    if run.kind == PRETRAINED:
        return step, networks.of_run(run.config, params, meta)
    return step, {"": networks.Network(run.config, params)}


def checkpoint_dir(path: str | os.PathLike) -> fs.AnyPath:
    """The checkpoint directory of a workdir, or `path` itself when it is one already."""
    path = fs.path(path)
    return path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path


def check_compatible(
    meta: dict, tokenizer: Tokenizer, model_config: Any, what: str, *, new_phase: bool = False
) -> dict[str, list]:
    """Fails, naming the difference, unless a checkpoint fits this run's tokenizer and model.

    Checked on the checkpoint's small meta item before any array is read, so a config
    mistake is reported as one rather than as an unreadable checkpoint. A `new_phase` (a run
    that starts from another's parameters) may change the family's phase_fields, e.g. a
    context extension's rotary theta; returns those it changes, {field: [old, new]}.
    """
    if meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise IncompatibleCheckpointError(
            f"{what} was trained with tokenizer {meta['tokenizer_fingerprint'][:12]}, but the "
            f"run's data uses {tokenizer.fingerprint[:12]}; point config.data.dir at the data "
            "it was trained on"
        )
    source = encoders.config_from_dict(meta["model_config"])
    family = encoders.family_of(model_config)
    if encoders.family_of(source) is not family:
        raise IncompatibleCheckpointError(
            f"{what} has a {encoders.family_of(source).name} model, this run's config.model "
            f"is a {family.name} one"
        )
    changed = {}
    # scan_layers changes how the layers are stored, so the saved arrays' shapes with it.
    for field in (*family.architecture_fields, "scan_layers"):
        old, new = getattr(source, field), getattr(model_config, field)
        if old == new:
            continue
        if new_phase and field in family.phase_fields:
            changed[field] = [old, new]
            continue
        raise IncompatibleCheckpointError(
            f"{what} has a model with {field}={old!r}, this run's config.model gives {new!r}"
        )
    return changed


@dataclasses.dataclass(frozen=True)
class PhaseStart:
    """Where a new training phase's parameters came from, as its checkpoints record it."""

    init_from: str
    step: int  # the source checkpoint's step
    changed: dict[str, list]  # phase fields the new phase changes: {field: [old, new]}

    def describe(self) -> str:
        changes = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in self.changed.items())
        return f"{self.init_from} (step {self.step})" + (f"; changed {changes}" if changes else "")


def trained_tokenizer(init_from: str | os.PathLike) -> fs.AnyPath | None:
    """The sentencepiece model beside a run's checkpoints (`init_from` being its work
    directory or its checkpoint directory), or None when there is none."""
    path = fs.path(init_from)
    workdir = path if (path / CHECKPOINT_DIR).is_dir() else path.parent
    candidate = workdir / SENTENCEPIECE_FILE
    return candidate if candidate.is_file() else None


def load(workdir: str | os.PathLike, step: int | None = None) -> tuple[Any, Any, Tokenizer]:
    """(config, params, tokenizer) of a run, from its latest (or the given) checkpoint.

    Reads the parameters only, never the optimizer state, and places them on this
    machine's first device whatever mesh they were saved from. They are the whole tree the
    run trained (a replaced-token detection run's generator too; Model.load opens each
    network as a model).
    """
    workdir = fs.path(workdir)
    if not (workdir / CHECKPOINT_DIR).is_dir():
        raise FileNotFoundError(
            f"{workdir} has no {CHECKPOINT_DIR}/ directory: is it a bertjax work directory?"
        )
    run = open_run(workdir, step, best=False)
    _, params, _ = checkpoint_lib.restore_params(run.checkpoints, step=run.step)
    return run.config, params, run.tokenizer


def restore_run_params(
    init_from: str | os.PathLike, tokenizer: Tokenizer, model_config: Any, abstract_params
) -> tuple[Any, PhaseStart]:
    """Parameters of another run (phase 1 for phase 2, a stable phase for its decay, a short
    context for a longer one), placed as `abstract_params` says, and what the new phase
    starts from."""
    directory = checkpoint_dir(init_from)
    changed = check_compatible(
        checkpoint_lib.read_meta(directory),
        tokenizer,
        model_config,
        f"config.init_from={str(init_from)!r}",
        new_phase=True,
    )
    step, params, _ = checkpoint_lib.restore_params(directory, abstract_params=abstract_params)
    return params, PhaseStart(str(init_from), int(step), changed)


# The lock of a work directory on GCS, where no process can see another host's: the holder
# rewrites the lock object every LOCK_HEARTBEAT_SECONDS, and one whose last write (the
# store's own `updated` time, compared with the store's clock) is older than
# LOCK_STALE_SECONDS is a dead run's, taken over. Both can be set per run through the
# environment variables named below (e.g. shorter in tests, longer on a flaky network).
LOCK_HEARTBEAT_SECONDS = 30.0
LOCK_STALE_SECONDS = 120.0
LOCK_HEARTBEAT_ENV = "BERTJAX_LOCK_HEARTBEAT_SECONDS"
LOCK_STALE_ENV = "BERTJAX_LOCK_STALE_SECONDS"

logger = logging.getLogger(__name__)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _seconds_from_env(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{name}={text!r} is invalid; must be a number of seconds > 0")
    return value


class WorkdirLock:
    """Keeps two runs out of one work directory (a second one would delete the first one's
    in-progress save). The lock file names the host and process that hold it.

    On disk a lock whose process is gone (killed on this host) is taken over; another host's
    lock is respected. On GCS the lock object is created only if absent (a precondition the
    store checks), a background thread rewrites it every `heartbeat_seconds`, and a lock not
    rewritten for `stale_after_seconds` by the store's clock is a dead run's (as is one whose
    process is gone from this host): it is taken over by a write conditional on the
    generation found, so of two takers exactly one wins.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        heartbeat_seconds: float | None = None,
        stale_after_seconds: float | None = None,
    ):
        self.path = fs.path(workdir) / LOCK_FILE
        self.remote = fs.is_remote(self.path)
        self.heartbeat_seconds = heartbeat_seconds or _seconds_from_env(
            LOCK_HEARTBEAT_ENV, LOCK_HEARTBEAT_SECONDS
        )
        self.stale_after_seconds = stale_after_seconds or _seconds_from_env(
            LOCK_STALE_ENV, LOCK_STALE_SECONDS
        )
        if self.stale_after_seconds <= 2 * self.heartbeat_seconds:
            raise ConfigError(
                f"lock staleness {self.stale_after_seconds} s must exceed two heartbeats "
                f"({self.heartbeat_seconds} s each), or a live run's lock could be taken"
            )
        self._held = False
        self._generation: int | None = None  # GCS: the lock object's generation we wrote
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.lost = False  # GCS: another run took the lock over (this one was silent too long)

    def acquire(self) -> WorkdirLock:
        if self.remote:
            return self._acquire_remote()
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
                    raise self._refusal(holder, "") from None
                self.path.unlink(missing_ok=True)  # stale or unreadable: take it over
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._held = True
            return self

    def _refusal(self, holder: dict, detail: str) -> WorkdirLockedError:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
        gone = (
            f"If that process is gone, its lock is taken over once it is older than "
            f"{self.stale_after_seconds:g} s, or delete {self.path}"
            if self.remote
            else f"If that process is gone, delete {self.path}"
        )
        return WorkdirLockedError(
            f"{self.path.parent} is in use by process {holder.get('pid')} on "
            f"{holder.get('host')} (since {since}{detail}); wait for it to finish or use "
            f"another --workdir. {gone}"
        )

    def _acquire_remote(self) -> WorkdirLock:
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.time(),
            "token": uuid.uuid4().hex,  # tells this run's lock from a later one of the same pid
        }
        self._me = me
        data = json.dumps(me).encode()
        for _ in range(20):
            generation = fs.write_if_generation(self.path, data, 0)  # create if absent
            if generation is not None:
                return self._hold(generation)
            try:
                found = fs.stat_remote(self.path)
                holder = json.loads(fs.read_bytes(self.path))
            except FileNotFoundError:
                continue  # released meanwhile: try again
            except fs.StorageError:
                raise
            except ValueError:
                holder = {}
            if holder.get("token") == me["token"]:
                # Our own write: it reached the store but its answer was lost, and the
                # retried write found the object there.
                return self._hold(int(found["generation"]))
            age = fs.server_time(self.path.parent) - fs.parse_time(found["updated"])
            # Dead: silent too long, or (on this host, where it can be checked) gone.
            if age <= self.stale_after_seconds and not self._is_stale(holder):
                raise self._refusal(holder, f", last heartbeat {max(age, 0.0):.0f} s ago")
            # Replace exactly the generation found stale: if another run took it over (or
            # its holder wrote a heartbeat) meanwhile, this write fails and we look again.
            generation = fs.write_if_generation(self.path, data, int(found["generation"]))
            if generation is not None:
                logger.warning(
                    "took over the lock %s of process %s on %s (gone; last heartbeat %.0f s ago)",
                    self.path,
                    holder.get("pid"),
                    holder.get("host"),
                    age,
                )
                return self._hold(generation)
        raise WorkdirLockedError(f"{self.path}: the lock kept changing hands; try again")

    def _hold(self, generation: int) -> WorkdirLock:
        self._generation = generation
        self._held = True
        self._stop.clear()
        self._heartbeat = threading.Thread(
            target=self._beat, name="bertjax-lock-heartbeat", daemon=True
        )
        self._heartbeat.start()
        return self

    def _beat(self) -> None:
        """Rewrites the lock object (conditional on our generation) until released."""
        data = json.dumps(self._me).encode()
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                generation = fs.write_if_generation(self.path, data, self._generation)
                if generation is None:
                    generation = self._own_generation()
            except Exception as e:  # noqa: BLE001 - a failed heartbeat is retried next time
                logger.warning("could not renew the lock, trying again: %s", _one_line(e))
                continue
            if generation is None:
                self.lost = True
                logger.error(
                    "the lock %s was taken over by another run (this one missed its "
                    "heartbeats for over %g s); two runs may now write to %s",
                    self.path,
                    self.stale_after_seconds,
                    self.path.parent,
                )
                return
            self._generation = generation

    def _own_generation(self) -> int | None:
        """The lock object's generation if it still holds this run's token, else None.

        A conditional write whose answer was lost and that was sent again fails its own
        precondition (the first one changed the generation); the object then is ours.
        """
        try:
            found = fs.stat_remote(self.path)
            holder = json.loads(fs.read_bytes(self.path))
        except FileNotFoundError:
            return None
        except fs.StorageError:
            raise
        except ValueError:
            return None
        return int(found["generation"]) if holder.get("token") == self._me["token"] else None

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
        if not self._held:
            return
        self._held = False
        if not self.remote:
            self.path.unlink(missing_ok=True)
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        if self.lost:  # only our own generation: never a lock another run took over
            return
        try:
            fs.remove_if_generation(self.path, self._generation)
        except fs.StorageError as e:
            # Releasing runs as the run ends, often because of the very failure that makes
            # this fail too; that failure is the one to report. The lock stops being
            # renewed, so the next run takes it over once it is stale.
            logger.warning(
                "could not remove the lock (%s); a later run takes it over, on this host as "
                "soon as this process has ended, from another after %g s",
                _one_line(e),
                self.stale_after_seconds,
            )

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
