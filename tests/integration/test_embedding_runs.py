"""The integration tests of test_embedding.py (tests/unit/), with its helpers."""

import jax
import numpy as np
import pytest

from bertjax.engine import optim
from bertjax.tasks.embed import objective as training
from bertjax.tasks.embed.model import EmbeddingSpec
from tests.helpers.embedding import CONFIG, TOL, max_difference, pair_batch


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
