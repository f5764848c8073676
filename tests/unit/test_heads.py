"""Fine-tuning heads: exact outputs on a tiny model, exact losses on hand-made inputs."""

import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import capability, encoders
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertModel
from bertjax.nn import heads, sharding
from bertjax.tasks.embed import task as embed_task
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.embed.objective import LossSettings
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq.options import TaskOptions
from bertjax.text.tokenizer import WordPieceTokenizer

CONFIG = BertConfig(
    vocab_size=40,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)
IDS = jnp.array([[2, 7, 9, 3, 0, 0], [2, 11, 3, 12, 13, 3]], jnp.int32)  # [b=2, s=6]
SEGMENTS = jnp.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]], jnp.int32)
MASK = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)


def _init(module):
    # Jitted: run op by op, a BERT compiles each of its many small operations separately.
    init = jax.jit(lambda rng: heads.init_params(module, rng, seq_len=IDS.shape[1]))
    return nn.meta.unbox(init(jax.random.key(0)))


def _apply(module, params, **kwargs):
    return jax.jit(lambda p: module.apply({"params": p}, IDS, SEGMENTS, MASK, **kwargs))(params)


def _encoder(params):
    return _apply(BertModel(CONFIG), params["bert"])


@pytest.fixture(scope="module")
def sequence_model():
    model = label_heads.SequenceClassifier(CONFIG, 3)
    return model, _init(model)


def test_sequence_classifier_is_a_dense_layer_on_the_pooled_output(sequence_model):
    model, params = sequence_model
    assert set(params) == {"bert", "classifier"}
    kernel, bias = params["classifier"]["kernel"], params["classifier"]["bias"]
    assert kernel.shape == (16, 3) and bias.shape == (3,)
    params = {**params, "classifier": {"kernel": kernel, "bias": jnp.array([0.5, -1.0, 2.0])}}
    logits = _apply(model, params)
    _, pooled = _encoder(params)
    expected = np.asarray(pooled) @ np.asarray(kernel) + np.array([0.5, -1.0, 2.0])
    assert logits.shape == (2, 3) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)


def test_token_classifier_labels_every_position_of_the_sequence_output():
    model = label_heads.TokenClassifier(CONFIG, 5)
    params = _init(model)
    logits = _apply(model, params)
    sequence, _ = _encoder(params)
    kernel = np.asarray(params["classifier"]["kernel"])
    assert logits.shape == (2, 6, 5)
    np.testing.assert_allclose(logits, np.asarray(sequence) @ kernel, rtol=1e-5, atol=1e-6)


def test_dropout_before_the_classifier_acts_only_in_training(sequence_model):
    model, params = sequence_model
    train = jax.jit(
        lambda p, rng: model.apply(
            {"params": p}, IDS, SEGMENTS, MASK, deterministic=False, rngs={"dropout": rng}
        )
    )
    assert not np.allclose(train(params, jax.random.key(1)), _apply(model, params))
    np.testing.assert_array_equal(
        train(params, jax.random.key(1)), train(params, jax.random.key(1))
    )


def test_the_classifier_kernel_is_named_for_sharding():
    model = label_heads.SequenceClassifier(CONFIG, 3)
    boxed = jax.eval_shape(lambda: heads.init_params(model, jax.random.key(0)))
    assert boxed["classifier"]["kernel"].names == (sharding.EMBED, sharding.LABELS)
    assert sharding.logical_to_spec((sharding.LABELS,)) == jax.sharding.PartitionSpec(None)


def test_the_initial_classifier_is_truncated_normal_at_the_initializer_range():
    dense = encoders.family_of(CONFIG).head(CONFIG, heads.CLASSIFIER, 64, capability.POOLED).module
    variables = nn.meta.unbox(dense.init(jax.random.key(0), jnp.zeros((1, 16))))["params"]
    kernel = np.asarray(variables["kernel"])  # [16, 64]
    assert np.all(np.abs(kernel) <= 2 * CONFIG.initializer_range + 1e-7)
    assert 0.8 * 0.02 < kernel.std() < 0.95 * 0.02  # a normal cut at 2 sigma: 0.88 sigma
    np.testing.assert_array_equal(variables["bias"], 0.0)


def test_classification_loss_is_cross_entropy_summed_over_weighted_rows():
    logits = jnp.array([[0.0, math.log(3.0)], [2.0, 0.0], [5.0, -5.0]])
    sums = label_heads.classification_sums(logits, jnp.array([1, 1, 0]), jnp.array([1.0, 1.0, 0.0]))
    # Row 0: p(1) = 3/4; row 1: p(1) = 1 / (1 + e^2); row 2 has weight 0.
    expected = -math.log(0.75) + math.log(1 + math.exp(2.0))
    assert float(sums.loss) == pytest.approx(expected, rel=1e-6)
    assert float(sums.correct) == 1.0 and float(sums.count) == 2.0


def test_regression_loss_is_the_summed_squared_error():
    sums = label_heads.regression_sums(
        jnp.array([[1.5], [0.0], [9.0]]), jnp.array([1.0, 2.0, 0.0]), jnp.array([1.0, 1.0, 0.0])
    )
    assert float(sums.loss) == pytest.approx(0.25 + 4.0)
    assert float(sums.count) == 2.0


def test_token_loss_ignores_unlabelled_positions():
    logits = jnp.zeros((1, 4, 3)).at[0, 1, 2].set(math.log(2.0))  # position 1: p = 2/4, 1/4...
    labels = jnp.array([[label_heads.IGNORE_LABEL, 2, 0, label_heads.IGNORE_LABEL]])
    sums = label_heads.token_classification_sums(logits, labels, jnp.ones(1))
    expected = -math.log(0.5) - math.log(1 / 3)
    assert float(sums.loss) == pytest.approx(expected, rel=1e-6)
    assert float(sums.correct) == 2.0  # position 2 ties: argmax takes label 0, which is right
    assert float(sums.count) == 2.0
    batch = {"labels": labels, "weights": jnp.ones(1)}
    assert float(label_heads.denominator(label_heads.TOKEN_CLASSIFICATION, batch, 3)) == 2.0


def test_token_loss_drops_rows_weighted_zero():
    # An evaluation batch's last rows repeat an example to fill the batch, weighted 0.
    logits = jnp.zeros((2, 3, 2)).at[:, 1, 1].set(1.0)
    labels = jnp.array([[label_heads.IGNORE_LABEL, 1, 0], [label_heads.IGNORE_LABEL, 1, 0]])
    one = label_heads.token_classification_sums(logits[:1], labels[:1], jnp.ones(1))
    padded = label_heads.token_classification_sums(logits, labels, jnp.array([1.0, 0.0]))
    assert [float(x) for x in padded] == [float(x) for x in one]
    batch = {"labels": labels, "weights": jnp.array([1.0, 0.0])}
    assert float(label_heads.denominator(label_heads.TOKEN_CLASSIFICATION, batch, 2)) == 2.0


@pytest.mark.parametrize(
    "task", [label_heads.CLASSIFICATION, label_heads.REGRESSION, label_heads.MULTI_LABEL]
)
def test_denominators_equal_the_counts_of_the_sums(task):
    weights = jnp.array([1.0, 1.0, 0.0])
    labels = {
        label_heads.CLASSIFICATION: jnp.array([0, 1, 0]),
        label_heads.REGRESSION: jnp.array([0.5, 1.0, 0.0]),
        label_heads.MULTI_LABEL: jnp.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]),
    }[task]
    logits = jnp.ones((3, 1 if task == label_heads.REGRESSION else 2))
    batch = {"labels": labels, "weights": weights}
    sums = label_heads.head_sums(task, logits, batch)
    assert float(label_heads.denominator(task, batch, logits.shape[-1])) == float(sums.count)


def test_outputs_are_probabilities_values_or_labels():
    logits = jnp.array([[0.0, math.log(3.0)]])
    np.testing.assert_allclose(
        label_heads.outputs(label_heads.CLASSIFICATION, logits)["probabilities"],
        [[0.25, 0.75]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        label_heads.outputs(label_heads.MULTI_LABEL, logits)["probabilities"],
        [[0.5, 0.75]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(label_heads.outputs(label_heads.REGRESSION, logits)["values"], [0.0])
    token = label_heads.outputs(label_heads.TOKEN_CLASSIFICATION, logits[None])  # [1, 1, 2]
    assert token["labels"].tolist() == [[1]]
    np.testing.assert_allclose(token["scores"], [[0.75]], rtol=1e-6)


@pytest.mark.parametrize(
    "task, labels, message",
    [
        ("ner", ("O",), "must be one of"),
        (label_heads.CLASSIFICATION, ("yes",), "at least 2 labels"),
        (label_heads.REGRESSION, ("a", "b"), "one output"),
        (label_heads.CLASSIFICATION, ("a", "a"), "appears twice"),
    ],
)
def test_impossible_heads_are_refused(task, labels, message):
    with pytest.raises(ValueError, match=message):
        HeadSpec(task, labels)


def test_head_spec_round_trips_through_meta():
    spec = HeadSpec(label_heads.MULTI_LABEL, ("sports", "politics"))
    assert HeadSpec.from_dict(spec.to_dict()) == spec
    assert spec.num_outputs == 2 and not spec.token_level


def test_words_are_labelled_at_their_first_sub_word_and_cut_at_the_length(tmp_path):
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "lives", "in", "new", "york"]
    pieces += ["##shire", "hamp", "##ton"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(pieces) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(vocab)
    sentences = [["John", "lives", "in", "Hampton"], ["York", "Yorkshire", "in", "John"]]
    inputs = label_heads.encode_words(tokenizer, sentences, max_seq_length=6)
    # [CLS] john lives in hamp ##ton [SEP] needs 7 slots: the last word keeps its first piece.
    assert inputs.input_ids[0].tolist() == [2, 5, 6, 7, 11, 3]
    assert inputs.word_positions[0].tolist() == [1, 2, 3, 4]
    # [CLS] york york ##shire in [SEP]: "John" does not fit.
    assert inputs.input_ids[1].tolist() == [2, 9, 9, 10, 7, 3]
    assert inputs.word_positions[1].tolist() == [1, 2, 4, -1]
    assert inputs.words_cut == 1
    assert inputs.input_mask.sum() == 12 and not inputs.segment_ids.any()


# Heads as checkpoints written before options were typed recorded them: options inside the
# labels as name=value strings. Such checkpoints still open, with typed options.
LEGACY_EMBEDDING = {
    "task": "embedding",
    "labels": [
        "pooling=max",
        "normalize=True",
        "max_seq_length=24",
        "loss=in_batch_negatives",
        "scale=20.0",
        "symmetric=True",
        "score_max=1.0",
    ],
}
LEGACY_SEQ2SEQ = {
    "task": "seq2seq",
    "labels": [
        "init=bertshare",
        "decoder_start_id=2",
        "eos_id=3",
        "label_smoothing=0.1",
        "max_target_length=16",
        "num_beams=4",
        "max_new_tokens=12",
        "length_penalty=1.0",
        "no_repeat_ngram_size=0",
    ],
}


def test_heads_with_options_in_their_labels_still_open():
    embedding = HeadSpec.from_dict(LEGACY_EMBEDDING)
    assert embedding.labels == ()
    assert embedding.options == embed_task.EmbeddingOptions(
        EmbeddingSpec("max", True, 24), LossSettings(symmetric=True)
    )
    seq2seq = HeadSpec.from_dict(LEGACY_SEQ2SEQ)
    assert seq2seq.options == TaskOptions(
        decoder_start_id=2,
        eos_id=3,
        init="bertshare",
        label_smoothing=0.1,
        max_target_length=16,
        generation=decoding.GenerationSettings(max_new_tokens=12, num_beams=4),
    )
    # Written again, they take the typed form, which reads back the same.
    for head in (embedding, seq2seq):
        stored = json.loads(json.dumps(head.to_dict()))
        assert "options" in stored and HeadSpec.from_dict(stored) == head


def test_a_head_names_a_registered_task_and_suits_it():
    with pytest.raises(ValueError, match=r"task='nope' is invalid: must be one of \('classif"):
        HeadSpec("nope", ("a", "b"))
    with pytest.raises(ValueError, match=r"question_answering head has the labels"):
        HeadSpec("question_answering", ("a", "b"))
    with pytest.raises(ValueError, match="embedding head has no labels and EmbeddingOptions"):
        HeadSpec("embedding", ("pooling=mean",))
