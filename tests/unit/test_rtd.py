"""Replaced-token detection (bertjax.pretrain.objectives.rtd): ELECTRA's masking counts and
fates, the generator's shape, and the pitfalls: lambda applied once, the sample detached, the
sampling in float32."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax import encoders
from bertjax.data.masking import MaskingSettings, RowRandom, mask_batch
from bertjax.encoders.electra.config import generator_config
from bertjax.engine.settings import ConfigError
from bertjax.pretrain import objectives
from bertjax.pretrain.objectives.rtd import model as rtd_model
from bertjax.pretrain.objectives.rtd import objective as objective_lib
from bertjax.pretrain.objectives.rtd.objective import (
    AUC_BINS,
    RtdLoss,
    RtdSettings,
    area_under_roc,
    gumbel_sample,
    num_slots,
    originals,
)
from bertjax.pretrain.settings import PretrainSettings
from configs import electra_tiny
from tests.helpers.encoders import SMALL_CONFIGS
from tests.helpers.params import random_init_from_key
from tests.helpers.replaced_tokens import loss_gradients

RTD = objectives.get("rtd")
PAD, CLS, SEP, MASK = 0, 2, 3, 4
SPECIALS = (PAD, 1, CLS, SEP, MASK)
VOCAB = 50
CONFIG = dataclasses.replace(
    SMALL_CONFIGS["electra"],
    vocab_size=VOCAB,
    num_layers=1,
    max_position_embeddings=32,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def _rows(lengths, seq):
    """[CLS] w... [SEP] rows of the given real lengths, padded to seq."""
    rng = np.random.default_rng(0)
    ids = np.zeros((len(lengths), seq), np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(5, VOCAB, n)
        ids[row, 0], ids[row, n - 1] = CLS, SEP
    return ids, (ids != PAD).astype(np.int32)


def _masked(lengths, seq, prob=0.15, seed=0):
    ids, mask = _rows(lengths, seq)
    masking = RTD.masking(MaskingSettings(masked_lm_prob=prob), seq)
    out = mask_batch(
        ids,
        mask,
        RowRandom(np.arange(len(lengths)) + seed * 1000),
        masking,
        vocab_size=VOCAB,
        special_ids=SPECIALS,
        mask_id=MASK,
    )
    return ids, mask, masking, out


def test_slots_are_electras_formula():
    assert num_slots(0.15, 128) == 19  # int(0.155 * 128) = int(19.84)
    assert num_slots(0.15, 512) == 79  # int(79.36)
    assert num_slots(0.25, 512) == 130  # ELECTRA-Large's rate
    assert num_slots(0.15, 20) == 3


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(3, 24), min_size=1, max_size=6),
    prob=st.sampled_from([0.15, 0.25, 0.4]),
    seed=st.integers(0, 50),
)
def test_masking_counts_positions_and_fates(lengths, prob, seed):
    seq = 24
    ids, mask, masking, out = _masked(lengths, seq, prob, seed)
    slots = num_slots(prob, seq)
    assert masking.max_predictions_per_seq == slots
    assert out["masked_lm_positions"].shape == (len(lengths), slots)
    weights = out["masked_lm_weights"] > 0
    for row, n in enumerate(lengths):
        wanted = max(1, min(slots, round(n * prob)))
        assert weights[row].sum() == min(wanted, n - 2)  # never more than the non-specials
        chosen = out["masked_lm_positions"][row][weights[row]]
        assert len(set(chosen.tolist())) == len(chosen)
        assert np.all((chosen > 0) & (chosen < n - 1))  # never [CLS], [SEP] or padding
        became = out["input_ids"][row][chosen]
        # [MASK] or kept: never a random token.
        assert np.all((became == MASK) | (became == ids[row][chosen]))
    # Everything else is untouched; originals() puts the masked tokens back.
    np.testing.assert_array_equal(np.asarray(originals(out | {"input_mask": mask})), ids)


def test_masking_exact_values():
    """Two rows of 24 slots at 15%: N = int(0.155 * 24) = 3 slots; 10 real tokens give
    round(1.5) = 2 positions, 24 give min(3, round(3.6)) = 3 (pinned draws)."""
    ids, _, _, out = _masked([10, 24], 24)
    assert out["masked_lm_positions"].tolist() == [[5, 8, 0], [3, 5, 7]]
    assert out["masked_lm_weights"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert out["masked_lm_ids"].tolist() == [[6, 12, 0], [32, 37, 29]]
    expected = ids.copy()
    expected[0, [5, 8]] = MASK
    expected[1, [3, 5, 7]] = MASK
    np.testing.assert_array_equal(out["input_ids"], expected)


def test_fates_are_85_percent_mask_and_none_random():
    ids, _, _, out = _masked([24] * 400, 24)
    weights = out["masked_lm_weights"] > 0
    rows = np.broadcast_to(np.arange(400)[:, None], weights.shape)
    became = out["input_ids"][rows[weights], out["masked_lm_positions"][weights]]
    share = np.mean(became == MASK)
    assert 0.82 < share < 0.88, share
    assert np.all((became == MASK) | (became == out["masked_lm_ids"][weights]))


def test_generator_is_a_fraction_with_heads_of_64():
    base = dataclasses.replace(CONFIG, hidden_size=768, num_heads=12, embedding_size=768)
    generator = generator_config(base, 0.25)
    assert (generator.hidden_size, generator.num_heads, generator.intermediate_size) == (
        192,
        3,
        768,
    )
    assert generator.num_layers == base.num_layers
    assert generator_config(CONFIG, 0.5).num_heads == 1  # 16 // 64 -> at least 1
    # The family's generator is that config's.
    assert encoders.family_of(base).generator(base, 0.25).config == generator


@functools.cache
def _setup(weight=50.0, dtype="float32"):
    config = dataclasses.replace(CONFIG, dtype=dtype)
    params = random_init_from_key(rtd_model.init(config, 0.5), 0, std=0.02)
    step = RtdLoss(rtd_model.ReplacedTokenDetection(config, 0.5), weight)
    ids, mask, _, out = _masked([12, 20, 9], 20)
    batch = {
        "input_ids": out["input_ids"],
        "input_mask": mask,
        "segment_ids": np.zeros_like(mask),
        "masked_lm_positions": out["masked_lm_positions"],
        "masked_lm_ids": out["masked_lm_ids"],
        "masked_lm_weights": out["masked_lm_weights"],
        "next_sentence_labels": np.zeros(3, np.int32),
    }
    return step, params, jax.tree.map(jnp.asarray, batch)


@functools.cache
def _sums(weight=50.0):
    """The deterministic loss sums of `_setup(weight)`'s batch, compiled once for every rng."""
    step, _, batch = _setup(weight)
    return jax.jit(lambda p, rng: step.sums(p, batch, rng=rng, deterministic=True))


def test_embeddings_are_shared_and_each_network_has_its_own_projection():
    _, params, _ = _setup()
    assert set(params) == {"bert", "discriminator_head", "generator"}
    assert "embeddings" not in params["generator"]
    # Embedding 16 -> the generator's 16: no projection; the discriminator's 16 -> 32: one.
    assert "embeddings_project" in params["bert"]
    assert "embeddings_project" not in params["generator"]
    # Opened, the discriminator is ElectraPreTraining's tree and the generator one of its own.
    networks = RTD.networks(CONFIG, params, {"config": {"generator_hidden_fraction": 0.5}})
    assert networks[""].params.keys() == {"bert", "discriminator_head", "mlm_head"}
    assert networks["generator"].params.keys() == {"bert", "discriminator_head", "mlm_head"}


def test_lambda_is_applied_once():
    step, params, batch = _setup(weight=50.0)
    sums = _sums(50.0)(params, jax.random.key(1))
    generator, tokens = step.denominators(batch)
    assert float(generator) == float(np.sum(batch["masked_lm_weights"]))
    assert float(tokens) == float(np.sum(batch["input_mask"]))
    loss = step.loss(sums, (generator, tokens))
    expected = sums.generator_loss / generator + 50.0 * sums.discriminator_loss / tokens
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
    other = RtdLoss(step.model, 7.0).loss(sums, (generator, tokens))
    np.testing.assert_allclose(
        float(loss - other), float(43.0 * sums.discriminator_loss / tokens), rtol=1e-5
    )
    metrics = step.metrics(sums, "eval")
    np.testing.assert_allclose(
        float(metrics["eval/all_original_accuracy"]), 1 - float(metrics["eval/replaced_share"])
    )


def test_the_sample_is_detached():
    """The discriminator's loss gives the generator's own parameters no gradient; the generator
    loss gives the discriminator's layers and head none."""
    step, params, batch = _setup()
    rng = jax.random.key(3)
    sums = _sums()(params, rng)
    assert float(sums.replaced) > 0  # the test means something: some tokens were replaced

    disc, gen = loss_gradients(step, params, batch, rng)
    for leaf in jax.tree.leaves(disc["generator"]):
        assert not np.any(np.asarray(leaf))
    assert any(np.any(np.asarray(leaf)) for leaf in jax.tree.leaves(disc["discriminator_head"]))
    assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(gen["discriminator_head"]))
    assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(gen["bert"]["encoder"]))
    # The shared word table learns from both.
    assert np.any(np.asarray(gen["bert"]["embeddings"]["word_embeddings"]["embedding"]))


def test_sampling_is_float32_under_bfloat16():
    logits = jax.random.normal(jax.random.key(0), (64, 40), jnp.float32) * 30
    key = jax.random.key(5)
    low = gumbel_sample(logits.astype(jnp.bfloat16), key)
    assert low.dtype == jnp.int32
    np.testing.assert_array_equal(
        low, gumbel_sample(logits.astype(jnp.bfloat16).astype(jnp.float32), key)
    )
    # A bfloat16 model trains: every statistic finite.
    step, params, batch = _setup(dtype="bfloat16")
    sums = jax.jit(lambda p: step.sums(p, batch, rng=jax.random.key(2), deterministic=False))(
        params
    )
    assert all(np.isfinite(np.asarray(x)).all() for x in sums)


def test_settings_refuse_other_families_and_bad_fields():
    config = electra_tiny.get_config()
    config.model.family = "bert"
    with pytest.raises(ConfigError, match="replaced-token detection runs on"):
        PretrainSettings.from_config(config)
    config = electra_tiny.get_config()
    config.rtd_weight = 0.0
    with pytest.raises(ConfigError, match="rtd_weight"):
        PretrainSettings.from_config(config)
    settings_ = PretrainSettings.from_config(electra_tiny.get_config())
    assert settings_.objective_settings == RtdSettings(generator_hidden_fraction=0.5)
    assert settings_.optimizer.frozen == ("bert/pooler",)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(-3.0, 3.0))
def test_the_auc_from_logit_histograms_is_the_pairwise_one(seed, shift):
    """The discriminator's AUC, counted in bins of its logits (sums that add over batches),
    equals the exact pairwise AUC up to the bins' width; split batches add to the same."""
    rng = np.random.default_rng(seed)
    replaced = rng.normal(shift, 1.5, 40).astype(np.float32)
    original = rng.normal(0.0, 1.5, 300).astype(np.float32)
    exact = np.mean(replaced[:, None] > original[None, :])
    histogram = functools.partial(objective_lib._histogram)
    logits = np.concatenate([replaced, original])[None, :]  # [1, n]
    is_replaced = np.concatenate([np.ones(40), np.zeros(300)]).astype(np.float32)[None, :]
    whole = area_under_roc(histogram(logits, is_replaced), histogram(logits, 1 - is_replaced))
    assert float(whole) == pytest.approx(exact, abs=0.03)
    halves = [slice(0, 170), slice(170, 340)]
    positives = sum(histogram(logits[:, h], is_replaced[:, h]) for h in halves)
    negatives = sum(histogram(logits[:, h], 1 - is_replaced[:, h]) for h in halves)
    assert positives.shape == (AUC_BINS,)
    assert float(area_under_roc(positives, negatives)) == pytest.approx(float(whole), abs=1e-6)
    assert float(area_under_roc(positives, 0 * negatives)) == 0.5  # nothing to rank against


def test_a_generator_too_strong_is_named_in_a_caution():
    assert RTD.cautions({"eval/generator_accuracy": 0.5}) == []
    assert RTD.cautions({"eval/loss": 1.0}) == []
    (line,) = RTD.cautions({"eval/generator_accuracy": 0.9})
    assert "90.0%" in line and "generator_hidden_fraction" in line
    assert objectives.get("mlm").cautions({"eval/generator_accuracy": 0.9}) == []
