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

Integrity (bertjax.engine.integrity): every save records an exact fingerprint of each array
leaf and every restore checks it, and the values for NaN/inf; a step that fails is treated
like an unreadable one: named, skipped and, when resuming, moved to corrupt/.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint._src.serialization import tensorstore_utils as _orbax_tensorstore

from bertjax.engine import integrity, orbax_logs
from bertjax.storage import fs

logger = logging.getLogger(__name__)

PARAMS_ITEM = "params"
OPT_STATE_ITEM = "opt_state"
META_ITEM = "meta"
ITEM_NAMES = (PARAMS_ITEM, OPT_STATE_ITEM, META_ITEM)
# Steps that failed to restore are moved here; not an integer name, so Orbax never lists it.
CORRUPT_SUBDIR = "corrupt"


class Restored(NamedTuple):
    """A restored checkpoint: its step, parameters, optimizer state and meta dict."""

    step: int
    params: Any
    opt_state: Any
    meta: dict


class CheckpointRestoreError(RuntimeError):
    """Checkpoints exist but none of the requested steps could be restored."""


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


def _read_only_manager(path: epath.Path) -> ocp.CheckpointManager:
    orbax_logs.quiet_read_only_notice()
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
    orbax_logs.contain_orbax_noise()
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
        orbax_logs.contain_orbax_noise()
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

        Records a fingerprint of every array leaf in the step's meta (integrity.summarise), which
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
        if integrity.INTEGRITY_KEY in meta:
            raise ValueError(
                f"meta for step {step} uses the reserved key {integrity.INTEGRITY_KEY!r}; rename "
                "that entry"
            )
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as error:
            raise ValueError(f"meta for step {step} is not JSON-serialisable: {error}") from error
        # Orbax would wait for the previous write anyway; waiting here names its step on failure.
        self._confirm_in_flight()
        summaries = integrity.summarise({PARAMS_ITEM: params, OPT_STATE_ITEM: opt_state})
        bad = [s.name for s in summaries if not s.finite]
        if bad:
            raise ValueError(
                f"refusing to save step {step}: non-finite values (NaN or inf) in "
                f"{integrity.first_few(bad)}; {self._what_is_kept(step)}"
            )
        args = ocp.args.Composite(
            **{
                PARAMS_ITEM: ocp.args.StandardSave(params),
                OPT_STATE_ITEM: ocp.args.StandardSave(opt_state),
                META_ITEM: ocp.args.JsonSave(
                    {**meta, integrity.INTEGRITY_KEY: integrity.record(summaries)}
                ),
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
        fail integrity.verify (fingerprints recorded at save, NaN/inf), is logged, moved to
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
            integrity.verify(candidate, meta, {PARAMS_ITEM: params, OPT_STATE_ITEM: opt_state})
            return Restored(candidate, params, opt_state, integrity.public_meta(meta))

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
    Checkpointer.restore (integrity.verify). With step=None, an unreadable or damaged newest step is
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
            integrity.verify(candidate, meta, {PARAMS_ITEM: params})
            return params, integrity.public_meta(meta)

        good, (params, meta) = _read_newest(path, manager, step, restore_one)
        return good, params, meta
    finally:
        manager.close()


def newest_step(directory: str | os.PathLike) -> int | None:
    """The newest finished step in `directory` (None: no such directory or step), from the
    directory's listing alone: nothing is read, so a damaged step counts too."""
    path = _as_path(directory)
    if not path.exists():
        return None
    manager = _read_only_manager(path)
    try:
        return max(manager.all_steps(), default=None)
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
            return integrity.public_meta(restored[META_ITEM])

        return _read_newest(path, manager, step, restore_one)[1]
    finally:
        manager.close()
