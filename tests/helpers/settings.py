"""train.py run in a process, as a user runs it."""

import subprocess
import sys

from tests.helpers.xla_env import REPO, subprocess_env


def _train_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = subprocess_env(1)
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--workdir", str(cwd / "run"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
