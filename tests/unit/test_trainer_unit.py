"""The unit tests of test_trainer.py (tests/integration/), with its helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax import data as data_lib
from bertjax.engine import loop
from bertjax.engine.settings import ConfigError
from tests.helpers.corpora import ONE_LAYER, write_corpus
from tests.helpers.trainer import (
    PREDICTIONS,
    RECORDED_LOSSES,
    RECORDED_PARAM_ABS_SUM,
    SEQ_LEN,
    _one_step,
    data_dir,  # noqa: F401 (fixtures)
    make_config,
    read_losses,
    train,
)


def test_a_non_finite_step_leaves_the_state_unchanged(data_dir):
    def spoil(params):
        params = dict(params)
        params["nsp_head"] = dict(params["nsp_head"], bias=params["nsp_head"]["bias"] * jnp.nan)
        return params

    before, after, metrics = _one_step(data_dir, make_config(data_dir, **ONE_LAYER), spoil)
    assert metrics["train/nonfinite"] == 1.0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(loop.NonFiniteError, match="step 7"):
        loop.mean_train_metrics([metrics], step=7)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"batch_size": 12}, "config.batch_size"),  # not divisible by 8 devices
        ({"grad_accum_steps": 3}, "config.batch_size"),
        ({"mesh_shape": (3, 1, 1)}, "config.mesh_shape"),
        ({"data.max_seq_length": 1024}, "config.data.max_seq_length"),
        ({"model.vocab_size": 123}, "config.model.vocab_size"),
        ({"data.input": "/no/such/corpus.txt"}, "config.data.input"),
        ({"data.dir": "/no/such/prepared"}, "config.data.dir"),
        ({"data.eval_fraction": 0.0}, "config.data.eval_fraction"),
        ({"init_from": None}, "config.init_from"),
        ({"batch_size": 4096}, "config.data.eval_fraction"),  # eval split smaller than a batch
        ({"model.preset": "huge"}, "config.model"),
        ({"optimizer.schedule": "sawtooth"}, "config.optimizer"),
        ({"num_train_steps": 0}, "config.num_train_steps"),
        ({"token_capacity": 0.0}, "config.token_capacity"),
    ],
)
def test_impossible_configs_fail_naming_the_field(data_dir, tmp_path, overrides, field):
    config = make_config(data_dir, **overrides)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        train(config, str(tmp_path / "never"))
    assert not (tmp_path / "never" / "checkpoints").exists()


@pytest.mark.parametrize(
    "checkpoint_every, kept",
    [(1, r"the last checkpoint, step 1 in .*, is good\."), (5, r"no checkpoint was saved\.")],
)
def test_a_run_stops_naming_the_first_non_finite_step_and_never_saves_it(
    data_dir, tmp_path, checkpoint_every, kept
):
    # An absurd learning rate: step 1's update is finite but makes every parameter huge,
    # so step 2's loss overflows.
    config = make_config(
        data_dir,
        num_train_steps=10,
        checkpoint_every_steps=checkpoint_every,
        log_every_steps=5,
        **ONE_LAYER,
    )
    config.optimizer.learning_rate = 1e30
    config.optimizer.warmup_steps = 0
    with pytest.raises(loop.NonFiniteError, match=rf"step 2\b.*{kept}"):
        train(config, str(tmp_path / "run"))
    saved = sorted(
        int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()
    )
    assert saved == ([1] if checkpoint_every == 1 else [])


def test_a_fixed_short_run_gives_the_losses_it_recorded(data_dir, tmp_path):
    """A change detector: the values were recorded from this run's own output
    (tests/helpers/trainer.py says where they are checked against independent references)."""
    # The recipe is spelt out, so that tuning configs/tiny.py does not move the record.
    recipe = {
        "model.preset": "tiny",
        "model.hidden_dropout": 0.1,
        "model.attention_dropout": 0.1,
        "model.initializer_range": 0.02,
        "optimizer.learning_rate": 2e-3,
        "optimizer.warmup_steps": 5,
    }
    config = make_config(
        data_dir, num_train_steps=6, grad_accum_steps=2, checkpoint_every_steps=6, **recipe
    )
    train(config, tmp_path / "run")
    losses = read_losses(tmp_path / "run")
    _, params, _ = bertjax.load(tmp_path / "run")
    param_abs_sum = sum(
        float(np.abs(np.asarray(x, np.float64)).sum()) for x in jax.tree.leaves(params)
    )
    np.testing.assert_allclose([losses[s] for s in range(1, 7)], RECORDED_LOSSES, rtol=1e-5)
    np.testing.assert_allclose(param_abs_sum, RECORDED_PARAM_ABS_SUM, rtol=1e-6)


def test_resuming_with_data_of_another_tokenizer_is_rejected(data_dir, tmp_path):
    workdir = tmp_path / "run"
    train(
        make_config(
            data_dir,
            num_train_steps=2,
            checkpoint_every_steps=2,
            **{"optimizer.warmup_steps": 1, **ONE_LAYER},
        ),
        str(workdir),
    )
    other = tmp_path / "other"
    data_lib.prepare(
        [str(write_corpus(tmp_path / "other.txt", seed=5))],
        other,
        max_seq_length=SEQ_LEN,
        max_predictions_per_seq=PREDICTIONS,
        vocab_size=340,
        eval_fraction=0.2,
        workers=1,
    )
    config = make_config(other, num_train_steps=4, **{"optimizer.warmup_steps": 1, **ONE_LAYER})
    with pytest.raises(ConfigError, match="tokenizer"):
        train(config, str(workdir))
    # Another model shape on the same data: also a config error, and the checkpoint stays put.
    config = make_config(
        data_dir, num_train_steps=4, **{"optimizer.warmup_steps": 1, "model.preset": "mini"}
    )
    with pytest.raises(ConfigError, match="hidden_size"):
        train(config, str(workdir))
    assert (workdir / "checkpoints" / "2").is_dir()


def test_prepared_data_with_another_sequence_length_is_rejected(data_dir, tmp_path):
    config = make_config(data_dir, **{"data.max_seq_length": 128})
    with pytest.raises(ValueError, match="max_seq_length"):
        train(config, str(tmp_path / "never"))
