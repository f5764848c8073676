"""Replaced-token detection on ModernBERT (bertjax.pretrain.objectives.rtd on the family's
generator and replaced-token head): the two networks' trees, the one shared token table,
gradients reaching both, and packed documents computing what each document computes in a row
of its own (on ELECTRA's networks too)."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import encoders
from bertjax.encoders.modernbert.config import ModernBertConfig, generator_config
from bertjax.encoders.modernbert.model import MaskedLM, init_masked_lm
from bertjax.pretrain import objectives
from bertjax.pretrain.objectives.rtd import model as rtd_model
from bertjax.pretrain.objectives.rtd import objective as objective_lib
from bertjax.pretrain.objectives.rtd.objective import RtdLoss
from bertjax.pretrain.settings import PretrainSettings
from configs import modernbert_tiny
from tests.helpers.encoders import SMALL_CONFIGS
from tests.helpers.params import random_init_from_key
from tests.helpers.replaced_tokens import loss_gradients

PAD, CLS, SEP, MASK = 0, 2, 3, 4
VOCAB = 50
SEQ = 16
# Layer 0 global, layer 1 local (a token sees 2 on each side).
CONFIG = ModernBertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=2,
    global_attn_every_n_layers=2,
    local_attention=4,
    pad_token_id=PAD,
    cls_token_id=CLS,
    sep_token_id=SEP,
    dtype="float32",
    # Weights wide enough that a token seeing another document shows in the outputs.
    initializer_range=0.2,
)
FAMILY = encoders.family_of(CONFIG)
RTD = objectives.get("rtd")
# ELECTRA's networks on the same rows, for what every family's replaced-token detection does
# with packed documents.
ELECTRA = dataclasses.replace(
    SMALL_CONFIGS["electra"],
    vocab_size=VOCAB,
    intermediate_size=48,
    max_position_embeddings=SEQ,
    initializer_range=0.2,
)


def _shapes(tree):
    return jax.tree.map(np.shape, tree)


@functools.cache
def _setup(dtype="float32", config=CONFIG):
    """(config, the two networks' module, their parameters) with a generator half as wide."""
    config = dataclasses.replace(config, dtype=dtype)
    params = random_init_from_key(rtd_model.init(config, 0.5), 0, std=0.1)
    return config, rtd_model.ReplacedTokenDetection(config, 0.5), params


def test_the_trees_are_the_masked_lm_encoder_a_head_and_a_narrower_generator():
    config, _, params = _setup()
    assert set(params) == {"bert", "discriminator_head", "generator"}
    masked_lm = nn.meta.unbox(jax.eval_shape(lambda: init_masked_lm(config, jax.random.key(0))))
    assert _shapes(params["bert"]) == _shapes(masked_lm["bert"])
    head = _shapes(params["discriminator_head"])
    assert head["dense"] == {"kernel": (32, 32), "bias": (32,)}
    assert head["dense_prediction"] == {"kernel": (32, 1), "bias": (1,)}
    generator = _shapes(params["generator"])
    # One shared token table: the generator has none of its own.
    assert "embeddings" not in generator["bert"]
    assert generator["bert"]["embeddings_project"]["kernel"] == (32, 16)
    assert generator["bert"]["layer_1"]["mlp"]["wi"]["kernel"] == (16, 2, 24)  # 48 * 0.5
    assert generator["bert"]["layer_1"]["attn"]["wqkv"]["kernel"] == (16, 3, 1, 16)
    assert generator["bert"]["head"]["dense"]["kernel"] == (16, 32)
    assert generator["decoder_bias"] == (VOCAB,)
    assert FAMILY.generator(config, 0.5).config.hidden_size == 16

    # Both networks are counted: a wider generator costs more.
    def flops(fraction):
        options = RTD.options({"generator_hidden_fraction": fraction})
        return RTD.flops(FAMILY, config, SEQ, 4, options)

    assert flops(0.5) > flops(0.25) > 0


def test_the_generator_shape_and_what_has_no_transformers_class():
    base = ModernBertConfig()  # ModernBERT-base: 768 wide, 22 layers
    generator = generator_config(base, 0.25)
    assert (generator.hidden_size, generator.num_heads, generator.intermediate_size) == (
        192,
        3,
        288,
    )
    assert (generator.num_layers, generator.global_attn_every_n_layers) == (22, 3)
    assert generator.embedding_size == 768
    assert not FAMILY.transformers_class(generator) and FAMILY.transformers_class(base)
    with pytest.raises(ValueError, match="transformers has no ModernBERT class"):
        generator.to_hf_dict()
    with pytest.raises(ValueError, match="generator_hidden_fraction=0.2 .* even size"):
        generator_config(dataclasses.replace(base, hidden_size=64, num_heads=2), 0.2)


def _documents():
    """Two documents ([CLS] w... [SEP], 7 and 6 tokens) with two masked positions each."""
    rng = np.random.default_rng(1)
    docs = []
    for n in (7, 6):
        ids = rng.integers(5, VOCAB, n).astype(np.int32)
        ids[0], ids[-1] = CLS, SEP
        docs.append(ids)
    return docs, [(1, 4), (2, 3)]


def _batches():
    """The two documents packed into one row, and one per row: the same predictions."""
    docs, masked = _documents()

    def empty(rows):
        return {
            "input_ids": np.zeros((rows, SEQ), np.int32),
            "input_mask": np.zeros((rows, SEQ), np.int32),
            "segment_ids": np.zeros((rows, SEQ), np.int32),
            "document_ids": np.zeros((rows, SEQ), np.int32),
            "positions": np.zeros((rows, SEQ), np.int32),
            "masked_lm_positions": np.zeros((rows, 4), np.int32),
            "masked_lm_ids": np.zeros((rows, 4), np.int32),
            "masked_lm_weights": np.zeros((rows, 4), np.float32),
            "next_sentence_labels": np.zeros(rows, np.int32),
        }

    packed, rows = empty(1), empty(2)
    start, slot = 0, 0
    for d, (ids, positions) in enumerate(zip(docs, masked)):
        for batch, row, offset, first in ((packed, 0, start, slot), (rows, d, 0, 0)):
            span = slice(offset, offset + len(ids))
            batch["input_ids"][row, span] = ids
            batch["input_mask"][row, span] = 1
            batch["document_ids"][row, span] = d + 1
            batch["positions"][row, span] = np.arange(len(ids))
            for k, p in enumerate(positions):
                batch["masked_lm_positions"][row, first + k] = offset + p
                batch["masked_lm_ids"][row, first + k] = ids[p]
                batch["masked_lm_weights"][row, first + k] = 1.0
                batch["input_ids"][row, offset + p] = MASK
        start, slot = start + len(ids), slot + len(positions)
    return jax.tree.map(jnp.asarray, packed), jax.tree.map(jnp.asarray, rows)


@pytest.mark.parametrize("config", [CONFIG, ELECTRA], ids=["modernbert", "electra"])
def test_packed_documents_compute_what_each_document_computes_alone(config, monkeypatch):
    _, model, params = _setup(config=config)
    packed, rows = _batches()

    @jax.jit
    def outputs(batch):
        documents = {"document_ids": batch["document_ids"], "positions": batch["positions"]}
        args = (batch["input_ids"], None, batch["input_mask"])
        generator = model.apply(
            {"params": params},
            *args,
            batch["masked_lm_positions"],
            deterministic=True,
            method="generator_logits",
            **documents,
        )  # [b, p, v]
        discriminator = model.apply(
            {"params": params}, *args, deterministic=True, method="replaced_logits", **documents
        )  # [b, s]
        return generator, discriminator

    (packed_gen, packed_disc), (rows_gen, rows_disc) = outputs(packed), outputs(rows)
    np.testing.assert_allclose(packed_gen[0, :2], rows_gen[0, :2], atol=1e-4)
    np.testing.assert_allclose(packed_gen[0, 2:4], rows_gen[1, :2], atol=1e-4)
    np.testing.assert_allclose(packed_disc[0, :7], rows_disc[0, :7], atol=1e-4)
    np.testing.assert_allclose(packed_disc[0, 7:13], rows_disc[1, :6], atol=1e-4)
    # Without the documents, the packed row's tokens see across them: not the same.
    mixed, _ = outputs({**packed, "document_ids": jnp.ones_like(packed["document_ids"])})
    assert np.abs(mixed[0, 2:4] - rows_gen[1, :2]).max() > 1e-2

    # The step reads the documents: with the same draws (the argmax, in place of Gumbel noise
    # that differs with the batch's shape), the same sums.
    def argmax(logits, key):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    monkeypatch.setattr(objective_lib, "gumbel_sample", argmax)
    step = RtdLoss(model, 50.0)
    sums = jax.jit(lambda b: step.sums(params, b, rng=jax.random.key(0), deterministic=True))
    packed_sums, rows_sums = sums(packed), sums(rows)
    for name in ("generator_loss", "discriminator_loss", "tokens", "replaced", "true_positives"):
        np.testing.assert_allclose(
            getattr(packed_sums, name), getattr(rows_sums, name), rtol=1e-5, err_msg=name
        )


def test_the_loss_is_finite_and_its_gradient_reaches_both_networks():
    _, model, params = _setup()
    _, rows = _batches()
    step = RtdLoss(model, 50.0)
    rng = jax.random.key(3)

    disc, gen = loss_gradients(step, params, rows, rng)

    def moves(tree):
        return any(np.any(np.asarray(leaf) != 0) for leaf in jax.tree.leaves(tree))

    # The loss is generator + 50 * discriminator: between them, every trained group learns.
    for name in ("embeddings_project", "layer_0", "layer_1", "head"):
        assert moves(gen["generator"]["bert"][name]), name
    assert moves(gen["generator"]["decoder_bias"])
    assert moves(disc["discriminator_head"])
    for name in ("embeddings", "layer_0", "layer_1", "final_norm"):
        assert moves(disc["bert"][name]), name
    # The encoder's pooled output (its prediction head), frozen: RTD.frozen.
    assert not moves(disc["bert"]["head"]) and not moves(gen["bert"]["head"])
    # The sample is detached: the discriminator's loss gives the generator nothing, the
    # generator's gives the discriminator's layers nothing; the shared table learns from both.
    assert not moves(disc["generator"])
    assert not moves(gen["discriminator_head"]) and not moves(gen["bert"]["layer_0"])
    assert moves(gen["bert"]["embeddings"]["tok_embeddings"])
    assert moves(disc["bert"]["embeddings"]["tok_embeddings"])


def test_a_bfloat16_step_is_finite():
    _, model, params = _setup("bfloat16")
    _, rows = _batches()
    step = RtdLoss(model, 50.0)
    sums = jax.jit(lambda p: step.sums(p, rows, rng=jax.random.key(2), deterministic=False))(params)
    assert all(np.isfinite(np.asarray(x)).all() for x in sums)
    assert np.isfinite(float(step.loss(sums, step.denominators(rows))))


def test_the_networks_open_apart_and_compute_what_the_run_computed():
    config, model, params = _setup()
    packed, _ = _batches()
    networks = RTD.networks(config, params, {"config": {"generator_hidden_fraction": 0.5}})
    assert set(networks) == {"", "generator"}
    discriminator, generator = networks[""], networks["generator"]
    assert set(discriminator.fresh) == {"mlm_head", "pooler"}
    assert generator.config.hidden_size == 16 and generator.fresh == ()
    # The generator opened alone reads the one table the run shares.
    assert generator.params["bert"]["embeddings"] is params["bert"]["embeddings"]
    args = (packed["input_ids"], None, packed["input_mask"], packed["masked_lm_positions"])

    @jax.jit
    def outputs(params, generator, discriminator):
        alone = MaskedLM(generator_config).apply({"params": generator}, *args).mlm_logits
        together = model.apply(
            {"params": params}, *args, deterministic=True, method="generator_logits"
        )
        scores = rtd_model.Discriminator(config).apply(
            {"params": discriminator}, *args[:3], method="replaced_logits"
        )
        run = model.apply({"params": params}, *args[:3], method="replaced_logits")
        return alone, together, scores, run

    generator_config = generator.config
    alone, together, scores, run = outputs(params, generator.params, discriminator.params)
    np.testing.assert_allclose(alone, together, atol=1e-5)
    np.testing.assert_allclose(scores, run, atol=1e-5)


def test_the_objective_takes_modernbert_and_freezes_the_unused_head():
    config = modernbert_tiny.get_config()
    config.objective = "rtd"
    settings = PretrainSettings.from_config(config)
    assert settings.optimizer.frozen == ("bert/head",)
    assert settings.data.masking.random_token_prob == 0.0
