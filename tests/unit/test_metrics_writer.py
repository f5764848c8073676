"""Metrics files: metrics.jsonl and TensorBoard event files (compared with the bytes
tensorboardX writes in tests/parity/test_metrics_writer_parity.py)."""

import json

from bertjax.engine import metrics_writer
from tests.helpers.metrics_writer import records


def test_metric_writer_writes_json_lines_and_one_event_per_metric(tmp_path):
    writer = metrics_writer.MetricWriter(tmp_path / "metrics.jsonl", tmp_path / "tb")
    writer.write(10, {"train/loss": 2.5, "train/mlm_accuracy": 0.25})
    writer.write(20, {})  # nothing to log: no line, no event
    writer.write(30, {"eval/mlm_accuracy": 0.5})
    (events,) = (tmp_path / "tb").iterdir()
    assert len(records(events.read_bytes())) == 1 + 3  # flushed as written, before close
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 10, "train/loss": 2.5, "train/mlm_accuracy": 0.25},
        {"step": 30, "eval/mlm_accuracy": 0.5},
    ]
    disabled = metrics_writer.MetricWriter(tmp_path / "x.jsonl", tmp_path / "x", enabled=False)
    disabled.write(1, {"train/loss": 1.0})
    disabled.close()
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "x").exists()
