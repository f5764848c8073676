"""The integration tests of test_recipe.py (tests/unit/), with its helpers."""

import json
import shutil

import jax
import numpy as np
import pytest

import bertjax
from bertjax import data as data_lib
from bertjax.pretrain import loop as trainer
from bertjax.pretrain.objective import build_pretraining
from bertjax.pretrain.settings import SENTENCE_PAIR_PARAMS, PretrainSettings
from tests.helpers.recipe import (
    _recipe_config,
    data_dir,  # noqa: F401 (fixtures)
)
from tests.helpers.trainer import read_losses, train


@pytest.mark.slow  # a run and a compiled init: about 30 s on two cores
def test_a_short_modern_recipe_run_trains_mlm_only(data_dir, tmp_path, monkeypatch):
    masking_of_split = {}
    make_loader = data_lib.make_loader

    def spy(data_dir, *, split="train", masking=None, **kwargs):
        masking_of_split[split] = masking
        return make_loader(data_dir, split=split, masking=masking, **kwargs)

    monkeypatch.setattr(data_lib, "make_loader", spy)
    config = _recipe_config(data_dir)
    settings = PretrainSettings.from_config(config)
    assert settings.optimizer.name == "stable_adamw" and settings.optimizer.schedule == "wsd"
    workdir = tmp_path / "run"
    result = train(config, workdir)

    # Training batches at 30%, held-out ones at 15%.
    assert masking_of_split["train"].masked_lm_prob == 0.3
    assert masking_of_split["eval"].masked_lm_prob == 0.15

    losses = read_losses(workdir)
    assert sorted(losses) == list(range(1, 17))
    assert all(np.isfinite(v) for v in losses.values())
    assert np.mean([losses[s] for s in (14, 15, 16)]) < np.mean([losses[s] for s in (1, 2, 3)])
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert not any("nsp" in key for record in records for key in record)
    assert sorted(result["eval"]) == ["eval/mlm_accuracy", "eval/mlm_loss"]
    assert sorted(result["baselines"]) == ["eval/mlm_accuracy"]
    # The decay ends at the configured floor.
    last = [r for r in records if "train/learning_rate" in r][-1]
    assert last["step"] == 16
    assert last["train/learning_rate"] == pytest.approx(
        config.optimizer.end_learning_rate
        + (config.optimizer.learning_rate - config.optimizer.end_learning_rate)
        * (1 - np.sqrt(5 / 6)),
        rel=1e-5,
    )

    # The pooler and the pair head are where initialisation left them.
    _, params, tokenizer = bertjax.load(workdir)
    setup = build_pretraining(settings, settings.model_config(tokenizer))
    with jax.set_mesh(setup.mesh):
        params_rng, _ = jax.random.split(jax.random.key(config.seed))
        initial = jax.device_get(setup.state.init(params_rng).params)
    for name in SENTENCE_PAIR_PARAMS:
        got, want = params, initial
        for key in name.split("/"):
            got, want = got[key], want[key]
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    assert not np.array_equal(
        np.asarray(params["mlm_head"]["output_bias"]),
        np.asarray(initial["mlm_head"]["output_bias"]),
    )


@pytest.mark.slow  # three short runs: about 40 s on two cores
def test_a_stable_run_is_decayed_by_its_continuation(data_dir, tmp_path):
    # Straight: 12 steps, the last 4 decaying.
    straight = tmp_path / "straight"
    train(_recipe_config(data_dir, num_train_steps=12, **{"optimizer.decay_steps": 4}), straight)
    # Stable only for 8 steps, then the same workdir continued to 12 with the decay.
    continued = tmp_path / "continued"
    train(_recipe_config(data_dir, num_train_steps=8, **{"optimizer.decay_steps": 0}), continued)
    train(_recipe_config(data_dir, num_train_steps=12, **{"optimizer.decay_steps": 4}), continued)

    want, got = read_losses(straight), read_losses(continued)
    assert sorted(got) == sorted(want) == list(range(1, 13))
    # The programs differ (their schedules' constants), so the compiler may sum in another
    # order: the runs agree to float32 rounding, not bit for bit (an absolute tolerance for
    # the parameters that stay near 0, where rounding is all that moves them).
    np.testing.assert_allclose([got[s] for s in want], [want[s] for s in want], rtol=1e-6)
    _, params_straight, _ = bertjax.load(straight)
    _, params_continued, _ = bertjax.load(continued)
    for a, b in zip(jax.tree.leaves(params_straight), jax.tree.leaves(params_continued)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # three short runs, four batch sizes compiled: about 60 s on two cores
def test_a_run_stopped_during_batch_warmup_resumes_bit_exactly(data_dir, tmp_path, monkeypatch):
    rows = []
    batch = trainer._Hooks.batch

    def spy(hooks, step):
        local_batch = batch(hooks, step)
        rows.append(len(local_batch["input_ids"]))
        return local_batch

    monkeypatch.setattr(trainer._Hooks, "batch", spy)
    warmup = {
        "batch_warmup_start": 8,
        "batch_warmup_steps": 8,
        "checkpoint_every_steps": 4,
        "optimizer.decay_steps": 0,  # the rates do not depend on num_train_steps
    }
    straight = tmp_path / "straight"
    train(_recipe_config(data_dir, num_train_steps=12, **warmup), straight)
    assert rows == [8, 8, 8, 16, 16, 16, 24, 24, 32, 32, 32, 32]

    # Stopped after step 6 (mid-warmup), its last checkpoint lost: resumes from step 4.
    stopped = tmp_path / "stopped"
    train(_recipe_config(data_dir, num_train_steps=6, **warmup), stopped)
    shutil.rmtree(stopped / "checkpoints" / "6")
    rows.clear()
    train(_recipe_config(data_dir, num_train_steps=12, **warmup), stopped)
    assert rows == [16, 16, 24, 24, 32, 32, 32, 32]  # steps 5..12

    want, got = read_losses(straight), read_losses(stopped)
    assert sorted(got) == sorted(want) == list(range(1, 13))
    for step in want:
        assert got[step] == want[step], f"step {step}: {got[step]} != {want[step]}"
    _, params_straight, _ = bertjax.load(straight)
    _, params_stopped, _ = bertjax.load(stopped)
    for a, b in zip(jax.tree.leaves(params_straight), jax.tree.leaves(params_stopped)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
