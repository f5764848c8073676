"""The work directory: its lock keeps a second run out, and what bertjax.load expects."""

import json
import os
import socket

import pytest

import bertjax
from bertjax.engine import rundir as workdir
from bertjax.pretrain import loop as trainer
from bertjax.pretrain.settings import PretrainSettings
from configs import tiny

# No process has this id: Linux's ids stop at 2**22 (PID_MAX_LIMIT), other systems' below.
# A killed run's lock names such a process.
DEAD_PID = 2**22 + 1


def test_a_second_run_is_refused_naming_the_holder_and_touches_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A live run's save in progress: Orbax would clean this up on start.
    in_progress = run_dir / workdir.CHECKPOINT_DIR / "200.orbax-checkpoint-tmp-123"
    in_progress.mkdir(parents=True)
    with workdir.WorkdirLock(run_dir):  # held by this (live) process
        settings = PretrainSettings.from_config(tiny.get_config())
        with pytest.raises(workdir.WorkdirLockedError, match=rf"process {os.getpid()} on "):
            trainer.train_and_evaluate(settings, str(run_dir))
        assert in_progress.is_dir()
        assert not (run_dir / workdir.DATA_DIR).exists()
        holder = json.loads((run_dir / workdir.LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()
    assert not (run_dir / workdir.LOCK_FILE).exists()  # released on exit


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
    lock_file = tmp_path / workdir.LOCK_FILE
    lock_file.write_text(json.dumps({"host": socket.gethostname(), "pid": DEAD_PID, "since": 0}))
    with workdir.WorkdirLock(tmp_path):
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()


def test_another_hosts_lock_is_respected(tmp_path):
    (tmp_path / workdir.LOCK_FILE).write_text(
        json.dumps({"host": "some-other-host", "pid": DEAD_PID, "since": 0})
    )
    with pytest.raises(workdir.WorkdirLockedError, match="some-other-host"):
        workdir.WorkdirLock(tmp_path).acquire()


def test_load_says_what_a_work_directory_should_hold(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoints/"):
        bertjax.load(tmp_path)
