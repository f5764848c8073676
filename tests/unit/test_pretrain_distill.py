"""Pretraining distillation (objective "distill"): its loss against numpy, and its settings."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.engine.settings import ConfigError
from bertjax.pretrain.objectives.distill import DistillLoss, DistillSettings
from bertjax.pretrain.settings import PretrainSettings
from tests.helpers.recipe import data_dir  # noqa: F401 (fixtures)
from tests.helpers.trainer import make_config


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _batch(rng, rows=3, seq=12, predictions=4, vocab=60, hidden=32):
    lengths = np.array([12, 9, 5])[:rows]
    mask = (np.arange(seq) < lengths[:, None]).astype(np.int32)
    weights = np.ones((rows, predictions), np.float32)
    weights[2, 2:] = 0.0  # padding predictions of the short row
    return {
        "input_ids": rng.integers(5, vocab, (rows, seq)).astype(np.int32) * mask,
        "segment_ids": np.zeros((rows, seq), np.int32),
        "input_mask": mask,
        "masked_lm_positions": rng.integers(1, 5, (rows, predictions)).astype(np.int32),
        "masked_lm_ids": rng.integers(5, vocab, (rows, predictions)).astype(np.int32),
        "masked_lm_weights": weights,
        "next_sentence_labels": np.zeros(rows, np.int32),
        "teacher_mlm_logits": rng.normal(size=(rows, predictions, vocab)).astype(np.float32),
        "teacher_hidden": rng.normal(size=(rows, seq, hidden)).astype(np.float32),
    }


@pytest.mark.parametrize("weights", [(5.0, 2.0, 1.0), (0.0, 1.0, 0.0), (1.0, 0.0, 3.0)])
def test_the_loss_is_distilberts_weighted_terms_against_numpy(weights):
    config = BertConfig.preset(
        "tiny",
        vocab_size=60,
        hidden_size=32,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        num_layers=1,
    )
    model = BertForPreTraining(config)
    batch = _batch(np.random.default_rng(0))
    params = nn.meta.unbox(
        model.init(
            {"params": jax.random.key(0)},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
        )["params"]
    )
    ce, mlm, cos = weights
    objective = DistillLoss(
        model, DistillSettings(temperature=2.0, alpha_ce=ce, alpha_mlm=mlm, alpha_cos=cos)
    )
    sums = objective.sums(params, batch, rng=None, deterministic=True)
    loss = float(objective.loss(sums, objective.denominators(batch)))

    out = model.apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        batch["masked_lm_positions"],
        deterministic=True,
    )
    logits = np.asarray(out.mlm_logits, np.float64)
    hidden = np.asarray(out.sequence_output, np.float64)
    w = batch["masked_lm_weights"] > 0
    p = _softmax(batch["teacher_mlm_logits"].astype(np.float64) / 2)
    q = _softmax(logits / 2)
    soft = 4 * np.sum(p * (np.log(p) - np.log(q)), axis=-1)[w].mean()
    log_q1 = np.log(_softmax(logits))
    hard = -np.take_along_axis(log_q1, batch["masked_lm_ids"][..., None], -1)[..., 0][w].mean()
    t = batch["teacher_hidden"].astype(np.float64)
    cosine = (hidden * t).sum(-1) / np.linalg.norm(hidden, axis=-1) / np.linalg.norm(t, axis=-1)
    real = batch["input_mask"] > 0
    distance = (1 - cosine)[real].mean()
    np.testing.assert_allclose(loss, ce * soft + mlm * hard + cos * distance, rtol=1e-4)
    metrics = objective.metrics(sums, "train")
    np.testing.assert_allclose(float(metrics["train/distill_ce"]), soft, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["train/distill_cos"]), distance, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["train/mlm_loss"]), hard, rtol=1e-4)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"teacher": ""}, "config.teacher='': set it to the teacher"),
        ({"teacher": "/nowhere"}, "config.teacher='/nowhere': no such directory"),
        ({"distill_temperature": 0.0}, "config.distill_temperature=0.0: must be in (0, 100]"),
        ({"distill_weights": "5,2"}, "config.distill_weights='5,2': must be three weights"),
        ({"distill_weights": "0,0,0"}, "not all 0"),
        ({"distill_student_layers": "3,1"}, "config.distill_student_layers='3,1': must be"),
    ],
)
def test_bad_settings_fail_naming_the_field(data_dir, tmp_path, fields, message):
    config = make_config(data_dir, objective="distill", **{"teacher": str(tmp_path), **fields})
    with pytest.raises(ConfigError) as failure:
        PretrainSettings.from_config(config)
    assert message in str(failure.value) and "\n" not in str(failure.value)


def test_a_teacher_run_reads_as_settings(data_dir, tmp_path):
    config = make_config(
        data_dir, objective="distill", teacher=str(tmp_path), distill_student_layers="0,1"
    )
    settings = PretrainSettings.from_config(config)
    assert settings.objective_settings == DistillSettings(
        teacher=str(tmp_path), student_layers=(0, 1)
    )
    assert settings.optimizer.frozen == ("nsp_head", "bert/pooler")  # the masked LM only
