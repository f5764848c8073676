"""Orbax's logging, kept to what a user needs: a failed save or restore is raised once, as one
error naming its step (bertjax.engine.checkpoint), so the copies Orbax logs or reports on the
way are moved to DEBUG, and a reader's read-only manager is not warned about.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)

_ORBAX_DIR = os.path.dirname(os.path.abspath(ocp.__file__))


class _ReadOnlyNotice(logging.Filter):
    """Drops Orbax's "Given directory is read only" warning: every reader opens a read-only
    manager on purpose (it never writes beside a live run), so there is nothing to warn of."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.pathname.startswith(_ORBAX_DIR)
            and str(record.msg).startswith("Given directory is read only")
        )


def quiet_read_only_notice() -> None:
    """Installs _ReadOnlyNotice on absl's logger (idempotent, process-wide)."""
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _ReadOnlyNotice) for f in absl_logger.filters):
        absl_logger.addFilter(_ReadOnlyNotice())


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


def contain_orbax_noise() -> None:
    """Installs the log filter and unraisable hook above (idempotent, process-wide)."""
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _OrbaxTracebacks) for f in absl_logger.filters):
        absl_logger.addFilter(_OrbaxTracebacks())
    # Installed for good: the late reports arrive whenever TensorStore finishes.
    if not isinstance(sys.unraisablehook, _QuietAbandonedWork):
        sys.unraisablehook = _QuietAbandonedWork(sys.unraisablehook)
