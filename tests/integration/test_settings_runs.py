"""The integration tests of test_settings.py (tests/unit/), with its helpers."""

import pytest
from test_settings import (  # noqa: F401 (fixtures are used by name)
    _train_cli,
)


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
