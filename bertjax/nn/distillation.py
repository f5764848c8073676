"""Knowledge distillation's losses: a student's outputs against a frozen teacher's, per example.

Each function returns one loss per row of its inputs (per example, per token or per masked
position, whatever the leading axes are), in float32, so that a caller weighs and sums them the
way its task sums its hard-label loss (micro-batches and devices then add up exactly).

Softened distributions follow Hinton et al. (2015): both networks' logits are divided by the
temperature T, and the loss is multiplied by T^2 so that its gradient keeps the hard-label
loss's scale whatever T is (the soft gradient shrinks as 1/T^2). DistilBERT uses the same
(its `alpha_ce` term, with T = 2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def soft_cross_entropy(student: jax.Array, teacher: jax.Array, temperature: float) -> jax.Array:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)) over the last axis: [...]

    The KL divergence is the cross-entropy against the teacher's softened distribution less
    that distribution's entropy, which does not depend on the student: the same gradient as
    the cross-entropy, and 0 when the student matches the teacher.
    """
    t = jnp.asarray(temperature, jnp.float32)
    student_log = jax.nn.log_softmax(student.astype(jnp.float32) / t, axis=-1)  # [..., C]
    teacher_log = jax.nn.log_softmax(teacher.astype(jnp.float32) / t, axis=-1)  # [..., C]
    teacher_prob = jnp.exp(teacher_log)  # [..., C]
    # A class the teacher gives probability 0 (a -inf logit, e.g. a masked span end)
    # contributes nothing: `where`, so that 0 * -inf never becomes nan.
    terms = jnp.where(teacher_prob > 0, teacher_prob * (teacher_log - student_log), 0.0)
    return t * t * jnp.sum(terms, axis=-1)  # [...]


def soft_binary_cross_entropy(
    student: jax.Array, teacher: jax.Array, temperature: float
) -> jax.Array:
    """T^2 * the binary KL of each label's softened sigmoid, summed over the last axis: [...]

    Multi-label heads score each label on its own, so each label is a two-class
    distribution (sigmoid(x / T), 1 - sigmoid(x / T)) and the teacher's is the target.
    """
    t = jnp.asarray(temperature, jnp.float32)
    s = student.astype(jnp.float32) / t  # [..., L]
    x = teacher.astype(jnp.float32) / t  # [..., L]
    p = jax.nn.sigmoid(x)  # [..., L] the teacher's probability of each label
    # KL of Bernoulli(p) against Bernoulli(sigmoid(s)), in log-sigmoid terms (stable for
    # large logits): p (log p - log q) + (1 - p) (log(1 - p) - log(1 - q)).
    kl = p * (jax.nn.log_sigmoid(x) - jax.nn.log_sigmoid(s)) + (1.0 - p) * (
        jax.nn.log_sigmoid(-x) - jax.nn.log_sigmoid(-s)
    )  # [..., L]
    return t * t * jnp.sum(kl, axis=-1)  # [...]


def squared_error(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """The squared distance between two vectors, summed over the last axis: [...] (MSE to the
    teacher's score for regression, to its embedding for sentence embeddings, as
    sentence-transformers' MSELoss distils a model)."""
    diff = student.astype(jnp.float32) - teacher.astype(jnp.float32)  # [..., D]
    return jnp.sum(diff * diff, axis=-1)  # [...]


def cosine_distance(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """1 - cos(student, teacher) over the last axis: [...] (DistilBERT's `alpha_cos` term on
    the last hidden states; its CosineEmbeddingLoss with target 1 is the same)."""
    s = student.astype(jnp.float32)  # [..., H]
    x = teacher.astype(jnp.float32)  # [..., H]
    # As torch's cosine_similarity: each norm kept above a small epsilon.
    norms = jnp.maximum(jnp.linalg.norm(s, axis=-1), 1e-8) * jnp.maximum(
        jnp.linalg.norm(x, axis=-1), 1e-8
    )  # [...]
    return 1.0 - jnp.sum(s * x, axis=-1) / norms  # [...]


def mix(hard: jax.Array, soft: jax.Array, alpha: float) -> jax.Array:
    """alpha * soft + (1 - alpha) * hard: the weight of the teacher's targets against the
    labels' (alpha = 1 learns from the teacher alone)."""
    return alpha * soft + (1.0 - alpha) * hard
