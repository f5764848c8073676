"""The integration tests of test_embedding.py (tests/unit/), with its helpers."""

import jax
import numpy as np
import pytest
from test_embedding import (  # noqa: F401 (fixtures are used by name)
    CONFIG,
    TOL,
    embed_texts,
    max_difference,
    pair_batch,
    synthetic_pairs,
    synthetic_sts,
    wordpiece,
)

from bertjax import optim
from bertjax.model import BertConfig
from bertjax.tasks.embed import metrics as embedding_eval
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed import objective as training
from bertjax.tasks.embed.model import EmbeddingSpec


@pytest.mark.slow
def test_cached_train_step_equals_the_direct_one_on_a_mesh():
    """One optimizer step on 8 devices: GradCache with 2 chunks lands on the same params."""
    spec = EmbeddingSpec(max_seq_length=16)
    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=10)
    batch = pair_batch(7, rows=16, texts=2, padded_rows=2)
    results = []
    for chunks in (1, 2):
        run = training.build_embedding_training(
            CONFIG,
            spec,
            training.LossSettings(),
            optimizer,
            mesh_shape=(-1, 1, 1),
            cache_chunks=chunks,
        )
        with jax.set_mesh(run.mesh):
            state = run.state.init(jax.random.key(0))
            state, metrics = run.train_step(state, batch, jax.random.key(1))
        results.append((jax.device_get(state.params), jax.device_get(metrics)))
    (direct, direct_metrics), (cached, cached_metrics) = results
    np.testing.assert_allclose(cached_metrics["train/loss"], direct_metrics["train/loss"], rtol=TOL)
    assert cached_metrics["train/nonfinite"] == 0
    assert max_difference(jax.tree.leaves(cached), jax.tree.leaves(direct)) < TOL


@pytest.mark.slow
def test_training_raises_held_out_sts_spearman(wordpiece):
    """A short in-batch-negatives run on 8 devices from a random tiny model: held-out STS
    Spearman rises clearly above the untrained model's mean-pooled embeddings."""
    config = BertConfig(**{**CONFIG.to_dict(), "hidden_dropout": 0.1, "attention_dropout": 0.1})
    spec = EmbeddingSpec("mean", normalize=False, max_seq_length=16)
    steps_count, batch_rows = 150, 32
    optimizer = optim.OptimizerSettings(
        learning_rate=2e-3, warmup_steps=15, total_steps=steps_count, weight_decay=0.01
    )
    run = training.build_embedding_training(
        config, spec, training.LossSettings(), optimizer, mesh_shape=(-1, 1, 1)
    )
    rng = np.random.default_rng(0)
    left, right, gold = synthetic_sts(rng, 400)

    def spearman(params) -> float:
        params = jax.device_get(params)
        a = embed_texts(config, params, wordpiece, spec, left, batch_size=128, mesh=run.mesh)
        b = embed_texts(config, params, wordpiece, spec, right, batch_size=128, mesh=run.mesh)
        return embedding_eval.sts_scores(a, b, gold)["spearman"]

    with jax.set_mesh(run.mesh):
        state = run.state.init(jax.random.key(0))
        before = spearman(state.params)
        losses = []
        for _ in range(steps_count):
            anchors, positives = synthetic_pairs(rng, batch_rows)
            ids = [embedding.token_ids(wordpiece, side, 16) for side in (anchors, positives)]
            inputs = [embedding.pad_inputs(side, 16) for side in ids]
            batch = {
                name: np.stack([inputs[0][name], inputs[1][name]], axis=1)  # [b, 2, s]
                for name in ("input_ids", "input_mask", "segment_ids")
            }
            batch["weights"] = np.ones(batch_rows, np.float32)
            state, metrics = run.train_step(state, batch, jax.random.key(1))
            losses.append(float(metrics["train/loss"]))
        after = spearman(state.params)
    print(
        f"held-out STS Spearman: untrained {before:.3f}, trained {after:.3f}; "
        f"loss {np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}"
    )
    assert after > before + 0.2
    assert after > 0.7
