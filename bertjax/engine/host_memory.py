"""Host memory for XLA's CPU runtime: a step reuses the memory the step before it freed.

On CPU each execution of a program allocates its buffers with malloc and frees them when it
ends. A training step's buffers hold every layer's activations for the backward pass, often
hundreds of megabytes in one block, and glibc serves a block that large from fresh pages
(mmap) and hands them back to the kernel when it is freed (munmap): the next step's block
is fresh pages again, which the kernel must map and zero one by one as the step first
writes them: a large share of a CPU fine-tuning command's time goes to that kernel work
(docs/benchmarks.md, "The memory between a CPU step and the next").

`keep_freed_memory()` has such blocks kept: the CPU runs each single-device program on the
thread that called it (jax_cpu_enable_async_dispatch off), whose memory comes from glibc's
main heap (a worker thread's own arena holds at most 64 MB and would map the block afresh),
and glibc serves large blocks from that heap instead of mmap and never trims it. A step then
writes into pages the previous step already mapped. The process keeps its peak memory
resident. XLA's compiler threads keep their own arenas: sharing one arena among all threads
(MALLOC_ARENA_MAX=1) kept the pages too but made compiling slower.

It must run before jax creates its CPU client (before anything touches a jax device): the
commands call it first thing. It changes only where memory comes from and which thread
runs a program, never a result.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
import sys

import jax

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

# Setting this to 0 leaves glibc's defaults.
SWITCH_VARIABLE = "BERTJAX_KEEP_FREED_MEMORY"
# A user who tunes glibc's malloc through the environment keeps their own settings.
GLIBC_VARIABLES = (
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)


def accelerator_installed(environ=None) -> bool:
    """Whether jax will run on something other than the CPU: JAX_PLATFORMS names another
    platform, or (unset) an accelerator plugin is installed (libtpu, or any module jax
    discovers as a plugin: jax_plugins, its namespace package or entry points)."""
    environ = os.environ if environ is None else environ
    platforms = [p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms:
        return any(p != "cpu" for p in platforms)
    if importlib.util.find_spec("libtpu") is not None:
        return True
    if importlib.metadata.entry_points(group="jax_plugins"):
        return True
    namespace = importlib.util.find_spec("jax_plugins")
    paths = namespace.submodule_search_locations if namespace is not None else None
    return bool(paths) and any(True for _ in pkgutil.iter_modules(list(paths)))


def glibc() -> bool:
    """Whether this process's malloc is Linux's glibc, the one this module tunes."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def keep_freed_memory(environ=None) -> bool:
    """Has the memory XLA's CPU steps free kept for the next step (the module's docstring);
    True when it was. Does nothing (False) off Linux's glibc, where jax runs on
    an accelerator, where the user tunes malloc through the environment, or where
    BERTJAX_KEEP_FREED_MEMORY=0."""
    environ = os.environ if environ is None else environ
    if environ.get(SWITCH_VARIABLE, "1") == "0":
        return False
    if any(name in environ for name in GLIBC_VARIABLES):
        return False
    if not glibc():
        return False
    if accelerator_installed(environ):
        return False
    # Read when jax creates its CPU client: a program then runs on the calling thread.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    libc = ctypes.CDLL(None)
    return all(
        libc.mallopt(parameter, value) == 1  # mallopt returns 1 on success
        for parameter, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))  # -1: never trim
    )
