"""The suite's xdist scheduler (tests/helpers/xdist_schedule.py) finishes a run in which a
worker dies: the crashed test is reported failed once, every other test runs once, and the
run ends instead of hanging, as pytest-xdist 3.8's own file scheduling does."""

import subprocess
import sys
import textwrap

import pytest

from tests.helpers.xla_env import REPO

CONFTEST = """
def pytest_xdist_make_scheduler(config, log):
    from tests.helpers.xdist_schedule import CrashTolerantFileScheduling

    return CrashTolerantFileScheduling(config, log)
"""


def _write_tests(directory):
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "conftest.py").write_text(CONFTEST)
    passing = "".join(f"def test_{n}():\n    pass\n\n" for n in range(3))
    (directory / "test_first.py").write_text(passing)
    (directory / "test_crash.py").write_text(
        textwrap.dedent(
            """
            import os

            def test_before():
                pass

            def test_dies():
                os._exit(3)

            def test_after():
                pass
            """
        )
    )
    # A file with one test left for a worker given it last (xdist waits for a second).
    (directory / "test_last.py").write_text("def test_alone():\n    pass\n")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_crash_fails_its_test_and_the_run_finishes(tmp_path, workers):
    _write_tests(tmp_path)
    command = [sys.executable, "-m", "pytest", "-n", str(workers), "--dist", "loadfile"]
    command += ["-p", "no:cacheprovider", "-rA", "-q"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 failed, 6 passed" in output, output
    assert output.count("FAILED test_crash.py::test_dies") == 1, output
    for name in ("test_crash.py::test_after", "test_last.py::test_alone"):
        assert output.count(f"PASSED {name}") == 1, output
