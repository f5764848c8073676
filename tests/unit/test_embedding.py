"""Sentence embeddings: pooling, losses (exact values; sharded and cached gradients equal the
direct ones), search and evaluation (hand-computed values), sentence-transformers both ways."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine import steps
from bertjax.inference import TruncationWarning, vectors
from bertjax.nn import sharding
from bertjax.tasks.embed import hf as sbert
from bertjax.tasks.embed import metrics as embedding_eval
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed import objective as training
from bertjax.tasks.embed.model import EmbeddingSpec
from tests.helpers.embedding import (
    CONFIG,
    SHALLOW,
    TEXTS,
    TOL,
    embed_texts,
    max_difference,
    pair_batch,
    random_params,
    wordpiece,  # noqa: F401 (fixtures)
)

# ----------------------------------------------------------------------------- pooling


def test_pooling_hand_values():
    sequence = jnp.asarray(
        [[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]], [[5.0, 6.0], [0.0, 0.0], [0.0, 0.0]]]
    )  # [2, 3, 2]
    mask = jnp.asarray([[1, 1, 0], [1, 0, 0]])
    np.testing.assert_allclose(embedding.pool(sequence, mask, "mean"), [[2.0, -1.0], [5.0, 6.0]])
    np.testing.assert_allclose(embedding.pool(sequence, mask, "max"), [[3.0, 2.0], [5.0, 6.0]])
    np.testing.assert_allclose(embedding.pool(sequence, mask, "cls"), [[1.0, 2.0], [5.0, 6.0]])
    empty = jnp.zeros((1, 3), jnp.int32)
    for pooling in ("mean", "max"):  # a row that only pads a batch pools to zeros
        np.testing.assert_array_equal(embedding.pool(sequence[:1], empty, pooling), [[0.0, 0.0]])
    np.testing.assert_allclose(
        vectors.l2_normalize(jnp.asarray([[3.0, 4.0], [0.0, 0.0]])), [[0.6, 0.8], [0.0, 0.0]]
    )


def test_spec_and_settings_refuse_bad_values():
    with pytest.raises(ValueError, match=r"EmbeddingSpec.pooling='pooler' is invalid"):
        EmbeddingSpec(pooling="pooler")
    with pytest.raises(ValueError, match=r"max_seq_length=1 is invalid"):
        EmbeddingSpec(max_seq_length=1)
    with pytest.raises(ValueError, match=r"at most its max_position_embeddings=40"):
        EmbeddingSpec(max_seq_length=64).check(CONFIG)
    with pytest.raises(ValueError, match=r"LossSettings.loss='triplet' is invalid"):
        training.LossSettings(loss="triplet")
    with pytest.raises(ValueError, match=r"LossSettings.scale=0 is invalid"):
        training.LossSettings(scale=0)
    with pytest.raises(ValueError, match=r"symmetric=True applies to loss='in_batch_negatives'"):
        training.LossSettings(loss="cosine_regression", symmetric=True)
    assert EmbeddingSpec.from_dict(EmbeddingSpec("max", True, 64).to_dict()) == EmbeddingSpec(
        "max", True, 64
    )


def test_bi_encoder_pools_as_model_embed(wordpiece):
    """Training and Model.embed pool identically: same vectors for mean and [CLS]."""
    params = random_params(1)
    model = bertjax.Model(CONFIG, params, wordpiece)
    texts = [t for t in TEXTS if t][:3]
    for pooling in ("mean", "cls"):
        spec = EmbeddingSpec(pooling, normalize=True, max_seq_length=40)
        ours = embed_texts(CONFIG, params, wordpiece, spec, texts)
        with pytest.warns(TruncationWarning):  # both cut the long text at 40 tokens
            reference = model.embed(texts, pooling=pooling, normalize=True)
        np.testing.assert_allclose(ours, reference, atol=TOL)


# ----------------------------------------------------------------------------- losses


def _reference_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return log_sum - logits[np.arange(len(labels)), labels]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_in_batch_negatives_hand_computed():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(4, 3, 5)).astype(np.float32)  # [b, (anchor, pos, neg), h]
    a, p, n = (_unit(vectors[:, k].astype(np.float64)) for k in range(3))
    labels = np.arange(4)

    # Anchors against every positive: MultipleNegativesRankingLoss without hard negatives.
    plain = _reference_cross_entropy(20 * a @ p.T, labels).mean()
    sums = training.in_batch_negatives_sums(jnp.asarray(vectors[:, :2]), jnp.ones(4))
    np.testing.assert_allclose(sums.loss / sums.count, plain, rtol=TOL)
    assert float(sums.count) == 4

    # With hard negatives: every positive, then every negative, as candidates; scale 7.
    hard = _reference_cross_entropy(7 * a @ np.concatenate([p, n]).T, labels).mean()
    sums = training.in_batch_negatives_sums(jnp.asarray(vectors), jnp.ones(4), scale=7.0)
    np.testing.assert_allclose(sums.loss / sums.count, hard, rtol=TOL)

    # Symmetric: the mean of anchors -> positives and positives -> anchors.
    backward = _reference_cross_entropy(7 * p @ a.T, labels).mean()
    sums = training.in_batch_negatives_sums(
        jnp.asarray(vectors), jnp.ones(4), scale=7.0, symmetric=True
    )
    np.testing.assert_allclose(sums.loss / sums.count, (hard + backward) / 2, rtol=TOL)

    # A row of weight 0 is neither an anchor nor anyone's candidate: as if it were not there.
    sums = training.in_batch_negatives_sums(jnp.asarray(vectors), jnp.asarray([1.0, 1, 1, 0]))
    alone = training.in_batch_negatives_sums(jnp.asarray(vectors[:3]), jnp.ones(3))
    np.testing.assert_allclose(sums.loss / sums.count, alone.loss / alone.count, rtol=TOL)
    assert float(sums.count) == 3


def test_cosine_regression_hand_computed():
    vectors = jnp.asarray(
        [[[1.0, 0.0], [1.0, 1.0]], [[0.0, 2.0], [0.0, 3.0]], [[1.0, 0.0], [-1.0, 0.0]]]
    )  # cosines: 1/sqrt(2), 1, -1
    scores = jnp.asarray([2.5, 5.0, 0.0])  # STS-B scale: 0.5, 1, 0
    sums = training.cosine_regression_sums(vectors, scores, jnp.asarray([1.0, 1.0, 0.0]), 5.0)
    expected = (1 / math.sqrt(2) - 0.5) ** 2 + 0.0  # the third row has weight 0
    np.testing.assert_allclose(float(sums.loss), expected, rtol=TOL)
    assert float(sums.count) == 2


def _loss_and_grads(objective):
    def loss(params, batch):
        sums = objective.sums(params, batch, rng=None, deterministic=True)
        return objective.loss(sums, objective.denominators(batch))

    return jax.value_and_grad(loss)


def test_sharded_loss_and_gradients_equal_single_device():
    """Negatives gathered across 8 devices (explicitly, and by the compiler): the loss and
    every gradient equal one device's on the same global batch."""
    model = embedding.BiEncoder(SHALLOW)
    settings = training.LossSettings(scale=20.0, symmetric=True)
    params = random_params(2, SHALLOW)
    batch = pair_batch(3, rows=16, texts=3, seq=8)
    single_loss, single_grads = jax.jit(
        _loss_and_grads(training.EmbeddingObjective(model, settings))
    )(params, batch)

    mesh = sharding.make_mesh((4, 2, 1))  # the batch over data x fsdp: 2 rows per device
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    with jax.set_mesh(mesh):
        for objective_mesh in (mesh, None):  # shard_map + all_gather, or the compiler's
            objective = training.EmbeddingObjective(model, settings, objective_mesh)
            run = jax.jit(
                _loss_and_grads(objective),
                in_shardings=(replicated, sharding.batch_sharding(mesh)),
            )
            loss, grads = run(params, batch)
            np.testing.assert_allclose(float(loss), float(single_loss), atol=TOL)
            assert max_difference(jax.tree.leaves(grads), jax.tree.leaves(single_grads)) < TOL
    assert float(single_loss) > 0


def test_cached_gradients_equal_direct_ones():
    """GradCache (embed in chunks without gradients, backprop chunk by chunk) gives the
    gradients of the whole-batch loss, dropout included (each chunk keeps its key)."""
    config = BertConfig(**{**SHALLOW.to_dict(), "hidden_dropout": 0.1, "attention_dropout": 0.1})
    model = embedding.BiEncoder(config)
    objective = training.EmbeddingObjective(model, training.LossSettings(symmetric=True))
    params = random_params(4, config)
    batch = pair_batch(5, rows=8, texts=3, seq=8, padded_rows=0)
    rng = jax.random.key(6)
    chunks = 2

    def direct(params):
        micro = jax.tree.map(lambda x: steps.split_micro_batches(x, chunks), batch)
        vectors = [
            objective.embeddings(
                params,
                jax.tree.map(lambda x, k=k: x[k], micro),
                rng=jax.random.fold_in(rng, k),
                deterministic=False,
            )
            for k in range(chunks)
        ]  # chunks x [b / chunks, t, h]
        everything = training._merge_chunks(jnp.stack(vectors))  # [b, t, h]
        sums = objective.sums_of(everything, batch)
        return objective.loss(sums, objective.denominators(batch))

    loss, expected = jax.jit(jax.value_and_grad(direct))(params)
    grads, sums = jax.jit(lambda p: training.cached_gradients(objective, p, batch, rng, chunks))(
        params
    )
    np.testing.assert_allclose(float(sums.loss / sums.count), float(loss), rtol=TOL)
    assert max_difference(jax.tree.leaves(grads), jax.tree.leaves(expected)) < TOL
    # Dropout did act: the loss without it is another one.
    sums = jax.jit(lambda p: objective.sums(p, batch, rng=None, deterministic=True))(params)
    assert abs(float(sums.loss / sums.count) - float(loss)) > 1e-4


# ----------------------------------------------------------------------------- search, metrics


def test_search_is_exact_across_blocks():
    rng = np.random.default_rng(8)
    corpus = rng.normal(size=(50, 6)).astype(np.float32)
    queries = rng.normal(size=(11, 6)).astype(np.float32)
    scores, rows = vectors.search(queries, corpus, top_k=7, query_batch=4, corpus_block=16)
    cosine = _unit(queries.astype(np.float64)) @ _unit(corpus.astype(np.float64)).T  # [11, 50]
    expected_rows = np.argsort(-cosine, axis=1)[:, :7]
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, np.take_along_axis(cosine, expected_rows, 1), atol=TOL)
    np.testing.assert_allclose(vectors.similarity(queries, corpus), cosine, atol=TOL)
    # top_k beyond the corpus: every row, best first.
    _, rows = vectors.search(queries[:2], corpus[:3], top_k=10)
    np.testing.assert_array_equal(rows, np.argsort(-cosine[:2, :3], axis=1))


def test_sts_scores_hand_values():
    a = np.asarray([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = np.asarray([[2.0, 0.0], [1.0, 1.0], [0.0, 3.0]])  # cosines 1, 1/sqrt(2), 0
    linear = embedding_eval.sts_scores(a, b, [3.0, 1 + math.sqrt(2), 1.0])  # 2 cos + 1
    assert linear == pytest.approx({"spearman": 1.0, "pearson": 1.0})
    # Ranks of cosine 3 2 1 against gold 1 3 2: rho = 1 - 6 * (4 + 1 + 1) / (3 * 8) = -0.5
    assert embedding_eval.sts_scores(a, b, [1.0, 3.0, 2.0])["spearman"] == pytest.approx(-0.5)


def test_ranking_scores_hand_values():
    ranked = np.asarray([[3, 1, 0, 2], [0, 2, 1, 3], [1, 2, 3, 0]])
    relevant = [{1, 2}, {0}, set()]  # the third query has no judgement: left out
    out = embedding_eval.ranking_scores(ranked, relevant, recall_at=(1, 2, 4), ndcg_at=10)
    first = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert out == pytest.approx(
        {
            "mrr@10": (1 / 2 + 1) / 2,
            "ndcg@10": (first + 1) / 2,
            "recall@1": (0 + 1) / 2,
            "recall@2": (0.5 + 1) / 2,
            "recall@4": 1.0,
        }
    )


def test_retrieval_scores_from_embeddings():
    angles = np.radians([10.0, 30.0, 50.0, 70.0, 95.0])
    corpus = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # ranked 0..4 from angle 0
    queries = np.asarray([[1.0, 0.0], [0.0, 1.0]])  # the second ranks 4 3 2 1 0 (95° first)
    out = embedding_eval.retrieval_scores(queries, corpus, [(0, 2), (1, 0)], recall_at=(1, 3))
    assert out["mrr@10"] == pytest.approx((1 / 3 + 1 / 5) / 2)
    assert out["recall@3"] == pytest.approx(0.5)
    assert out["recall@1"] == 0.0
    assert out["ndcg@10"] == pytest.approx((1 / math.log2(4) + 1 / math.log2(6)) / 2)
    with pytest.raises(ValueError, match=r"corpus row 9 is not in \[0, 5\)"):
        embedding_eval.retrieval_scores(queries, corpus, [(0, 9)])


# ------------------------------------------------------------------------- sentence-transformers


def test_load_refuses_what_it_cannot_pool(tmp_path, wordpiece):
    sbert.save(tmp_path, CONFIG, random_params(10), wordpiece, EmbeddingSpec(max_seq_length=16))
    config_file = tmp_path / sbert.POOLING_DIR / "config.json"
    config_file.write_text('{"embedding_dimension": 32, "pooling_mode": "weightedmean"}')
    with pytest.raises(ValueError, match=r"pooling \['weightedmean'\] is not supported"):
        sbert.load(tmp_path)


# ----------------------------------------------------------------------------- training learns
