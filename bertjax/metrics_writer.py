"""Where metrics go: TensorBoard event files, a JSON-lines file, and a progress bar.

Only process 0 writes; the others get disabled writers so the loop needs no branches.
TensorBoard files are written with tensorboardX, which needs no TensorFlow.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping

import tqdm
from tensorboardX import SummaryWriter


class MetricWriter:
    """Appends {"step": N, metric: value, ...} lines to a JSON-lines file and TensorBoard."""

    def __init__(
        self, jsonl_path: str | pathlib.Path, tensorboard_dir: str | pathlib.Path, enabled=True
    ):
        self.enabled = enabled
        if enabled:
            self._jsonl = open(jsonl_path, "a", encoding="utf-8")
            self._tensorboard = SummaryWriter(str(tensorboard_dir))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled or not metrics:
            return
        self._jsonl.write(
            json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n"
        )
        self._jsonl.flush()
        for key, value in metrics.items():
            self._tensorboard.add_scalar(key, float(value), step)
        self._tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tensorboard.close()


class Progress:
    """A progress bar showing step, loss and sequences/s."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True):
        self._bar = tqdm.tqdm(
            total=total, initial=initial, unit="step", dynamic_ncols=True, disable=not enabled
        )
        self._last = initial

    def update(self, step: int) -> None:
        self._bar.update(step - self._last)
        self._last = step

    def show(self, metrics: Mapping[str, float]) -> None:
        shown = {
            "loss": metrics.get("train/loss"),
            "mlm_acc": metrics.get("train/mlm_accuracy"),
            "seq/s": metrics.get("perf/sequences_per_sec"),
            "eval_mlm_acc": metrics.get("eval/mlm_accuracy"),
            "eval_nsp_acc": metrics.get("eval/nsp_accuracy"),
        }
        postfix = {k: f"{v:.4g}" for k, v in shown.items() if v is not None}
        if postfix:
            self._bar.set_postfix(postfix, refresh=True)

    def close(self) -> None:
        self._bar.close()
