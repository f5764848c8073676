"""TensorBoard event files against the reference: the bytes tensorboardX writes (its import
loads torch where installed, which is why this sits with the parity tests)."""

import time

from tensorboardX import SummaryWriter

from bertjax.engine import metrics_writer
from tests.helpers.metrics_writer import records

# Steps from 0 (a proto3 zero, left out) to past one varint byte, and negative; values 0.0 (a
# oneof member, written anyway), negative, subnormal, beyond float32's range, infinite, NaN.
SCALARS = [
    (0, "train/loss", 5.4),
    (1, "train/nonfinite", 0.0),
    (300, "eval/mlm_accuracy", 0.2147),
    (2**40, "perf/tokens_per_sec", -1e30),
    (-3, "a", 1e-40),
    (8, "train/grad_norm", 1e39),
    (9, "train/loss", -1e39),
    (10, "train/loss", float("-inf")),
    (11, "train/loss", float("nan")),
]


def test_event_file_has_the_bytes_tensorboardx_writes(tmp_path, monkeypatch):
    start = 1_700_000_000.25
    ours = metrics_writer.EventFile(tmp_path / "ours", wall_time=start)
    for k, (step, tag, value) in enumerate(SCALARS):
        ours.add_scalar(tag, value, step, wall_time=start + 1.5 + k)
    ours.close()
    monkeypatch.setattr(time, "time", lambda: start)  # the wall time of its first event
    theirs = SummaryWriter(str(tmp_path / "theirs"))
    monkeypatch.undo()
    for k, (step, tag, value) in enumerate(SCALARS):
        theirs.add_scalar(tag, value, step, walltime=start + 1.5 + k)
    theirs.close()
    (ours_file,) = (tmp_path / "ours").iterdir()
    (theirs_file,) = (tmp_path / "theirs").iterdir()
    assert ours_file.name == theirs_file.name  # events.out.tfevents.<seconds>.<host>
    assert ours_file.name.startswith("events.out.tfevents.1700000000.")
    assert ours_file.read_bytes() == theirs_file.read_bytes()
    assert len(records(ours_file.read_bytes())) == 1 + len(SCALARS)
