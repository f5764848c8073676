"""The BERT encoder-decoder: model, loss, cached greedy/beam generation (its transformers
parity: tests/parity/test_seq2seq_parity.py)."""

import dataclasses
import functools
import math
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.nn import sharding
from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq import metrics as text_metrics
from bertjax.tasks.seq2seq import model as s2s
from tests.helpers.params import random_init
from tests.helpers.seq2seq import (  # noqa: F401
    _TABLE,
    BERT,
    CONFIG,
    EOS,
    START,
    VOCAB,
    A,
    B,
    _logits,
    logits_of,
    random_params,
    sources,
)

# ------------------------------------------------------------------------------ config, init


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="init='bert3bert'"):
        s2s.Seq2SeqConfig(BERT, START, EOS, init="bert3bert")
    with pytest.raises(ValueError, match="eos_id=40"):
        s2s.Seq2SeqConfig(BERT, START, VOCAB)
    with pytest.raises(ValueError, match="num_beams=0"):
        decoding.GenerationSettings(num_beams=0)
    with pytest.raises(ValueError, match="early_stopping='sometimes'"):
        decoding.GenerationSettings(early_stopping="sometimes")
    assert s2s.Seq2SeqConfig.from_dict(CONFIG.to_dict()) == CONFIG


@functools.cache
def pretrained():
    """A BertForPreTraining params tree with the encoder-decoder's architecture."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return random_init(lambda: BertForPreTraining(BERT).init(jax.random.key(7), ids)["params"], 7)


def _init(config, pretrained):
    """s2s.init_params from `pretrained`, compiled as one program."""
    return jax.jit(lambda key, p: s2s.init_params(config, key, p))(jax.random.key(0), pretrained)


def test_every_parameter_has_logical_axes():
    boxed = jax.eval_shape(lambda: s2s.init_params(CONFIG, jax.random.key(0)))
    leaves = jax.tree.leaves(boxed, is_leaf=sharding.is_box)
    assert leaves and all(sharding.is_box(leaf) for leaf in leaves)
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim
    decoder_layer = boxed["decoder"]["layer_0"]
    assert set(decoder_layer) == {"attention", "cross_attention", "mlp"}
    assert decoder_layer["cross_attention"]["key"]["kernel"].names == ("embed", "heads", "kv")


def test_bert2bert_copies_the_checkpoint_and_starts_cross_attention_fresh():
    config = dataclasses.replace(CONFIG, init=s2s.BERT2BERT)
    params = nn.meta.unbox(_init(config, pretrained()))
    bert = pretrained()["bert"]
    layer = bert["encoder"]["layer_1"]
    np.testing.assert_array_equal(
        params["bert"]["encoder"]["layer_1"]["mlp"]["output"]["kernel"],
        layer["mlp"]["output"]["kernel"],
    )
    decoder = params["decoder"]
    np.testing.assert_array_equal(
        decoder["layer_1"]["attention"]["query"]["kernel"], layer["attention"]["query"]["kernel"]
    )
    np.testing.assert_array_equal(
        decoder["embeddings"]["word_embeddings"]["embedding"],
        bert["embeddings"]["word_embeddings"]["embedding"],
    )
    np.testing.assert_array_equal(
        decoder["mlm_head"]["transform"]["kernel"], pretrained()["mlm_head"]["transform"]["kernel"]
    )
    cross = decoder["layer_1"]["cross_attention"]
    assert not np.allclose(cross["query"]["kernel"], layer["attention"]["query"]["kernel"])
    # google's init: truncated normal 0.02 (within 2 stddev), zero bias, LayerNorm ones.
    assert np.abs(cross["query"]["kernel"]).max() <= 2 * BERT.initializer_range + 1e-6
    assert 0.01 < np.std(cross["query"]["kernel"]) < 0.02
    np.testing.assert_array_equal(cross["query"]["bias"], 0.0)
    np.testing.assert_array_equal(cross["layer_norm"]["scale"], 1.0)
    with pytest.raises(ValueError, match="needs pretrained BERT params"):
        s2s.init_params(config, jax.random.key(0))


def test_bert2rnd_keeps_the_encoder_and_draws_the_decoder():
    config = dataclasses.replace(CONFIG, init=s2s.BERT2RND)
    params = nn.meta.unbox(_init(config, pretrained()))
    bert = pretrained()["bert"]
    np.testing.assert_array_equal(
        params["bert"]["embeddings"]["word_embeddings"]["embedding"],
        bert["embeddings"]["word_embeddings"]["embedding"],
    )
    assert not np.allclose(
        params["decoder"]["embeddings"]["word_embeddings"]["embedding"],
        bert["embeddings"]["word_embeddings"]["embedding"],
    )


def test_bertshare_stores_one_set_of_weights_and_trains_it_from_both_sides():
    config = dataclasses.replace(CONFIG, init=s2s.BERTSHARE)
    params = nn.meta.unbox(_init(config, pretrained()))
    assert "embeddings" not in params["decoder"]
    assert set(params["decoder"]["layer_0"]) == {"cross_attention"}
    full = s2s.full_params(config, params)
    assert full["decoder"]["layer_0"]["mlp"] is full["bert"]["encoder"]["layer_0"]["mlp"]
    assert s2s.stored_params(config, full).keys() == params.keys()

    ids, mask = sources(0)
    features = s2s.target_features([[5, 6, 7]] * 4, 6, START, EOS)
    batch = dict(input_ids=ids, input_mask=mask, **features)

    def loss(p):
        sums = s2s.batch_loss_sums(config, p, batch)
        return sums.loss / sums.count

    grads = jax.jit(jax.grad(loss))(params)
    # The shared feed-forward's gradient is the sum of its encoder and decoder uses: the
    # same loss through an untied copy splits it in two parts that add up to it.
    untied = dataclasses.replace(config, init=s2s.BERT2BERT)
    untied_grads = jax.jit(jax.grad(lambda p: loss_untied(untied, p, batch)))(
        jax.tree.map(jnp.asarray, s2s.full_params(config, params))
    )
    path = ("layer_0", "mlp", "intermediate", "kernel")
    encoder_part = untied_grads["bert"]["encoder"][path[0]][path[1]][path[2]][path[3]]
    decoder_part = untied_grads["decoder"][path[0]][path[1]][path[2]][path[3]]
    shared = grads["bert"]["encoder"][path[0]][path[1]][path[2]][path[3]]
    assert np.abs(decoder_part).max() > 0
    np.testing.assert_allclose(shared, encoder_part + decoder_part, rtol=1e-4, atol=1e-7)


def loss_untied(config, params, batch):
    sums = s2s.batch_loss_sums(config, params, batch)
    return sums.loss / sums.count


# ------------------------------------------------------------------------------ model, loss


def test_decoder_self_attention_is_causal():
    params = random_params()
    ids, mask = sources(1)
    decoder_ids = np.array(sources(2)[0][:, :6])
    base = logits_of(params, ids, mask, decoder_ids)
    changed = decoder_ids.copy()
    changed[:, 3] = (changed[:, 3] + 7) % (VOCAB - 4) + 4
    after = logits_of(params, ids, mask, changed)
    np.testing.assert_allclose(after[:, :3], base[:, :3], atol=1e-6)
    assert np.abs(after[:, 3:] - base[:, 3:]).max() > 1e-3
    # Padding in the source is invisible to the decoder.
    padded_ids = np.where(mask > 0, ids, 0)
    noisy = np.where(mask > 0, ids, 11)
    np.testing.assert_allclose(
        logits_of(params, noisy, mask, decoder_ids),
        logits_of(params, padded_ids, mask, decoder_ids),
        atol=1e-5,
    )


def test_cached_decoding_step_by_step_equals_the_whole_prefix():
    params = random_params()
    ids, mask = sources(3)
    decoder_ids = np.array(sources(4)[0][:, :7])
    full = logits_of(params, ids, mask, decoder_ids)  # [b, s, v]
    model = s2s.Seq2SeqModel(CONFIG)
    variables = {"params": params}
    encoded = model.apply(variables, ids, None, mask, method=s2s.Seq2SeqModel.encode)
    cross = model.apply(variables, encoded, method=s2s.Seq2SeqModel.cross_keys_values)
    cache = decoding._empty_cache(BERT, ids.shape[0], 10)
    decode = jax.jit(
        lambda c, token, i: model.apply(
            variables, token, cross, mask, cache=c, start=i, method=s2s.Seq2SeqModel.decode
        )
    )
    for i in range(decoder_ids.shape[1]):
        logits, cache = decode(cache, decoder_ids[:, i : i + 1], jnp.int32(i))
        np.testing.assert_allclose(np.asarray(logits[:, 0]), full[:, i], atol=2e-5)


def test_shift_right_and_target_features():
    features = s2s.target_features([[5, 6, 7], [8], [9, 10, 11, 12, 13]], 4, START, EOS)
    np.testing.assert_array_equal(
        features["target_ids"], [[5, 6, 7, EOS], [8, EOS, 0, 0], [9, 10, 11, EOS]]
    )
    np.testing.assert_array_equal(features["target_mask"], [[1, 1, 1, 1], [1, 1, 0, 0], [1] * 4])
    np.testing.assert_array_equal(
        features["decoder_input_ids"], [[START, 5, 6, 7], [START, 8, EOS, 0], [START, 9, 10, 11]]
    )


def test_loss_sums_exact_with_label_smoothing_and_padding_ignored():
    logits = jnp.array([[[2.0, 0.0, 0.0, 1.0], [0.0, 3.0, 0.0, 0.0], [9.0, -9.0, 4.0, 0.0]]])
    targets = jnp.array([[0, 2, 3]])
    mask = jnp.array([[1, 1, 0]])
    log_p = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
    sums = s2s.loss_sums(logits, targets, mask)
    np.testing.assert_allclose(sums.loss, -(log_p[0, 0] + log_p[1, 2]), rtol=1e-6)
    assert float(sums.correct) == 1.0 and float(sums.count) == 2.0
    smoothed = s2s.loss_sums(logits, targets, mask, label_smoothing=0.1)
    expected = sum(0.9 * -log_p[i, t] + 0.1 * -log_p[i].mean() for i, t in ((0, 0), (1, 2)))
    np.testing.assert_allclose(smoothed.loss, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="label_smoothing=1.0"):
        s2s.loss_sums(logits, targets, mask, label_smoothing=1.0)


def test_sharded_logits_equal_unsharded():
    params = random_params()
    ids, mask = sources(5, n=8)
    decoder_ids = np.array(sources(6, n=8)[0][:, :6])
    expected = logits_of(params, ids, mask, decoder_ids)
    mesh = sharding.make_mesh((2, 2, 2))
    boxed = jax.eval_shape(lambda: s2s.init_params(CONFIG, jax.random.key(0)))
    shardings = sharding.logical_shardings(boxed, mesh)
    placed = jax.device_put(params, shardings)
    with jax.set_mesh(mesh):
        got = jax.jit(lambda p: _logits(p, ids, mask, decoder_ids, CONFIG))(placed)
    np.testing.assert_allclose(np.asarray(got), expected, atol=2e-5)


# ------------------------------------------------------------------------------ search rules

TOY = s2s.Seq2SeqConfig(dataclasses.replace(BERT, vocab_size=6), START, EOS)


def toy_step(sequences, cache, length):
    last = jax.lax.dynamic_index_in_dim(sequences, length - 1, axis=1, keepdims=False)
    return jnp.log(jnp.asarray(_TABLE))[last], cache


def test_greedy_and_beam_search_on_a_hand_checked_case():
    settings = decoding.GenerationSettings(max_new_tokens=4)
    tokens, score = jax.jit(lambda: decoding._greedy(TOY, settings, toy_step, None, 1))()
    np.testing.assert_array_equal(tokens, [[A, EOS, 0, 0]])
    np.testing.assert_allclose(score, [math.log(0.5 * 0.4)], rtol=1e-5)

    beam = dataclasses.replace(settings, num_beams=2)
    tokens, score = jax.jit(lambda: decoding._beam_search(TOY, beam, toy_step, None, 1))()
    np.testing.assert_array_equal(tokens[:, :2], [[B, EOS]])
    # length_penalty 1: the summed log-probability over the 2 generated tokens.
    np.testing.assert_allclose(score, [math.log(0.36) / 2], rtol=1e-5)

    # A strongly negative length penalty (shorter is better) makes [SEP] at once win:
    # log 0.1 / 1 = -2.30 against log 0.36 / 2 ** -3 = -8.2.
    # Only the best num_beams candidates may finish (transformers' rule): with 2 beams [SEP]
    # at once (third best) never can, with 3 it does.
    short = dataclasses.replace(beam, num_beams=3, length_penalty=-3.0)
    tokens, score = jax.jit(lambda: decoding._beam_search(TOY, short, toy_step, None, 1))()
    np.testing.assert_array_equal(tokens[:, :1], [[EOS]])
    np.testing.assert_allclose(score, [math.log(0.1)], rtol=1e-5)


def test_ids_past_the_usable_vocabulary_are_never_generated():
    # b (5) is the toy's second choice after [CLS]; with the vocabulary cut below it greedy
    # and beam search both read a, whose best next token is [SEP].
    settings = decoding.GenerationSettings(max_new_tokens=4, usable_vocab=B)
    tokens, _ = jax.jit(lambda: decoding._greedy(TOY, settings, toy_step, None, 1))()
    np.testing.assert_array_equal(tokens, [[A, EOS, 0, 0]])
    beam = dataclasses.replace(settings, num_beams=2)
    tokens, _ = jax.jit(lambda: decoding._beam_search(TOY, beam, toy_step, None, 1))()
    np.testing.assert_array_equal(tokens[:, :2], [[A, EOS]])
    assert (np.asarray(tokens) < B).all()


def test_banned_tokens_match_no_repeat_ngram_rule():
    sequences = jnp.array([[START, 4, 5, 4, 0, 0], [START, 4, 4, 4, 0, 0]])
    banned = np.asarray(decoding.banned_tokens(sequences, jnp.int32(4), 2, 8))
    # Row 0 ends with 4 and "4 5" occurred: 5 is banned. Row 1: "4 4" occurred: 4 banned.
    assert np.flatnonzero(banned[0]).tolist() == [5]
    assert np.flatnonzero(banned[1]).tolist() == [4]
    banned3 = np.asarray(decoding.banned_tokens(sequences, jnp.int32(4), 3, 8))
    assert np.flatnonzero(banned3[0]).tolist() == []  # no earlier trigram starts "5 4"
    assert np.flatnonzero(banned3[1]).tolist() == [4]


# ------------------------------------------------------------------------------ metrics


def test_bleu_and_rouge_from_the_reference_libraries():
    refs = ["the cat sat on the mat", "a dog ran in the park today"]
    assert text_metrics.corpus_bleu(refs, refs) == pytest.approx(100.0)
    partial = ["the cat sat on a mat", "a dog ran in the park today"]
    bleu = text_metrics.corpus_bleu(partial, refs)
    assert 40.0 < bleu < 100.0
    scores = text_metrics.rouge(["the cats sat", "dogs ran"], ["the cat sat", "a dog ran fast"])
    # Stemming makes cats = cat; row 2: unigrams {dog, ran} of 2 predicted / 4 reference.
    assert scores["rouge1"] == pytest.approx((1.0 + 2 * (1.0 * 0.5) / 1.5) / 2)
    assert text_metrics.score("rougeL", refs, refs) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="metric='meteor'"):
        text_metrics.score("meteor", refs, refs)


def test_scoring_without_the_seq2seq_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "rouge_score.rouge_scorer", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'bertjax\[seq2seq\]'"):
        text_metrics.rouge(["a"], ["a"])


# ------------------------------------------------------------------------------ slow: trained
