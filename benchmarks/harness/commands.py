"""The project's commands (train.py, finetune.py, a benchmark's own torch script) run as a user
runs them, in a process of their own, timed from start to exit."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence

from benchmarks.harness import timing

REPO = pathlib.Path(__file__).resolve().parents[2]

# finetune.py's summary line (bertjax.finetune.summary.print_summary).
FINETUNE_SUMMARY = re.compile(
    r"wall time: ([\d.]+) s, of which compiling ([\d.]+) s \(\d+ %, (\d+) programs compiled, "
    r"(\d+) loaded"
)


def script(name: str, *args: str) -> list[str]:
    """`python <repository>/<name> args...`: one of the commands (train.py, finetune.py)."""
    return [sys.executable, str(REPO / name), *args]


def module(name: str, *args: str) -> list[str]:
    """`python -m <name> args...`, run from the repository's root (a benchmark's own part)."""
    return [sys.executable, "-m", name, *args]


def without_compilation_cache(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without JAX_COMPILATION_CACHE*: the command's own --compilation_cache
    decides."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if not k.startswith("JAX_COMPILATION_CACHE")}


def run(command: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[float, str]:
    """(seconds from start to exit, stdout and stderr) of a command that must succeed, run
    from the repository's root."""
    elapsed = timing.stopwatch()
    done = subprocess.run(
        list(command), capture_output=True, text=True, env=env, cwd=REPO, check=False
    )
    seconds = elapsed()
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout + done.stderr


@dataclasses.dataclass(frozen=True)
class FinetuneSummary:
    """What finetune.py's summary line says about its run."""

    wall_s: float
    compile_s: float
    compiled: int
    loaded: int


def finetune_summary(output: str) -> FinetuneSummary | None:
    """The summary line of finetune.py's output (None when it printed none)."""
    found = FINETUNE_SUMMARY.search(output)
    if not found:
        return None
    return FinetuneSummary(float(found[1]), float(found[2]), int(found[3]), int(found[4]))


def last_metric(output: str, name: str) -> float | None:
    """The last value a run logged for `name` (e.g. "eval/f1")."""
    values = re.findall(rf"{re.escape(name)} ([\d.]+)", output)
    return float(values[-1]) if values else None
