"""The integration tests of test_faults.py (tests/parity/), with its helpers."""

import os
import subprocess
import sys

import pytest

from bertjax.engine import rundir
from bertjax.inference import Model
from tests.helpers.xla_env import REPO, subprocess_env


@pytest.mark.slow
def test_checkpoints_on_eight_devices_while_a_cpu_hog_competes(synthetic_data, tmp_path):
    """train.py on 8 simulated devices saving at steps 2 and 4, with busy processes on
    every core: each save fingerprints the state; before each leaf's fingerprint was fetched before
    the next was dispatched, this run aborted at the first save in XLA's all-reduce
    rendezvous (checked again with 4 steps: with the fault put back it aborts, status -6)."""
    workdir = tmp_path / "run"
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "--config",
        str(REPO / "configs" / "tiny.py"),
        "--config.mesh_shape=(1,-1,1)",
        f"--config.data.dir={synthetic_data}",
        "--config.data.max_seq_length=64",
        "--config.data.max_predictions_per_seq=10",
        "--config.batch_size=8",
        "--config.num_train_steps=4",
        "--config.checkpoint_every_steps=2",
        "--config.eval_every_steps=1000",
        "--config.log_every_steps=2",
        "--config.optimizer.warmup_steps=2",
        "--workdir",
        str(workdir),
    ]
    # The suite's compile settings: with the fault put back (every leaf's fingerprint
    # dispatched at once), this run still aborts at its first save.
    env = subprocess_env(8)
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 2) + 1)
    ]
    try:
        run = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=900, cwd=REPO
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "rendezvous" not in output
    steps = sorted(
        int(p.name) for p in (workdir / rundir.CHECKPOINT_DIR).iterdir() if p.name.isdigit()
    )
    assert steps == [2, 4], steps
    model = Model.load(workdir)
    assert model.source.endswith("step 4")
