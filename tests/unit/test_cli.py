"""What every command (train.py, finetune.py, evaluate.py) sets up before its job (cli.py)."""

import gc

from bertjax import cli
from bertjax.engine import host_memory


def test_a_command_collects_young_garbage_less_often(monkeypatch):
    thresholds = gc.get_threshold()
    seen = []
    # What run() sets before it hands over to absl's app.run, which would parse this
    # process's argv and run the job; host memory is left as the test process has it.
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(cli.app, "run", lambda main, flags_parser: seen.append(gc.get_threshold()))
    gc.set_threshold(700, 10, 10)  # Python's defaults
    try:
        cli.run(lambda config, workdir: None, "configs/tiny.py", ())
    finally:
        gc.set_threshold(*thresholds)
    assert seen == [(cli.GC_YOUNG_THRESHOLD, 10, 10)]
