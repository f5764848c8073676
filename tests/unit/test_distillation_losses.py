"""Distillation's losses against an independent numpy computation of each formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bertjax.nn import distillation


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logits(seed, shape, scale=3.0):
    return np.random.default_rng(seed).normal(scale=scale, size=shape).astype(np.float32)


@given(seed=st.integers(0, 2**16), temperature=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
def test_soft_cross_entropy_is_t_squared_times_the_kl_of_softened_distributions(seed, temperature):
    student, teacher = _logits(seed, (3, 4, 7)), _logits(seed + 1, (3, 4, 7))
    p = _softmax(teacher.astype(np.float64) / temperature)
    q = _softmax(student.astype(np.float64) / temperature)
    want = temperature**2 * np.sum(p * (np.log(p) - np.log(q)), axis=-1)
    got = distillation.soft_cross_entropy(student, teacher, temperature)
    assert got.shape == (3, 4)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_soft_cross_entropy_is_zero_for_the_teachers_own_logits_and_positive_otherwise():
    teacher = _logits(0, (5, 9))
    assert np.allclose(distillation.soft_cross_entropy(teacher, teacher, 2.0), 0.0, atol=1e-6)
    assert np.all(
        np.asarray(distillation.soft_cross_entropy(teacher + _logits(1, (5, 9)), teacher, 2.0)) > 0
    )


@pytest.mark.parametrize("temperature", [1.0, 2.0, 8.0])
def test_the_t_squared_scaling_keeps_the_gradient_at_the_hard_losss_scale(temperature):
    """d/ds [T^2 KL] = T (softmax(s/T) - softmax(t/T)) (Hinton et al.'s equation 2 times T^2):
    checked against that closed form, and for large T it tends to (s - t) / C after centring,
    a magnitude that does not shrink with T."""
    student, teacher = _logits(2, (6,), scale=0.3), _logits(3, (6,), scale=0.3)
    grad = jax.grad(lambda s: distillation.soft_cross_entropy(s, teacher, temperature))(
        jnp.asarray(student)
    )
    s64, t64 = student.astype(np.float64), teacher.astype(np.float64)
    want = temperature * (_softmax(s64 / temperature) - _softmax(t64 / temperature))
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-4, atol=1e-7)
    if temperature == 8.0:
        centred = (s64 - s64.mean()) - (t64 - t64.mean())
        np.testing.assert_allclose(np.asarray(grad), centred / 6, rtol=0.05, atol=1e-3)


def test_a_class_the_teacher_rules_out_adds_nothing():
    teacher = np.array([[0.0, 1.0, -np.inf]], np.float32)
    student = np.array([[0.5, 0.2, 3.0]], np.float32)
    got = distillation.soft_cross_entropy(student, teacher, 1.0)
    p = _softmax(np.array([0.0, 1.0]))
    q = _softmax(student[0].astype(np.float64))
    want = np.sum(p * (np.log(p) - np.log(q[:2])))
    np.testing.assert_allclose(np.asarray(got), [want], rtol=1e-5)
    assert np.isfinite(
        np.asarray(
            jax.grad(lambda s: distillation.soft_cross_entropy(s, teacher, 1.0).sum())(student)
        )
    ).all()


@given(seed=st.integers(0, 2**16), temperature=st.sampled_from([1.0, 2.0, 3.0]))
def test_soft_binary_cross_entropy_is_each_labels_bernoulli_kl(seed, temperature):
    student, teacher = _logits(seed, (4, 5)), _logits(seed + 7, (4, 5))
    p = 1 / (1 + np.exp(-teacher.astype(np.float64) / temperature))
    q = 1 / (1 + np.exp(-student.astype(np.float64) / temperature))
    kl = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
    want = temperature**2 * kl.sum(axis=-1)
    got = distillation.soft_binary_cross_entropy(student, teacher, temperature)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-6)


def test_soft_binary_cross_entropy_stays_finite_for_saturated_logits():
    student = np.array([[80.0, -80.0]], np.float32)
    teacher = np.array([[-80.0, 80.0]], np.float32)
    got = np.asarray(distillation.soft_binary_cross_entropy(student, teacher, 1.0))
    assert np.isfinite(got).all() and got[0] > 100


def test_squared_error_and_cosine_distance_against_numpy():
    a, b = _logits(4, (3, 8)), _logits(5, (3, 8))
    np.testing.assert_allclose(
        np.asarray(distillation.squared_error(a, b)), ((a - b) ** 2).sum(-1), rtol=1e-5
    )
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    np.testing.assert_allclose(
        np.asarray(distillation.cosine_distance(a, b)), 1 - cos, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(np.asarray(distillation.cosine_distance(a, 3 * a)), 0, atol=1e-6)


def test_mix_weighs_the_teacher_by_alpha():
    assert float(distillation.mix(jnp.float32(2.0), jnp.float32(10.0), 0.25)) == 4.0
    assert float(distillation.mix(jnp.float32(2.0), jnp.float32(10.0), 1.0)) == 10.0
