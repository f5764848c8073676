"""Shared by the tests of settings in every tier (moved from test_settings.py)."""

import pathlib
import subprocess
import sys

from tests.helpers.xla_env import subprocess_env

REPO = pathlib.Path(__file__).resolve().parents[2]


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
