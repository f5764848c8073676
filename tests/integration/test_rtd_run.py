"""Replaced-token detection end to end: a one-layer ELECTRA trained through the pretraining
loop on the 8 simulated devices with gradient accumulation, resumed bit-exactly from a
checkpoint."""

from __future__ import annotations

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

import bertjax
from bertjax.pretrain import loop as trainer
from bertjax.pretrain.settings import PretrainSettings
from configs import electra_tiny


def _config(data_dir: pathlib.Path):
    config = electra_tiny.get_config()
    config.data.dir = str(data_dir)
    config.data.max_seq_length = 64
    config.data.max_predictions_per_seq = 10
    config.model.update(
        dict(num_layers=1, hidden_size=64, num_heads=1, intermediate_size=128, embedding_size=32)
    )
    config.generator_hidden_fraction = 0.5
    config.batch_size = 16
    config.grad_accum_steps = 2
    config.mesh_shape = (4, 2, 1)
    config.num_train_steps = 8
    config.log_every_steps = 1
    config.eval_every_steps = 8
    config.eval_batches = 2
    config.checkpoint_every_steps = 4
    config.optimizer.warmup_steps = 2
    config.fill_mask_samples = 2
    return config


def _losses(workdir: pathlib.Path) -> dict[int, float]:
    out = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "train/loss" in record:
            out[record["step"]] = record["train/loss"]
    return out


@pytest.mark.slow
def test_rtd_trains_sharded_with_accumulation_and_resumes_bit_exactly(synthetic_data, tmp_path):
    settings = PretrainSettings.from_config(_config(synthetic_data))
    straight = trainer.train_and_evaluate(settings, str(tmp_path / "straight"))
    assert straight["steps"] == 8
    metrics = straight["eval"]
    for name in ("discriminator_accuracy", "replaced_recall", "generator_accuracy"):
        assert 0.0 <= metrics[f"eval/{name}"] <= 1.0
    assert 0.0 < metrics["eval/replaced_share"] < 0.2
    assert straight["baselines"]["eval/discriminator_accuracy"] == pytest.approx(
        metrics["eval/all_original_accuracy"]
    )
    assert len(straight["samples"]) == 2  # the discriminator's marks on held-out text

    # The same run, its step-8 checkpoint lost: it resumes from step 4 and ends identically.
    resumed_dir = tmp_path / "resumed"
    trainer.train_and_evaluate(settings, str(resumed_dir))
    shutil.rmtree(resumed_dir / "checkpoints" / "8")
    trainer.train_and_evaluate(settings, str(resumed_dir))
    expected, resumed = _losses(tmp_path / "straight"), _losses(resumed_dir)
    assert sorted(expected) == list(range(1, 9))
    assert [resumed[s] for s in range(1, 9)] == [expected[s] for s in range(1, 9)]
    _, straight_params, _ = bertjax.load(tmp_path / "straight")
    _, resumed_params, _ = bertjax.load(resumed_dir)
    assert set(straight_params) == {"bert", "discriminator_head", "generator"}
    for a, b in zip(jax.tree.leaves(straight_params), jax.tree.leaves(resumed_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
