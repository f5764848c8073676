"""The integration tests of test_metrics_writer.py (tests/unit/), with its helpers."""

import pytest

from tests.helpers.xla_env import REPO, run_script


@pytest.mark.slow
def test_train_py_starts_without_importing_torch_or_tensorboardx():
    """torch (through tensorboardX) took 2 of the 4 s train.py spent importing."""
    script = "import sys, train; print(sorted({'torch', 'tensorboardX'} & set(sys.modules)))"
    out = run_script(script, cwd=REPO, timeout=None, check=True)
    assert out.stdout.strip() == "[]", out.stderr
