"""The integration tests of test_settings.py (tests/unit/), with its helpers."""

import time

import pytest

from tests.helpers.settings import _train_cli
from tests.helpers.xla_env import run_script


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--config.foo=1", "error: config.foo is not a field of"),
        (
            "--config.optimizer.learnig_rate=0.1",
            "did you mean config.optimizer.learning_rate?",
        ),
        ("--config.num_train_steps=0", "error: config.num_train_steps=0: must be a positive"),
    ],
)
def test_the_command_line_reports_a_bad_config_in_one_line(tmp_path, flag, expected):
    completed = _train_cli(flag, cwd=tmp_path)
    assert completed.returncode != 0
    assert expected in completed.stderr
    assert "Traceback" not in completed.stderr, completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_failed_command_ends_although_a_library_thread_still_runs(tmp_path):
    """What train.py and finetune.py do with a failure: one line, status 1, and the process
    ends within the grace period although a non-daemon thread is still busy, as Orbax's
    commit thread is when it keeps retrying through a storage outage (Python's own exit
    would wait for it: here ten minutes). What was printed before is not lost."""
    script = (
        "import threading, time\n"
        "from bertjax import cli\n"
        "cli.FAILURE_GRACE_SECONDS = 0.5\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=False).start()\n"
        "print('written before the failure')\n"
        "cli._end_after_failure('error: the storage did not answer')\n"
    )
    started = time.monotonic()
    completed = run_script(script, cwd=tmp_path, timeout=120)
    assert time.monotonic() - started < 60
    assert completed.returncode == 1
    assert completed.stdout == "written before the failure\n"
    assert completed.stderr.strip().splitlines() == ["error: the storage did not answer"]
