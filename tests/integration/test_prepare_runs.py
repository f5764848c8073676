"""The integration tests of test_prepare.py (tests/unit/), with its helpers."""

import subprocess
import sys

import pytest

from tests.helpers.prepare import write_corpus
from tests.helpers.xla_env import REPO


@pytest.mark.slow
def test_command_line_runs_without_warnings_and_fails_in_one_line(tmp_path):
    corpus = write_corpus(tmp_path / "small.txt", num_documents=12)
    command = [sys.executable, "-X", "warnings=default", "-m", "bertjax.data.prepare"]
    args = ["--input", str(corpus), "--output", str(tmp_path / "out"), "--workers", "1"]
    result = subprocess.run(
        command + args + ["--vocab_size", "8000"], capture_output=True, text=True, cwd=REPO
    )
    # runpy used to warn that bertjax.data had imported the module it was about to run.
    assert "Warning" not in result.stdout + result.stderr, result.stderr
    assert result.returncode == 1
    assert result.stderr.startswith("error: vocab_size=8000 is too large for the corpus")
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
