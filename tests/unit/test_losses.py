"""Exact values of the MLM/NSP losses, accuracies and their additivity."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.nn import losses


def _batch(ids, weights, nsp_labels):
    return {
        "masked_lm_ids": np.asarray(ids, np.int32),
        "masked_lm_weights": np.asarray(weights, np.float32),
        "next_sentence_labels": np.asarray(nsp_labels, np.int32),
    }


def test_uniform_logits_give_log_vocab():
    vocab = 7
    mlm_logits = jnp.zeros((2, 3, vocab))
    nsp_logits = jnp.zeros((2, 2))
    batch = _batch([[1, 2, 3], [4, 5, 0]], [[1, 1, 1], [1, 1, 0]], [0, 1])
    sums = losses.loss_sums(mlm_logits, nsp_logits, batch)
    np.testing.assert_allclose(sums.mlm_loss, 5 * math.log(vocab), rtol=1e-6)
    np.testing.assert_allclose(sums.mlm_weight, 5.0)
    np.testing.assert_allclose(sums.nsp_loss, 2 * math.log(2), rtol=1e-6)
    np.testing.assert_allclose(sums.nsp_count, 2.0)
    m = losses.metrics(sums, "train")
    assert set(m) == {
        "train/mlm_loss",
        "train/mlm_accuracy",
        "train/nsp_loss",
        "train/nsp_accuracy",
    }
    np.testing.assert_allclose(m["train/mlm_loss"], math.log(vocab), rtol=1e-6)
    np.testing.assert_allclose(m["train/nsp_loss"], math.log(2), rtol=1e-6)
    np.testing.assert_allclose(
        losses.total_loss(sums, 5.0, 2.0), math.log(vocab) + math.log(2), rtol=1e-6
    )


def test_hand_computed_values_and_weights():
    # One sequence, two predictions with logits (2, 0, 0) and (0, 1, 0); weights 1 and 0.5.
    mlm_logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    batch = _batch([[0, 2]], [[1.0, 0.5]], [1])
    nsp_logits = jnp.array([[3.0, 1.0]])
    sums = losses.loss_sums(mlm_logits, nsp_logits, batch)
    ce0 = -(2.0 - math.log(math.exp(2) + 2))  # label 0 is the argmax: correct
    ce1 = -(0.0 - math.log(math.e + 2))  # label 2, argmax 1: wrong
    np.testing.assert_allclose(sums.mlm_loss, ce0 + 0.5 * ce1, rtol=1e-6)
    np.testing.assert_allclose(sums.mlm_correct, 1.0)
    np.testing.assert_allclose(sums.mlm_weight, 1.5)
    nsp_ce = -(1.0 - math.log(math.exp(3) + math.e))
    np.testing.assert_allclose(sums.nsp_loss, nsp_ce, rtol=1e-6)
    np.testing.assert_allclose(sums.nsp_correct, 0.0)
    m = losses.metrics(sums, "eval")
    np.testing.assert_allclose(m["eval/mlm_accuracy"], 1.0 / 1.5, rtol=1e-6)
    np.testing.assert_allclose(m["eval/mlm_loss"], (ce0 + 0.5 * ce1) / 1.5, rtol=1e-6)
    np.testing.assert_allclose(m["eval/nsp_accuracy"], 0.0)


def test_one_hot_logits_and_zero_weight_positions_ignored():
    vocab = 5
    ids = np.array([[1, 3, 0, 0]])
    big = 30.0
    logits = np.full((1, 4, vocab), -big, np.float32)
    logits[0, 0, 1] = big
    logits[0, 1, 3] = big
    # Padding predictions carry garbage logits that would be wrong and costly if counted.
    logits[0, 2, 4] = 1e4
    logits[0, 3, 2] = 1e4
    nsp_logits = jnp.array([[big, -big]])
    sums = losses.loss_sums(jnp.asarray(logits), nsp_logits, _batch(ids, [[1, 1, 0, 0]], [0]))
    assert float(sums.mlm_loss) < 1e-20 + 5 * math.exp(-2 * big)
    np.testing.assert_allclose(sums.mlm_correct, 2.0)
    np.testing.assert_allclose(sums.mlm_weight, 2.0)
    np.testing.assert_allclose(sums.nsp_correct, 1.0)
    m = losses.metrics(sums, "train")
    np.testing.assert_allclose(m["train/mlm_accuracy"], 1.0)
    np.testing.assert_allclose(m["train/nsp_accuracy"], 1.0)


def test_sums_are_additive_across_splits_of_a_batch():
    rng = np.random.default_rng(0)
    b, p, v = 8, 5, 11
    mlm_logits = jnp.asarray(rng.normal(size=(b, p, v)) * 3, jnp.float32)
    nsp_logits = jnp.asarray(rng.normal(size=(b, 2)), jnp.float32)
    weights = (rng.random((b, p)) < 0.7).astype(np.float32)
    batch = _batch(rng.integers(0, v, (b, p)), weights, rng.integers(0, 2, b))
    mlm_den, nsp_den = float(weights.sum()), float(b)

    def micro_loss(logits, nsp, part):
        # Global-batch denominators, as the trainer passes them to every micro-batch.
        return losses.total_loss(losses.loss_sums(logits, nsp, part), mlm_den, nsp_den)

    sums_fn = jax.jit(losses.loss_sums)
    loss_and_grad = jax.jit(jax.value_and_grad(micro_loss))
    splits = [(0, 2), (2, 4), (4, 6), (6, 8)]  # equal sizes: one compilation
    whole = sums_fn(mlm_logits, nsp_logits, batch)
    whole_loss, whole_grad = loss_and_grad(mlm_logits, nsp_logits, batch)

    parts, part_losses, part_grads = [], [], []
    for lo, hi in splits:
        part = {k: x[lo:hi] for k, x in batch.items()}
        parts.append(sums_fn(mlm_logits[lo:hi], nsp_logits[lo:hi], part))
        loss, grad = loss_and_grad(mlm_logits[lo:hi], nsp_logits[lo:hi], part)
        part_losses.append(loss)
        part_grads.append(grad)
    added = jax.tree.map(lambda *xs: sum(xs), *parts)
    for name, a, w in zip(losses.LossSums._fields, added, whole):
        np.testing.assert_allclose(a, w, rtol=1e-5, err_msg=name)
    # Accumulated micro-batch losses and gradients equal the whole batch's.
    np.testing.assert_allclose(sum(part_losses), whole_loss, rtol=1e-5)
    np.testing.assert_allclose(jnp.concatenate(part_grads), whole_grad, rtol=1e-5, atol=1e-9)
    m = losses.metrics(whole, "train")
    np.testing.assert_allclose(whole_loss, m["train/mlm_loss"] + m["train/nsp_loss"], rtol=1e-6)


def test_huge_logits_stay_finite_and_bfloat16_is_upcast():
    logits = jnp.array([[[1e30, -1e30, 0.0], [-3e38, 3e38, 0.0]]], jnp.float32)
    nsp = jnp.array([[1e30, -1e30]], jnp.bfloat16)
    sums = losses.loss_sums(logits, nsp, _batch([[1, 1]], [[1, 1]], [1]))
    for name, x in zip(losses.LossSums._fields, sums):
        assert x.dtype == jnp.float32, name
        assert np.isfinite(x), name
    # First prediction is wrong by a 2e30 margin, second right: loss 2e30, accuracy 1/2.
    np.testing.assert_allclose(sums.mlm_loss, 2e30, rtol=1e-5)
    np.testing.assert_allclose(sums.mlm_correct, 1.0)


def test_empty_weights_do_not_divide_by_zero():
    sums = losses.loss_sums(
        jnp.zeros((1, 2, 4)), jnp.zeros((1, 2)), _batch([[0, 0]], [[0, 0]], [0])
    )
    m = losses.metrics(sums, "eval")
    assert all(np.isfinite(v) for v in m.values())
    assert float(m["eval/mlm_loss"]) == 0.0
    assert np.isfinite(losses.total_loss(sums, 0.0, 1.0))


def test_loss_sums_jits_and_checks_shapes():
    batch = _batch([[1, 2]], [[1, 1]], [0])
    jitted = jax.jit(losses.loss_sums)(jnp.zeros((1, 2, 3)), jnp.zeros((1, 2)), batch)
    np.testing.assert_allclose(jitted.mlm_loss, 2 * math.log(3), rtol=1e-6)
    with pytest.raises(ValueError, match="masked_lm_ids"):
        losses.loss_sums(jnp.zeros((1, 3, 3)), jnp.zeros((1, 2)), batch)
    with pytest.raises(ValueError, match="nsp_logits"):
        losses.loss_sums(jnp.zeros((1, 2, 3)), jnp.zeros((1, 3)), batch)
