"""Masked-LM and next-sentence-prediction losses and accuracies as pure functions.

The functions return *sums* rather than means so that micro-batches (gradient
accumulation) and devices can be added up exactly; the trainer divides by the
denominators of the whole global batch, which makes an accumulated gradient equal
to the gradient of the large batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Guards the divisions when a batch has no weighted prediction (e.g. an all-padding
# micro-batch); google-research/bert adds 1e-5 to the weight sum for the same reason.
_DENOMINATOR_GUARD = 1e-5


class LossSums(NamedTuple):
    """Additive loss statistics of a (micro-)batch."""

    mlm_loss: jax.Array  # sum over predictions of weight * cross-entropy
    mlm_correct: jax.Array  # sum of weight * (argmax == label)
    mlm_weight: jax.Array  # sum of weights
    nsp_loss: jax.Array  # sum over examples of cross-entropy
    nsp_correct: jax.Array  # number of examples whose argmax equals the label
    nsp_count: jax.Array  # number of examples


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-row cross-entropy and correctness of `logits` [..., C] against int `labels` [...]."""
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # [..., C]
    # A one-hot select instead of a gather keeps the class axis reducible in place when
    # the vocabulary is sharded across devices; `where` rather than a product so that a
    # -inf log-probability of another class cannot turn into 0 * inf = nan.
    is_label = labels[..., None] == jnp.arange(logits.shape[-1])  # [..., C]
    loss = -jnp.sum(jnp.where(is_label, log_probs, 0.0), axis=-1)  # [...]
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)  # [...]
    return loss, correct


def loss_sums(
    mlm_logits: jax.Array, nsp_logits: jax.Array | None, batch: Mapping[str, jax.Array]
) -> LossSums:
    """Summed MLM and NSP statistics of one batch.

    Args:
      mlm_logits: [batch, predictions, vocab] logits at the masked positions.
      nsp_logits: [batch, 2] next-sentence logits; None for a model without the head (its
        NSP sums are zero).
      batch: needs masked_lm_ids [batch, predictions], masked_lm_weights
        [batch, predictions] (0 for padding predictions) and next_sentence_labels [batch].
    """
    mlm_ids = jnp.asarray(batch["masked_lm_ids"]).astype(jnp.int32)
    mlm_weights = jnp.asarray(batch["masked_lm_weights"]).astype(jnp.float32)
    nsp_labels = jnp.asarray(batch["next_sentence_labels"]).astype(jnp.int32)
    nsp_labels = nsp_labels.reshape(nsp_labels.shape[0])  # [batch]; accepts [batch, 1] too
    if mlm_logits.shape[:2] != mlm_ids.shape:
        raise ValueError(
            f"mlm_logits has shape {mlm_logits.shape} but masked_lm_ids has shape "
            f"{mlm_ids.shape}; expected mlm_logits [batch, predictions, vocab]"
        )
    mlm_loss, mlm_correct = _cross_entropy(mlm_logits, mlm_ids)  # [batch, predictions]
    if nsp_logits is None:  # no sentence-pair head: nothing to score
        nsp_loss = nsp_correct = jnp.zeros(nsp_labels.shape, jnp.float32)  # [batch]
    else:
        if nsp_logits.shape != (nsp_labels.shape[0], 2):
            raise ValueError(
                f"nsp_logits has shape {nsp_logits.shape}; expected [{nsp_labels.shape[0]}, 2] "
                "for next_sentence_labels of that batch size"
            )
        nsp_loss, nsp_correct = _cross_entropy(nsp_logits, nsp_labels)  # [batch]
    return LossSums(
        mlm_loss=jnp.sum(mlm_weights * mlm_loss),
        mlm_correct=jnp.sum(mlm_weights * mlm_correct),
        mlm_weight=jnp.sum(mlm_weights),
        nsp_loss=jnp.sum(nsp_loss),
        nsp_correct=jnp.sum(nsp_correct),
        nsp_count=jnp.asarray(nsp_labels.shape[0], jnp.float32),
    )


def _safe_divide(numerator: jax.Array, denominator) -> jax.Array:
    denominator = jnp.asarray(denominator, jnp.float32)
    return numerator / jnp.maximum(denominator, _DENOMINATOR_GUARD)


def total_loss(sums: LossSums, mlm_denominator, nsp_denominator) -> jax.Array:
    """Training objective: mean MLM loss plus mean NSP loss.

    The denominators are those of the whole global batch (its total MLM weight and its
    number of examples), so that summing this over micro-batches gives the mean loss
    of the large batch and its gradient exactly.
    """
    return _safe_divide(sums.mlm_loss, mlm_denominator) + _safe_divide(
        sums.nsp_loss, nsp_denominator
    )


def masked_lm_loss(sums: LossSums, mlm_denominator) -> jax.Array:
    """Training objective without a sentence-pair task: the mean MLM loss alone (the
    denominator is the whole global batch's MLM weight, as in `total_loss`)."""
    return _safe_divide(sums.mlm_loss, mlm_denominator)


def metrics(sums: LossSums, prefix: str, sentence_pair: bool = True) -> dict[str, jax.Array]:
    """Mean losses and accuracies named `{prefix}/mlm_loss`, `.../mlm_accuracy`, etc.; the
    nsp_* ones only when the sentence-pair task is trained."""
    out = {
        f"{prefix}/mlm_loss": _safe_divide(sums.mlm_loss, sums.mlm_weight),
        f"{prefix}/mlm_accuracy": _safe_divide(sums.mlm_correct, sums.mlm_weight),
    }
    if sentence_pair:
        out[f"{prefix}/nsp_loss"] = _safe_divide(sums.nsp_loss, sums.nsp_count)
        out[f"{prefix}/nsp_accuracy"] = _safe_divide(sums.nsp_correct, sums.nsp_count)
    return out
