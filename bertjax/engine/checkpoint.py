"""Orbax checkpoints: periodic async saves, resume with fallback, params-only loading.

Layout of a checkpoint directory (one sub-directory per finished step)::

    <directory>/
      1000/                           a finished step. Orbax writes it as
                                        1000.orbax-checkpoint-tmp-<t>/ and renames it only
                                        once every item is written (on object stores, where
                                        rename is not atomic, commit_success.txt marks it)
        _CHECKPOINT_METADATA            step metadata (item names, commit time)
        commit_success.txt
        params/                       item PARAMS_ITEM: the parameter pytree
          _METADATA                     tree structure, shapes, dtypes
          _sharding                     the sharding it was saved with (informative only:
                                          restore uses the target's sharding)
          array_metadatas/, manifest.ocdbt, d/, ocdbt.process_<i>/
                                        the array data in OCDBT (TensorStore) form; each
                                          process writes its own shards under ocdbt.process_<i>
        opt_state/                    item OPT_STATE_ITEM: the optax state, same format
        meta/metadata                 item META_ITEM: JSON written by the trainer (loader
                                        state, rng key data, encoder config dict, tokenizer
                                        fingerprint, ...) plus, under INTEGRITY_KEY, a
                                        fingerprint of every array leaf taken at save time
      2000.orbax-checkpoint-tmp-<t>/  a save in progress or killed mid-write: never restored,
                                        removed when the next Checkpointer opens the directory
      corrupt/2000-<unix time>/       a step that failed to restore, moved aside by
                                        Checkpointer.restore so the resumed run can save it again

Parameters, optimizer state and meta are separate Orbax items so that a notebook reads the
parameters alone (restore_params), never touching the usually larger optimizer state.

Integrity: storage can return different bytes than were written without any error (a
garbled block decodes to other, often finite, numbers). So every save records an exact
fingerprint of each array leaf, computed on the devices from the values being saved, and every
restore recomputes it from the values read and checks them for NaN/inf too. A step that fails
is treated like an unreadable one: named, skipped and, when resuming, moved to corrupt/.
The fingerprint is a sum modulo 2**32 of a hash of each element's bits and its position in
the global array; integer addition is exact and order-free, so it does not depend on how the
array is sharded: each process only reads its own shards, the reduction makes one replicated
number, and a restore onto another mesh (or one device) checks against the same value.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint._src.serialization import tensorstore_utils as _orbax_tensorstore

from bertjax.storage import fs

logger = logging.getLogger(__name__)

PARAMS_ITEM = "params"
OPT_STATE_ITEM = "opt_state"
META_ITEM = "meta"
ITEM_NAMES = (PARAMS_ITEM, OPT_STATE_ITEM, META_ITEM)
# Steps that failed to restore are moved here; not an integer name, so Orbax never lists it.
CORRUPT_SUBDIR = "corrupt"
# The key of the meta item that holds the integrity record; reserved, stripped on restore.
INTEGRITY_KEY = "integrity"
# Names the fingerprint function below; a record with another name is not compared.
FINGERPRINT_ALGORITHM = "bertjax-mix32-sum-v1"


class Restored(NamedTuple):
    """A restored checkpoint: its step, parameters, optimizer state and meta dict."""

    step: int
    params: Any
    opt_state: Any
    meta: dict


class CheckpointRestoreError(RuntimeError):
    """Checkpoints exist but none of the requested steps could be restored."""


class CheckpointIntegrityError(ValueError):
    """A step read back without error whose values differ from those saved, or are not finite."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, permissions, storage error...).

    The message is one line naming the step, the cause and the newest complete step left in
    the directory, fit to print as is; the original error is chained as __cause__.
    """

    def __init__(self, message: str, *, step: int, last_complete_step: int | None):
        super().__init__(message)
        self.step = step
        self.last_complete_step = last_complete_step


def _use_storage_retries() -> None:
    """Gives tensorstore's GCS requests (the arrays of every save and restore) the retry
    budget of `fs.retry_policy`, instead of tensorstore's own 32 attempts (about 15 minutes).

    Orbax 0.12 builds each operation's tensorstore context from these module defaults and
    offers no option for it; the budget is read again for every manager, so it follows
    BERTJAX_GCS_RETRY_SECONDS.
    """
    retries = fs.tensorstore_retries()
    for defaults in (
        getattr(_orbax_tensorstore, "_BASE_TS_CONTEXT", None),
        getattr(_orbax_tensorstore, "_DEFAULT_OCDBT_TS_CONTEXT", None),
    ):
        if isinstance(defaults, dict):
            defaults["gcs_request_retries"] = retries


def _as_path(directory: str | os.PathLike) -> epath.Path:
    """Absolute local paths (Orbax requires them); gs:// kept as given, once `fs.path` has
    checked that it can be reached (the gcs extra installed, a bucket named)."""
    text = os.fspath(fs.path(directory))
    if not fs.is_remote(text):
        text = os.path.abspath(text)
    _use_storage_retries()
    return epath.Path(text)


def _item_handlers() -> dict[str, ocp.CheckpointHandler]:
    # Registered up front so that a fresh manager can read item metadata (shapes, dtypes)
    # without a prior save in the same process.
    return {
        PARAMS_ITEM: ocp.StandardCheckpointHandler(),
        OPT_STATE_ITEM: ocp.StandardCheckpointHandler(),
        META_ITEM: ocp.JsonCheckpointHandler(),
    }


class _ReadOnlyNotice(logging.Filter):
    """Drops Orbax's "Given directory is read only" warning: every reader opens a read-only
    manager on purpose (it never writes beside a live run), so there is nothing to warn of."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.pathname.startswith(_ORBAX_DIR)
            and str(record.msg).startswith("Given directory is read only")
        )


def _read_only_manager(path: epath.Path) -> ocp.CheckpointManager:
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _ReadOnlyNotice) for f in absl_logger.filters):
        absl_logger.addFilter(_ReadOnlyNotice())
    return ocp.CheckpointManager(
        path,
        item_names=ITEM_NAMES,
        item_handlers=_item_handlers(),
        # save_interval_steps=0 and max_to_keep=None: what read_only implies anyway, given
        # explicitly so that Orbax does not warn about changing them on every read.
        options=ocp.CheckpointManagerOptions(
            read_only=True,
            create=False,
            enable_async_checkpointing=False,
            save_interval_steps=0,
            max_to_keep=None,
        ),
    )


# ----------------------------------------------------------------------------- integrity


def _mix32(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a cheap bijection that spreads every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


_UNSIGNED_OF_BITS = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}


def _bit_width(dtype) -> int | None:
    """Bits per element, or None for dtypes the fingerprint does not cover (complex, keys)."""
    if dtype == jnp.bool_:
        return 8
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.finfo(dtype).bits
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).bits
    return None


def _fingerprintable(leaf: Any) -> bool:
    return (
        isinstance(leaf, (jax.Array, np.ndarray))
        and _bit_width(leaf.dtype) in (8, 16, 32, 64)
        and not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended)
    )


def _words(x: jax.Array) -> jax.Array:
    """Each element's bits as one uint32, same shape as x (64-bit elements folded)."""
    bits = _bit_width(x.dtype)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if bits == 64:
        halves = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [*x.shape, 2]
        return halves[..., 0] ^ _mix32(halves[..., 1])
    return jax.lax.bitcast_convert_type(x, _UNSIGNED_OF_BITS[bits]).astype(jnp.uint32)


def _fingerprint(x: jax.Array) -> jax.Array:
    """sum(mix(bits ^ mix(flat index))) mod 2**32: exact, order-free, position-sensitive."""
    index = jnp.zeros(x.shape, jnp.uint32)  # the element's flat position in the global array
    stride = 1
    for axis in reversed(range(x.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(
            stride % 2**32
        )
        stride *= x.shape[axis]
    salt = _mix32(index + jnp.uint32(0x9E3779B9))
    return jnp.sum(_mix32(_words(x) ^ salt), dtype=jnp.uint32)  # wraps: exact in any order


def _leaf_summary(x: jax.Array) -> jax.Array:
    """[fingerprint, finite] of one leaf, as uint32."""
    finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else True
    return jnp.stack([_fingerprint(x), jnp.asarray(finite, jnp.uint32)])  # [2]


# Compiled once per distinct shape, dtype and sharding (14 for BERT-small, whatever the number
# of layers): one program over every leaf compiled 2-3 times slower (benchmarks/checkpoint.py).
_leaf_summary_jit = jax.jit(_leaf_summary)


def _to_host(x: jax.Array) -> np.ndarray:
    if not (x.is_fully_replicated or x.is_fully_addressable):  # multi-process
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


class LeafSummary(NamedTuple):
    """What save records and restore checks for one array leaf."""

    item: str  # PARAMS_ITEM or OPT_STATE_ITEM
    path: str  # jax.tree_util.keystr of the leaf within its item
    dtype: str
    shape: tuple[int, ...]
    fingerprint: int
    finite: bool

    @property
    def name(self) -> str:
        return f"{self.item}{self.path}"


def summarise(trees: dict[str, Any]) -> list[LeafSummary]:
    """Fingerprint and finiteness of every array leaf of {item name: pytree}.

    Reads each leaf once on its devices and brings two numbers per leaf to the host; works on
    sharded arrays across processes. Cost per save, from benchmarks/checkpoint.py on a shared
    2-core CPU: BERT-small with its AdamW state (235 leaves, 333 MiB) about 0.5 s, against
    about 2 s for the save itself, plus 5-7 s to compile on the first save of a run. Integer
    reductions are slow on XLA's CPU backend; on an accelerator it is one read of the state.
    """
    entries = [
        (item, jax.tree_util.keystr(path), leaf)
        for item, tree in trees.items()
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if _fingerprintable(leaf)
    ]
    # One leaf at a time, each fetched before the next is dispatched, once the state itself
    # is computed: at most one of these cross-device reductions is in flight, never queued
    # beside a train step. Dispatching every leaf's program at once (235 for BERT-small)
    # behind an unfinished train step aborted runs on 8 simulated CPU devices under load: an
    # all-reduce rendezvous timed out with some devices still busy with other programs.
    jax.block_until_ready([leaf for _, _, leaf in entries])
    fingerprints, finite = [], []
    for _, _, leaf in entries:
        fingerprint, ok = _to_host(_leaf_summary_jit(leaf))
        fingerprints.append(int(fingerprint))
        finite.append(bool(ok))
    return [
        LeafSummary(item, path, str(leaf.dtype), tuple(leaf.shape), fp, ok)
        for (item, path, leaf), fp, ok in zip(entries, fingerprints, finite)
    ]


def _first_few(names: list[str], limit: int = 5) -> str:
    extra = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + extra


def _integrity_record(summaries: list[LeafSummary]) -> dict:
    leaves: dict[str, dict[str, list]] = {}
    for s in summaries:
        leaves.setdefault(s.item, {})[s.path] = [s.fingerprint, s.dtype, list(s.shape)]
    return {"algorithm": FINGERPRINT_ALGORITHM, "leaves": leaves}


def verify(step: int, meta: dict, trees: dict[str, Any]) -> None:
    """Raise CheckpointIntegrityError unless the restored trees match what step's save recorded.

    Every float leaf must be finite. Leaves with a recorded fingerprint must reproduce it,
    except where the restore target asked for another dtype or shape (then the bits differ by
    design). Checkpoints saved before fingerprints were recorded get the finiteness check only.
    """
    summaries = summarise(trees)
    problems = [f"{s.name} holds NaN or inf" for s in summaries if not s.finite]
    damaged = {s.name for s in summaries if not s.finite}
    record = meta.get(INTEGRITY_KEY)
    if not isinstance(record, dict) or record.get("algorithm") != FINGERPRINT_ALGORITHM:
        logger.info(
            "checkpoint step %d has no integrity record this version can read; "
            "checked its values for NaN/inf only",
            step,
        )
    else:
        saved = record.get("leaves", {})
        for s in summaries:
            entry = saved.get(s.item, {}).get(s.path)
            if entry is None or entry[1] != s.dtype or tuple(entry[2]) != s.shape:
                continue
            if s.name in damaged:
                continue
            if entry[0] != s.fingerprint:
                problems.append(f"{s.name} differs from what was saved (fingerprint mismatch)")
    if problems:
        raise CheckpointIntegrityError(f"checkpoint step {step} is damaged: {_first_few(problems)}")


def _public_meta(meta: Any) -> dict:
    """The caller's meta dict, without the integrity record."""
    return {k: v for k, v in dict(meta).items() if k != INTEGRITY_KEY}


# ----------------------------------------------------------------------------- noise control

_ORBAX_DIR = os.path.dirname(os.path.abspath(ocp.__file__))


class _OrbaxTracebacks(logging.Filter):
    """Keeps Orbax's per-thread tracebacks of a failed save at DEBUG level on this module.

    A failed background write is logged with a full traceback by every Orbax thread it passes
    through (5 to 11 of them) and then raised once to the caller; Checkpointer turns that into
    one CheckpointSaveError, so the logged copies are noise at the default level.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno >= logging.ERROR
            and record.exc_info
            and record.pathname.startswith(_ORBAX_DIR)
        ):
            logger.debug("orbax: %s", record.getMessage(), exc_info=record.exc_info)
            return False
        return True


def _is_abandoned_orbax_work(unraisable: Any) -> bool:
    """An 'Exception ignored' report left behind by a restore or save that failed part-way.

    When one array read or write fails, Orbax closes its event loop while TensorStore is still
    finishing the sibling operations: their completion callbacks find the loop closed
    (RuntimeError from asyncio's call_soon_threadsafe), and the suspended Orbax coroutines
    raise again when they are collected (GeneratorExit re-raised as Exception, or an import
    error at interpreter exit). The failure itself was already raised; these repeat it.
    """
    error = unraisable.exc_value
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        frames = []
        tb = unraisable.exc_traceback
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        return "call_soon_threadsafe" in frames
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and os.path.abspath(code.co_filename).startswith(_ORBAX_DIR)


class _QuietAbandonedWork:
    """sys.unraisablehook wrapper: abandoned Orbax operations go to DEBUG, the rest through."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, unraisable) -> None:
        if _is_abandoned_orbax_work(unraisable):
            logger.debug(
                "ignored a late report of an abandoned checkpoint operation: %r",
                unraisable.exc_value,
            )
            return
        self.previous(unraisable)


def _contain_orbax_noise() -> None:
    """Installs the log filter and unraisable hook above (idempotent, process-wide)."""
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _OrbaxTracebacks) for f in absl_logger.filters):
        absl_logger.addFilter(_OrbaxTracebacks())
    # Installed for good: the late reports arrive whenever TensorStore finishes.
    if not isinstance(sys.unraisablehook, _QuietAbandonedWork):
        sys.unraisablehook = _QuietAbandonedWork(sys.unraisablehook)


def _is_disk_full(error: BaseException | None) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(error)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        error = error.__cause__ or error.__context__
    return False


def _brief(error: BaseException, limit: int = 300) -> str:
    """First line of an error, capped: tensorstore errors embed pages of JSON spec."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(error).__name__}: {text}"


def _candidate_steps(all_steps: list[int], step: int | None, path: epath.Path) -> list[int]:
    """Steps to try, newest first: all of them for step=None, else just the one asked for."""
    if step is None:
        return sorted(all_steps, reverse=True)
    if step not in all_steps:
        raise ValueError(
            f"step={step} is not a checkpoint in {path}; available steps: {sorted(all_steps)}"
        )
    return [step]


def _restore_with_fallback(
    path: epath.Path, steps: list[int], restore_one, *, reader: bool = False
) -> tuple[int, Any, list[int]]:
    """Try restore_one(step) newest first; returns (step, result, steps that failed).

    A failing step is logged with its error; when every step fails, raises
    CheckpointRestoreError listing each step's error (never returns "nothing").
    """
    _contain_orbax_noise()
    failures: list[tuple[int, BaseException]] = []
    vanished: list[int] = []
    for candidate in steps:
        try:
            result = restore_one(candidate)
        except Exception as error:  # noqa: BLE001 - any failure of one step means "try older"
            failures.append((candidate, error))
            if not (path / str(candidate)).exists():
                # A live run deleted it (it keeps only its newest steps): not damage.
                logger.info(
                    "checkpoint step %d in %s was removed while being read", candidate, path
                )
                vanished.append(candidate)
                continue
            logger.warning(
                "checkpoint step %d in %s cannot be restored (%s); trying the previous step",
                candidate,
                path,
                _brief(error),
            )
            continue
        damaged = [s for s, _ in failures if s not in vanished]
        if damaged:
            logger.warning(
                "restored checkpoint step %d from %s after skipping unreadable or damaged "
                "step(s) %s",
                candidate,
                path,
                damaged,
            )
        return candidate, result, damaged
    details = "; ".join(f"step {s}: {_brief(e)}" for s, e in failures)
    if reader:
        raise CheckpointRestoreError(
            f"no checkpoint in {path} could be read (tried steps {sorted(steps)}). "
            f"Errors: {details}"
        ) from failures[0][1]
    raise CheckpointRestoreError(
        f"checkpoints exist in {path} (steps {sorted(steps)}) but none could be restored; "
        f"refusing to start from scratch. Errors: {details}"
    ) from failures[0][1]


class Checkpointer:
    """Saves and restores params, optimizer state and a JSON meta dict with Orbax.

    Saves are asynchronous: `save` returns once the arrays are copied off the devices
    (so the caller may donate or overwrite them) and the write finishes in the background.
    A write that fails raises CheckpointSaveError naming its step: from `check_for_errors`
    (non-blocking, cheap enough for every training step) as soon as the write has failed, and
    at the latest from the next `save`, `wait_until_finished`, `restore` or `close`.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int = 3,
        save_interval_steps: int = 1000,
        async_save: bool = True,
    ):
        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep!r} is invalid; must be an integer >= 1")
        if not isinstance(save_interval_steps, int) or save_interval_steps < 1:
            raise ValueError(
                f"save_interval_steps={save_interval_steps!r} is invalid; must be an integer >= 1"
            )
        self.directory = _as_path(directory)
        self.max_to_keep = max_to_keep
        self.save_interval_steps = save_interval_steps
        policies = ocp.checkpoint_managers
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            # Every N steps or at a preemption sync point; no extra save at the first call.
            save_decision_policy=policies.AnySavePolicy(
                [
                    policies.FixedIntervalPolicy(save_interval_steps),
                    policies.PreemptionCheckpointingPolicy(),
                ]
            ),
            # Leftovers of a save killed mid-write; Orbax never restores from them.
            cleanup_tmp_directories=True,
        )
        _contain_orbax_noise()
        self._manager = ocp.CheckpointManager(
            self.directory, item_names=ITEM_NAMES, item_handlers=_item_handlers(), options=options
        )
        self._async = async_save
        self._in_flight: int | None = None  # the step whose background write is unconfirmed
        self._failed_step: int | None = None  # the last save reported as failed
        self._closed = False

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def latest_step(self) -> int | None:
        """The newest finished step in the directory, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All finished steps in the directory, ascending."""
        return sorted(self._manager.all_steps())

    def reached_preemption(self, step: int) -> bool:
        """True at the JAX preemption sync point (agreed by all hosts); False when unsupported."""
        try:
            return bool(self._manager.reached_preemption(step))
        except Exception:  # noqa: BLE001 - no preemption service configured
            return False

    def save(
        self, step: int, *, params: Any, opt_state: Any, meta: dict, force: bool = False
    ) -> bool:
        """Start an async save of step; returns whether one started.

        Saves every `save_interval_steps`, at a preemption sync point, or when force is set.
        A step already on disk is never overwritten (returns False). Raises ValueError if a
        float leaf of params or opt_state is NaN/inf, or meta is not JSON; CheckpointSaveError
        if this save, or the background write of the previous one, failed.

        Records a fingerprint of every array leaf in the step's meta (see `summarise`), which
        every restore checks.
        """
        if self._closed:
            raise RuntimeError(f"Checkpointer for {self.directory} is closed")
        if not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step={step!r} is invalid; must be an integer >= 0")
        step = int(step)
        if step in self._manager.all_steps():
            return False
        if not force and not self._manager.should_save(step):
            return False
        if not isinstance(meta, dict):
            raise ValueError(f"meta must be a dict, got {type(meta).__name__} at step {step}")
        if INTEGRITY_KEY in meta:
            raise ValueError(
                f"meta for step {step} uses the reserved key {INTEGRITY_KEY!r}; rename that entry"
            )
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as error:
            raise ValueError(f"meta for step {step} is not JSON-serialisable: {error}") from error
        # Orbax would wait for the previous write anyway; waiting here names its step on failure.
        self._confirm_in_flight()
        summaries = summarise({PARAMS_ITEM: params, OPT_STATE_ITEM: opt_state})
        bad = [s.name for s in summaries if not s.finite]
        if bad:
            raise ValueError(
                f"refusing to save step {step}: non-finite values (NaN or inf) in "
                f"{_first_few(bad)}; {self._what_is_kept(step)}"
            )
        args = ocp.args.Composite(
            **{
                PARAMS_ITEM: ocp.args.StandardSave(params),
                OPT_STATE_ITEM: ocp.args.StandardSave(opt_state),
                META_ITEM: ocp.args.JsonSave({**meta, INTEGRITY_KEY: _integrity_record(summaries)}),
            }
        )
        try:
            # The decision was taken above (including preemption); force avoids asking twice.
            started = bool(self._manager.save(step, args=args, force=True))
        except Exception as error:  # noqa: BLE001 - whatever the storage raised, one clear error
            raise self._save_error(step, error) from error
        if started and self._async:
            self._in_flight = step
        return started

    def check_for_errors(self) -> None:
        """Raise CheckpointSaveError if the background write of a save has failed.

        Never blocks: a write still running is left alone. It reads two flags, so the
        training loop can call it every step and stop at the step where a write failed
        rather than at the next save.
        """
        if self._in_flight is not None and not self._manager.is_saving_in_progress():
            self._confirm_in_flight()

    def _confirm_in_flight(self) -> None:
        """Wait for the save in flight; CheckpointSaveError naming its step if it failed."""
        step, self._in_flight = self._in_flight, None
        try:
            self._manager.wait_until_finished()
        except Exception as error:  # noqa: BLE001 - see save
            if step is None:
                raise
            raise self._save_error(step, error) from error

    def _newest_complete_step(self, excluding: int, where: str = "there") -> tuple[int | None, str]:
        """(the newest complete step but `excluding`, or None; a clause saying so, truthfully).

        Listed again (what is in the directory, not what this process believes); when the
        listing fails, that is said, with the newest step this run knows was complete.
        """
        known = [s for s in self._manager.all_steps() if s != excluding]
        try:
            self._manager.reload()
            steps = [s for s in self._manager.all_steps() if s != excluding]
        except Exception as error:  # noqa: BLE001 - the message must not fail on a broken store
            last = max(known) if known else None
            kept = (
                f"; step {last} was complete {where} when this run last looked"
                if last is not None
                else ""
            )
            # The store's outage is already the cause of the message; name other failures.
            why = "unreachable" if isinstance(error, fs.StorageUnavailableError) else _brief(error)
            listed = f"the checkpoints {where} could not be listed ({why}){kept}"
            return last, listed
        if not steps:
            return None, f"no complete checkpoint exists {where} yet"
        last = max(steps)
        return last, f"step {last} is the newest complete checkpoint {where} and is kept"

    def _what_is_kept(self, step: int) -> str:
        return self._newest_complete_step(step, where=f"in {self.directory}")[1]

    def _save_error(self, step: int, error: BaseException) -> CheckpointSaveError:
        """The one error to raise for step's failed write (call once per failure)."""
        self._failed_step = step
        # A failure can reach Orbax's finaliser by one path (say the step metadata) while
        # another part still holds its own copy (say the commit of an item); left there, it
        # would be raised again by the next call and blamed on another step.
        for _ in range(3):
            try:
                self._manager.check_for_errors()
                break
            except Exception as stale:  # noqa: BLE001 - the same failure, already reported
                logger.debug("further error of the failed save of step %d: %s", step, stale)
        cause = (
            "the disk is full (no space left on device or quota exceeded)"
            if _is_disk_full(error)
            else _brief(error)
        )
        last, kept = self._newest_complete_step(excluding=step)
        return CheckpointSaveError(
            f"could not write checkpoint step {step} to {self.directory}: {cause}; {kept}",
            step=step,
            last_complete_step=last,
        )

    def restore(
        self, *, abstract_params: Any, abstract_opt_state: Any, step: int | None = None
    ) -> Restored | None:
        """Restore onto the shardings of the abstract trees; None if there is no checkpoint.

        With step=None the newest step is tried first; one that is unreadable, or whose values
        fail `verify` (fingerprints recorded at save, NaN/inf), is logged, moved to
        `<directory>/corrupt/` so that the resumed run can save that step again, and the
        previous step is tried. If steps exist and none restores, CheckpointRestoreError.
        """
        self.wait_until_finished()
        self._manager.reload()
        all_steps = list(self._manager.all_steps())
        if not all_steps:
            return None
        candidates = _candidate_steps(all_steps, step, self.directory)

        def restore_one(candidate: int) -> Restored:
            restored = self._manager.restore(
                candidate,
                args=ocp.args.Composite(
                    **{
                        PARAMS_ITEM: ocp.args.StandardRestore(abstract_params),
                        OPT_STATE_ITEM: ocp.args.StandardRestore(abstract_opt_state),
                        META_ITEM: ocp.args.JsonRestore(),
                    }
                ),
            )
            params, opt_state = restored[PARAMS_ITEM], restored[OPT_STATE_ITEM]
            meta = dict(restored[META_ITEM])
            verify(candidate, meta, {PARAMS_ITEM: params, OPT_STATE_ITEM: opt_state})
            return Restored(candidate, params, opt_state, _public_meta(meta))

        _, restored, bad = _restore_with_fallback(self.directory, candidates, restore_one)
        if bad:
            self._quarantine(bad)
        return restored

    def _quarantine(self, steps: list[int]) -> None:
        """Move unreadable step directories aside (primary host), then resync every host."""
        if jax.process_index() == 0:
            target_root = self.directory / CORRUPT_SUBDIR
            fs.makedirs(target_root)
            for bad_step in steps:
                source = self.directory / str(bad_step)
                stamp = int(time.time())
                target = target_root / f"{bad_step}-{stamp}"
                while target.exists():
                    stamp += 1
                    target = target_root / f"{bad_step}-{stamp}"
                fs.move(source, target)  # on GCS object by object, commit file included
                logger.warning(
                    "moved unreadable or damaged checkpoint step %d to %s", bad_step, target
                )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("bertjax_checkpoint_quarantine")
        self._manager.reload()

    def wait_until_finished(self) -> None:
        """Block until the in-flight async save (if any) is on disk; CheckpointSaveError if not."""
        self._confirm_in_flight()

    def close(self) -> None:
        """Wait for pending saves, then release Orbax's background threads. Idempotent.

        Raises CheckpointSaveError if the last save's write failed and was not reported yet.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._confirm_in_flight()
        finally:
            try:
                self._manager.close()
            except Exception as error:  # noqa: BLE001 - see below
                if self._failed_step is None:
                    raise
                # Left over from the failure already raised as CheckpointSaveError.
                logger.debug(
                    "closing after the failed save of step %d: %s", self._failed_step, error
                )


def _single_device_target(metadata_tree: Any) -> Any:
    """ShapeDtypeStructs on the first local device, built from stored array metadata."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def to_struct(leaf):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=device)
        return leaf

    return jax.tree.map(to_struct, metadata_tree)


def _laid_out_target(metadata_tree: Any, abstract: Any) -> Any:
    """ShapeDtypeStructs of the stored arrays, sharded as `abstract`'s at the same paths and
    replicated on its mesh elsewhere."""
    laid_out = {
        jax.tree_util.keystr(path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
    }
    mesh = next(iter(laid_out.values())).sharding.mesh
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def to_struct(path, leaf):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            return leaf
        known = laid_out.get(jax.tree_util.keystr(path))
        sharding = known.sharding if known is not None else replicated
        return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding)

    return jax.tree_util.tree_map_with_path(to_struct, metadata_tree)


# How many times a reader lists the steps again when those it tried vanished under it.
_READ_ATTEMPTS = 5


def _read_newest(
    path: epath.Path, manager: ocp.CheckpointManager, step: int | None, restore_one
) -> tuple[int, Any]:
    """(step, result) of a reader: newest first, as `_restore_with_fallback`; when a live run
    deleted the steps it tried and saved newer ones meanwhile, tries those (step=None only)."""
    tried: set[int] = set()
    for _ in range(_READ_ATTEMPTS):
        candidates = [
            s for s in _candidate_steps(list(manager.all_steps()), step, path) if s not in tried
        ]
        try:
            good, result, _ = _restore_with_fallback(path, candidates, restore_one, reader=True)
            return good, result
        except CheckpointRestoreError:
            tried.update(candidates)
            manager.reload()
            newer = set(manager.all_steps()) - tried
            if step is not None or not newer:
                raise
            logger.info(
                "steps %s of %s were removed while being read; trying %s",
                sorted(candidates),
                path,
                sorted(newer),
            )
    raise CheckpointRestoreError(
        f"the steps in {path} kept changing while being read ({_READ_ATTEMPTS} attempts, steps "
        f"{sorted(tried)}); read it again, or once the run writing there has stopped"
    )


def _open_for_reading(directory: str | os.PathLike) -> tuple[epath.Path, ocp.CheckpointManager]:
    path = _as_path(directory)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    manager = _read_only_manager(path)
    if not manager.all_steps():
        manager.close()
        raise FileNotFoundError(f"no finished checkpoint step in {path}")
    return path, manager


def restore_params(
    directory: str | os.PathLike,
    *,
    step: int | None = None,
    abstract_params: Any = None,
    layout_only: bool = False,
) -> tuple[int, Any, dict]:
    """(step, params, meta) reading only the params and meta items, never the optimizer state.

    abstract_params=None places every array on one local device, whatever mesh it was saved
    from. With `layout_only`, abstract_params only lays out the arrays it has: the stored tree
    says what is read, and an array abstract_params lacks (a network trained beside the
    model, e.g. ELECTRA's generator) is replicated on its mesh. The values are checked as in
    Checkpointer.restore (`verify`). With step=None, an unreadable or damaged newest step is
    named and the previous one used; nothing is moved, since readers (notebooks, init_from)
    may share the directory with a live run.
    """
    path, manager = _open_for_reading(directory)
    try:

        def restore_one(candidate: int):
            target = abstract_params
            if target is None or layout_only:
                stored = ocp.StandardCheckpointHandler().metadata(
                    path / str(candidate) / PARAMS_ITEM
                )
                if target is None:
                    target = _single_device_target(stored.tree)
                else:
                    target = _laid_out_target(stored.tree, target)
            restored = manager.restore(
                candidate,
                args=ocp.args.Composite(
                    **{
                        PARAMS_ITEM: ocp.args.StandardRestore(target),
                        META_ITEM: ocp.args.JsonRestore(),
                    }
                ),
            )
            params, meta = restored[PARAMS_ITEM], dict(restored[META_ITEM])
            verify(candidate, meta, {PARAMS_ITEM: params})
            return params, _public_meta(meta)

        good, (params, meta) = _read_newest(path, manager, step, restore_one)
        return good, params, meta
    finally:
        manager.close()


def read_meta(directory: str | os.PathLike, step: int | None = None) -> dict:
    """The JSON meta dict of a step (default: the newest readable one)."""
    path, manager = _open_for_reading(directory)
    try:

        def restore_one(candidate: int) -> dict:
            restored = manager.restore(
                candidate, args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})
            )
            if restored[META_ITEM] is None:
                raise FileNotFoundError(f"step {candidate} has no {META_ITEM} item")
            return _public_meta(restored[META_ITEM])

        return _read_newest(path, manager, step, restore_one)[1]
    finally:
        manager.close()
