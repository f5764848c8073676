"""The modern pretraining recipe: the MLM-only objective, the eval masking rate, a short run
with StableAdamW and warmup-stable-decay, a stable run decayed by its continuation, and the
batch-size warmup with its exact resume."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.engine.settings import ConfigError
from bertjax.pretrain.objective import MaskedLmLoss
from bertjax.pretrain.settings import SENTENCE_PAIR_PARAMS, PretrainSettings
from configs import tiny_modern_recipe
from tests.helpers.recipe import data_dir  # noqa: F401 (fixtures)
from tests.helpers.trainer import make_config


def _random_batch(rng, batch=4, seq=16, predictions=5, vocab=60):
    ids = rng.integers(5, vocab, size=(batch, seq)).astype(np.int32)
    return {
        "input_ids": ids,
        "segment_ids": (np.arange(seq) >= seq // 2).astype(np.int32)[None].repeat(batch, 0),
        "input_mask": np.ones((batch, seq), np.int32),
        "masked_lm_positions": rng.integers(1, seq, size=(batch, predictions)).astype(np.int32),
        "masked_lm_ids": rng.integers(5, vocab, size=(batch, predictions)).astype(np.int32),
        "masked_lm_weights": np.ones((batch, predictions), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=(batch,)).astype(np.int32),
    }


def test_mlm_only_loss_has_no_sentence_term():
    config = BertConfig.preset("tiny", vocab_size=60, max_position_embeddings=16)
    model = BertForPreTraining(config)
    batch = _random_batch(np.random.default_rng(0))
    params = nn.meta.unbox(
        jax.jit(model.init)(
            {"params": jax.random.key(0)},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
        )["params"]
    )

    def loss_and_grads(objective):
        def loss(p):
            sums = objective.sums(p, batch, rng=None, deterministic=True)
            return objective.loss(sums, objective.denominators(batch)), sums

        (value, sums), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        return value, grads, objective.metrics(sums, "train")

    mlm_loss, mlm_grads, mlm_metrics = loss_and_grads(MaskedLmLoss(model, False))
    full_loss, full_grads, full_metrics = loss_and_grads(MaskedLmLoss(model))
    # The MLM-only loss is the MLM term of the full one, and the pair head learns nothing.
    np.testing.assert_allclose(
        mlm_loss, full_loss - full_metrics["train/nsp_loss"], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(mlm_loss, mlm_metrics["train/mlm_loss"], rtol=1e-6)
    for name in SENTENCE_PAIR_PARAMS:
        subtree = mlm_grads
        for key in name.split("/"):
            subtree = subtree[key]
        assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(subtree)), name
    assert np.any(np.asarray(full_grads["nsp_head"]["kernel"]))
    assert np.any(np.asarray(mlm_grads["mlm_head"]["output_bias"]))
    assert sorted(mlm_metrics) == ["train/mlm_accuracy", "train/mlm_loss"]
    assert "train/nsp_accuracy" in full_metrics


def test_objective_and_eval_rate_settings(data_dir):
    default = PretrainSettings.from_config(make_config(data_dir))
    assert default.objective == "mlm_sentence" and default.sentence_pair
    assert default.optimizer.frozen == ()
    assert default.data.masking == default.data.eval_masking  # both google's 15%

    config = make_config(data_dir, objective="mlm")
    config.data.masked_lm_prob = 0.3
    config.data.max_predictions_per_seq = 20
    settings = PretrainSettings.from_config(config)
    assert not settings.sentence_pair
    assert settings.optimizer.frozen == SENTENCE_PAIR_PARAMS
    assert settings.data.masking.masked_lm_prob == 0.3
    assert settings.data.eval_masking.masked_lm_prob == 0.15
    assert settings.data.eval_masking.max_predictions_per_seq == 20

    for overrides, field in [
        (
            {"objective": "nsp"},
            r"config\.objective='nsp': must be one of \('mlm_sentence', 'mlm', 'rtd', 'distill'\)",
        ),
        ({"data.eval_masked_lm_prob": 0.0}, r"config\.data\.eval_masked_lm_prob=0\.0"),
        ({"optimizer.decay_steps": 10**7}, r"config\.optimizer: OptimizerSettings\.decay_steps"),
        ({"optimizer.name": "stableadamw"}, r"OptimizerSettings\.name='stableadamw'"),
    ]:
        with pytest.raises(ConfigError, match=field):
            PretrainSettings.from_config(make_config(data_dir, **overrides))


def test_the_modern_recipe_config_reads(data_dir):
    config = tiny_modern_recipe.get_config()
    config.data.dir = str(data_dir)
    config.data.max_seq_length = 64
    settings = PretrainSettings.from_config(config)
    o = settings.optimizer
    assert (o.name, o.schedule, o.learning_rate, o.b1, o.b2, o.eps) == (
        "stable_adamw",
        "wsd",
        8e-4,
        0.9,
        0.98,
        1e-6,
    )
    assert (o.weight_decay, o.lr_decoupled_weight_decay, o.max_grad_norm) == (1e-5, True, None)
    assert settings.objective == "mlm" and settings.data.masking.masked_lm_prob == 0.3
    assert settings.data.eval_masking.masked_lm_prob == 0.15
    assert (settings.run.batch_size_at(0), settings.run.batch_size_at(100)) == (8, 32)
    # Room for 30% of 128 tokens: the cap does not lower the rate.
    assert settings.data.masking.max_predictions_per_seq >= round(128 * 0.3)


# ----------------------------------------------------------------------------- batch warmup


def test_batch_warmup_sizes_and_validation(data_dir):
    run = PretrainSettings.from_config(
        make_config(data_dir, batch_warmup_start=8, batch_warmup_steps=8)
    ).run
    sizes = [run.batch_size_at(step) for step in range(12)]
    assert sizes == [8, 8, 8, 16, 16, 16, 24, 24, 32, 32, 32, 32]
    assert run.loader_batch_size == 8
    default = PretrainSettings.from_config(make_config(data_dir)).run
    assert default.loader_batch_size == 32 and default.batch_size_at(0) == 32

    for overrides, message in [
        ({"batch_warmup_steps": -1}, r"config\.batch_warmup_steps=-1"),
        ({"batch_warmup_steps": 4}, r"config\.batch_warmup_start=0: must be a positive divisor"),
        ({"batch_warmup_steps": 4, "batch_warmup_start": 12}, r"batch_warmup_start=12"),
        (  # 8 devices and 2 micro-batches: each warmup batch must hold 16 rows
            {"batch_warmup_steps": 4, "batch_warmup_start": 8, "grad_accum_steps": 2},
            r"batch_warmup_start=8: must be a multiple of grad_accum_steps x the data-parallel "
            r"size \(16\)",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            PretrainSettings.from_config(make_config(data_dir, **overrides))
