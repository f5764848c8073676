"""The suite's xdist scheduler (tests/helpers/xdist_schedule.py) finishes a run in which a
worker dies: the crashed test is reported failed once, every other test runs once, and the
run ends instead of hanging, as pytest-xdist 3.8's own file scheduling does. The crashed
test's report says how the worker died and where."""

import subprocess
import sys
import textwrap

import pytest

from tests.helpers.xla_env import REPO

# The hooks of tests/conftest.py that handle a worker's crash, as it has them.
CONFTEST = """
import pytest

from tests.helpers.xdist_schedule import CrashTolerantFileScheduling, WorkerLastWords


def pytest_xdist_make_scheduler(config, log):
    return CrashTolerantFileScheduling(config, log)


LAST_WORDS = WorkerLastWords()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    LAST_WORDS.configure(config)


def pytest_unconfigure(config):
    LAST_WORDS.unconfigure()


def pytest_configure_node(node):
    LAST_WORDS.configure_node(node)


def pytest_handlecrashitem(crashitem, report, sched):
    LAST_WORDS.handle_crash(report)


@pytest.fixture(autouse=True)
def last_note(request):
    yield
    LAST_WORDS.note(f"after {request.node.nodeid}")
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


def _run(directory, workers: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "-n", str(workers), "--dist", "loadfile"]
    command += ["-p", "no:cacheprovider", "-rA", "-q"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=180
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_crash_fails_its_test_and_the_run_finishes(tmp_path, workers):
    _write_tests(tmp_path)
    result = _run(tmp_path, workers)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 failed, 6 passed" in output, output
    assert output.count("FAILED test_crash.py::test_dies") == 1, output
    for name in ("test_crash.py::test_after", "test_last.py::test_alone"):
        assert output.count(f"PASSED {name}") == 1, output


@pytest.mark.slow
def test_a_crashed_tests_report_says_how_its_worker_died_and_where(tmp_path):
    _write_tests(tmp_path)
    (tmp_path / "test_crash.py").write_text(
        textwrap.dedent(
            """
            import os

            def _in_native_code():
                os.abort()

            def test_before():
                pass

            def test_dies():
                _in_native_code()
            """
        )
    )
    result = _run(tmp_path, workers=1)
    output = result.stdout + result.stderr
    assert "1 failed, 5 passed" in output, output
    report = output[output.index("crashed while running 'test_crash.py::test_dies'") :]
    report = report[: report.index("short test summary info")]
    assert "Fatal Python error: Aborted" in report, output
    assert 'test_crash.py", line 5 in _in_native_code' in report, output
    assert 'test_crash.py", line 11 in test_dies' in report, output
    assert "Its last note: after test_crash.py::test_before" in report, output
