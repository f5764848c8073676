"""The XLA settings the test suite's jax processes run with: this one (conftest.py) and the
ones the tests start (train.py, finetune.py, notebook scripts), so that all compile alike. Two
tests keep their own XLA flags: the demo recipe's plateau test runs `python train.py` as a user
does, and the CPU-hog test keeps the flags its fault was reproduced with.

The tests' models are tiny, so XLA's time goes into compiling, not running: LLVM's
optimisation passes at level 0 nearly halve the CPU time of test_model.py (208 s -> 112 s),
and emitting fusions with XLA's classic emitters instead of its newer MLIR ones cuts the
file's wall time by another third (59 s -> 39 s; test_trainer.py's fast tests 48 s -> 33 s).
XLA's own HLO passes, which decide fusion, still run, and the pinned runs in test_trainer.py
pass unchanged; only the last bits of a float may round differently than by default.
"""

from __future__ import annotations

import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def xla_flags(device_count: int) -> str:
    """XLA_FLAGS for `device_count` simulated CPU devices, compiled as the suite compiles."""
    return " ".join((f"--xla_force_host_platform_device_count={device_count}", *COMPILE_FLAGS))


def subprocess_env(device_count: int = 2) -> dict[str, str]:
    """The environment of a jax process a test starts: this one's (the GCS emulator's
    variables and the session's compilation cache included), on `device_count` CPU devices,
    with the repository importable."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(device_count)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env
