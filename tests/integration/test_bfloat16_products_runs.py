"""Pretraining with bfloat16 products (model.dtype bfloat16, or model.matmul_dtype bfloat16
on a float32 model) runs its train step to the end: on a CPU with AVX512-BF16 every product
of bfloat16 operands must reach XNNPACK in a layout it takes, or XLA's CPU runtime fails when
the step runs (bertjax.nn.low_precision). The demo commands as a user runs them: one device, XLA's
optimising compiles (whose rewrites decide the layouts), the built-in corpus, a 4,000-piece
vocabulary, rows of 128 (prepared once for the suite as the command prepares it:
conftest.py's demo_data). ModernBERT's embedding table's gradient is the product that once
failed: XLA folded the transpose of its result into the product."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import bertjax
from tests.helpers.trainer import read_losses
from tests.helpers.xla_env import QUICK_COMPILES, REPO, subprocess_env

STEPS = 4


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, numerics",
    [
        ("modernbert_tiny", {"dtype": "bfloat16"}),
        ("modernbert_tiny", {"matmul_dtype": "bfloat16"}),
        ("tiny", {"matmul_dtype": "bfloat16"}),
    ],
    ids=["modernbert-bfloat16", "modernbert-matmul", "bert-matmul"],
)
def test_pretraining_with_bfloat16_products_runs_and_opens(tmp_path, demo_data, recipe, numerics):
    env = {k: v for k, v in subprocess_env(1).items() if k not in QUICK_COMPILES}
    workdir = tmp_path / "run"
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "--config",
        str(REPO / "configs" / f"{recipe}.py"),
        "--workdir",
        str(workdir),
        f"--config.data.dir={demo_data(recipe)}",
        f"--config.num_train_steps={STEPS}",
        "--config.batch_size=32",
        "--config.batch_warmup_steps=0",
        "--config.optimizer.warmup_steps=2",
        "--config.optimizer.decay_steps=0",
        "--config.log_every_steps=1",
        f"--config.eval_every_steps={STEPS}",
        "--config.eval_batches=1",
        *(f"--config.model.{name}={value}" for name, value in numerics.items()),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = read_losses(workdir)
    assert len(losses) == STEPS and all(np.isfinite(v) for v in losses.values())
    model = bertjax.Model.load(workdir)
    for name, value in numerics.items():
        assert getattr(model.config, name) == value
    assert np.isfinite(model.embed(["the cat sat on the mat"])).all()
