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
                                        state, rng key data, BertConfig dict, tokenizer
                                        fingerprint, ...)
      2000.orbax-checkpoint-tmp-<t>/  a save in progress or killed mid-write: never restored,
                                        removed when the next Checkpointer opens the directory
      corrupt/2000-<unix time>/       a step that failed to restore, moved aside by
                                        Checkpointer.restore so the resumed run can save it again

Parameters, optimizer state and meta are separate Orbax items so that a notebook reads the
parameters alone (restore_params), never touching the usually larger optimizer state.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

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


def _as_path(directory: str | os.PathLike) -> epath.Path:
    """Absolute local paths (Orbax requires them); URLs such as gs:// are kept as given."""
    text = os.fspath(directory)
    if "://" not in text:
        text = os.path.abspath(text)
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
    return ocp.CheckpointManager(
        path,
        item_names=ITEM_NAMES,
        item_handlers=_item_handlers(),
        options=ocp.CheckpointManagerOptions(
            read_only=True, create=False, enable_async_checkpointing=False
        ),
    )


@jax.jit
def _finite_flags(leaves: list[jax.Array]) -> jax.Array:
    # One fused pass over the float leaves; a bool per leaf so a failure names the culprit.
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])  # [num_float_leaves]


def check_finite(step: int, params: Any) -> None:
    """Raise ValueError naming the step and the first leaves holding a NaN or infinity.

    Cost: one jitted reduction that reads every floating-point parameter once (memory bound)
    and brings one bool per leaf to the host; compiled once per parameter structure. Paid only
    when a save actually starts. Measured for BERT-base (219 leaves, 109M float32 params) on a
    2-core CPU: 1.3-2.1 s first call (compile), 0.12-0.23 s after. On an accelerator it should
    be about the time to read those 436 MB from HBM (under a millisecond; estimated, not measured).
    """
    paths_and_leaves = jax.tree_util.tree_leaves_with_path(params)
    floats = [
        (path, leaf)
        for path, leaf in paths_and_leaves
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)
    ]
    if not floats:
        return
    flags = _finite_flags([leaf for _, leaf in floats])
    if not (flags.is_fully_replicated or flags.is_fully_addressable):  # multi-process
        flags = multihost_utils.process_allgather(flags, tiled=True)
    flags = np.asarray(flags)
    if flags.all():
        return
    bad = [jax.tree_util.keystr(path) for (path, _), ok in zip(floats, flags) if not ok]
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    raise ValueError(
        f"refusing to save step {step}: non-finite values (NaN or inf) in params {shown}; "
        "the last good checkpoint is kept"
    )


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
    path: epath.Path, steps: list[int], restore_one
) -> tuple[int, Any, list[int]]:
    """Try restore_one(step) newest first; returns (step, result, steps that failed).

    A failing step is logged with its error; when every step fails, raises
    CheckpointRestoreError listing each step's error (never returns "nothing").
    """
    failures: list[tuple[int, BaseException]] = []
    for candidate in steps:
        try:
            result = restore_one(candidate)
        except Exception as error:  # noqa: BLE001 - any failure of one step means "try older"
            failures.append((candidate, error))
            logger.warning(
                "checkpoint step %d in %s cannot be restored (%s); trying the previous step",
                candidate,
                path,
                _brief(error),
            )
            continue
        if failures:
            logger.warning(
                "restored checkpoint step %d from %s after skipping unreadable step(s) %s",
                candidate,
                path,
                [s for s, _ in failures],
            )
        return candidate, result, [s for s, _ in failures]
    details = "; ".join(f"step {s}: {_brief(e)}" for s, e in failures)
    raise CheckpointRestoreError(
        f"checkpoints exist in {path} (steps {sorted(steps)}) but none could be restored; "
        f"refusing to start from scratch. Errors: {details}"
    ) from failures[0][1]


class Checkpointer:
    """Saves and restores params, optimizer state and a JSON meta dict with Orbax.

    Saves are asynchronous: `save` returns once the arrays are copied off the devices
    (so the caller may donate or overwrite them) and the write finishes in the background.
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
        self._manager = ocp.CheckpointManager(
            self.directory, item_names=ITEM_NAMES, item_handlers=_item_handlers(), options=options
        )
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
        float leaf of params is NaN/inf (see check_finite for the cost) or meta is not JSON.
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
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as error:
            raise ValueError(f"meta for step {step} is not JSON-serialisable: {error}") from error
        check_finite(step, params)
        args = ocp.args.Composite(
            **{
                PARAMS_ITEM: ocp.args.StandardSave(params),
                OPT_STATE_ITEM: ocp.args.StandardSave(opt_state),
                META_ITEM: ocp.args.JsonSave(meta),
            }
        )
        # The decision was taken above (including preemption); force avoids asking twice.
        return bool(self._manager.save(step, args=args, force=True))

    def restore(
        self, *, abstract_params: Any, abstract_opt_state: Any, step: int | None = None
    ) -> Restored | None:
        """Restore onto the shardings of the abstract trees; None if there is no checkpoint.

        With step=None the newest step is tried first; an unreadable one is logged, moved to
        `<directory>/corrupt/` so that the resumed run can save that step again, and the
        previous step is tried. If steps exist and none restores, CheckpointRestoreError.
        """
        self.wait_until_finished()
        self._manager.reload()
        all_steps = list(self._manager.all_steps())
        if not all_steps:
            return None
        candidates = _candidate_steps(all_steps, step, self.directory)

        def restore_one(candidate: int):
            return self._manager.restore(
                candidate,
                args=ocp.args.Composite(
                    **{
                        PARAMS_ITEM: ocp.args.StandardRestore(abstract_params),
                        OPT_STATE_ITEM: ocp.args.StandardRestore(abstract_opt_state),
                        META_ITEM: ocp.args.JsonRestore(),
                    }
                ),
            )

        good, restored, bad = _restore_with_fallback(self.directory, candidates, restore_one)
        if bad:
            self._quarantine(bad)
        return Restored(
            good, restored[PARAMS_ITEM], restored[OPT_STATE_ITEM], dict(restored[META_ITEM])
        )

    def _quarantine(self, steps: list[int]) -> None:
        """Move unreadable step directories aside (primary host), then resync every host."""
        if jax.process_index() == 0:
            target_root = self.directory / CORRUPT_SUBDIR
            target_root.mkdir(parents=True, exist_ok=True)
            for bad_step in steps:
                source = self.directory / str(bad_step)
                stamp = int(time.time())
                target = target_root / f"{bad_step}-{stamp}"
                while target.exists():
                    stamp += 1
                    target = target_root / f"{bad_step}-{stamp}"
                source.rename(target)
                logger.warning("moved unreadable checkpoint step %d to %s", bad_step, target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("bertjax_checkpoint_quarantine")
        self._manager.reload()

    def wait_until_finished(self) -> None:
        """Block until the in-flight async save (if any) is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves, then release Orbax's background threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._manager.close()


def _single_device_target(metadata_tree: Any) -> Any:
    """ShapeDtypeStructs on the first local device, built from stored array metadata."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def to_struct(leaf):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=device)
        return leaf

    return jax.tree.map(to_struct, metadata_tree)


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
    directory: str | os.PathLike, *, step: int | None = None, abstract_params: Any = None
) -> tuple[int, Any, dict]:
    """(step, params, meta) reading only the params and meta items, never the optimizer state.

    abstract_params=None places every array on one local device, whatever mesh it was saved
    from. With step=None, an unreadable newest step falls back to the previous one.
    """
    path, manager = _open_for_reading(directory)
    try:
        candidates = _candidate_steps(list(manager.all_steps()), step, path)

        def restore_one(candidate: int):
            target = abstract_params
            if target is None:
                stored = ocp.StandardCheckpointHandler().metadata(
                    path / str(candidate) / PARAMS_ITEM
                )
                target = _single_device_target(stored.tree)
            restored = manager.restore(
                candidate,
                args=ocp.args.Composite(
                    **{
                        PARAMS_ITEM: ocp.args.StandardRestore(target),
                        META_ITEM: ocp.args.JsonRestore(),
                    }
                ),
            )
            return restored[PARAMS_ITEM], dict(restored[META_ITEM])

        good, (params, meta), _ = _restore_with_fallback(path, candidates, restore_one)
        return good, params, meta
    finally:
        manager.close()


def read_meta(directory: str | os.PathLike, step: int | None = None) -> dict:
    """The JSON meta dict of a step (default: the newest readable one)."""
    path, manager = _open_for_reading(directory)
    try:
        candidates = _candidate_steps(list(manager.all_steps()), step, path)

        def restore_one(candidate: int) -> dict:
            restored = manager.restore(
                candidate, args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})
            )
            if restored[META_ITEM] is None:
                raise FileNotFoundError(f"step {candidate} has no {META_ITEM} item")
            return dict(restored[META_ITEM])

        return _restore_with_fallback(path, candidates, restore_one)[1]
    finally:
        manager.close()
