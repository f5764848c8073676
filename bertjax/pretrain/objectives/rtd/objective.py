"""Replaced-token detection (ELECTRA, Clark et al. 2020), as google-research/electra defines it.

Masking (on the host, by the loader: bertjax.data.masking) keeps google-research/bert's count
with ELECTRA's cap and fates: a row of n real tokens (specials included) gets
max(1, min(N, round(n * p))) positions among its non-special tokens, N = int((p + 0.005) * S)
slots per row for sequence length S; 85% become [MASK], 15% stay, none is replaced at random.

A step then (here, jitted):
  1. the generator predicts the masked positions (its MLM loss: mean over them);
  2. a token is drawn at each from the generator's distribution, by Gumbel-max at temperature 1
     in float32 (low-precision noise underflows), its gradient stopped;
  3. the discriminator reads the corrupted row and labels every real token replaced or not; a
     position counts as replaced only if the drawn token differs from the original;
  4. loss = generator MLM + rtd_weight * discriminator sigmoid cross-entropy (mean over every
     real token), one optimizer for both networks.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.engine import steps
from bertjax.nn import losses

# Guards divisions by a count that may be zero (no replaced token in a batch).
_GUARD = 1e-5
# The Gumbel draw of an evaluation batch (no step key there): fixed, so evaluations compare.
_EVAL_SAMPLE_SEED = 0
# The area under the ROC curve (ELECTRA's disc_auc) is counted from histograms of the
# discriminator's logits, which add up over batches and devices as the other sums do: this
# many bins of equal width over [-AUC_LOGIT_RANGE, AUC_LOGIT_RANGE] (outside it, the end bins).
AUC_BINS = 256
AUC_LOGIT_RANGE = 8.0


def num_slots(masked_lm_prob: float, max_seq_length: int) -> int:
    """ELECTRA's prediction slots per row: int((p + 0.005) * S)."""
    return int((masked_lm_prob + 0.005) * max_seq_length)


@dataclasses.dataclass(frozen=True)
class RtdSettings:
    """The objective's own fields (config.generator_hidden_fraction, config.rtd_weight)."""

    generator_hidden_fraction: float = 0.25  # ELECTRA's recommendation for base and large
    weight: float = 50.0  # lambda of the discriminator's loss


class RtdSums(NamedTuple):
    """Additive statistics of a (micro-)batch."""

    generator_loss: jax.Array  # sum over masked positions of cross-entropy
    generator_correct: jax.Array  # masked positions whose argmax is the original
    generator_weight: jax.Array  # masked positions
    discriminator_loss: jax.Array  # sum over real tokens of sigmoid cross-entropy
    discriminator_correct: jax.Array  # real tokens labelled right
    tokens: jax.Array  # real tokens
    replaced: jax.Array  # real tokens that differ from the original
    predicted_replaced: jax.Array  # real tokens the discriminator calls replaced
    true_positives: jax.Array  # replaced tokens it calls replaced
    replaced_logits: jax.Array  # [AUC_BINS] histogram of its logits on replaced tokens
    original_logits: jax.Array  # [AUC_BINS] histogram of its logits on original tokens


def originals(batch) -> jax.Array:
    """The unmasked ids [b, s]: the masked ids with the originals put back where predicted."""
    ids = jnp.asarray(batch["input_ids"]).astype(jnp.int32)  # [b, s]
    positions = jnp.asarray(batch["masked_lm_positions"]).astype(jnp.int32)  # [b, p]
    weights = jnp.asarray(batch["masked_lm_weights"]) > 0  # [b, p]
    current = jnp.take_along_axis(ids, positions, axis=1)  # [b, p]
    restored = jnp.where(weights, batch["masked_lm_ids"], current).astype(jnp.int32)  # [b, p]
    rows = jnp.arange(ids.shape[0])[:, None]  # [b, 1]
    # Padding predictions point at position 0 with weight 0: they write [CLS] back onto itself.
    return ids.at[rows, positions].set(restored)  # [b, s]


def gumbel_sample(logits: jax.Array, key: jax.Array) -> jax.Array:
    """One token per row of `logits` [..., v] drawn from softmax(logits) (Gumbel-max at
    temperature 1), computed in float32 whatever the logits' dtype; no gradient flows."""
    logits = jax.lax.stop_gradient(logits).astype(jnp.float32)
    uniform = jax.random.uniform(
        key, logits.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny, maxval=1.0
    )  # [..., v]
    gumbel = -jnp.log(-jnp.log(uniform))  # [..., v]
    return jnp.argmax(logits + gumbel, axis=-1).astype(jnp.int32)  # [...]


class RtdLoss(steps.Loss):
    """What an RTD step minimises (the module docstring), as sums over a (micro-)batch."""

    def __init__(self, model: nn.Module, weight: float):
        # The two networks (rtd.model.ReplacedTokenDetection) of the run's family.
        self.model = model
        self.weight = weight

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> RtdSums:
        if rng is None:
            rng = jax.random.key(_EVAL_SAMPLE_SEED)
        dropout_rng, sample_rng = jax.random.split(rng)
        rngs = {"dropout": dropout_rng} if not deterministic else {}
        variables = {"params": params}
        positions = jnp.asarray(batch["masked_lm_positions"]).astype(jnp.int32)  # [b, p]
        weights = jnp.asarray(batch["masked_lm_weights"]).astype(jnp.float32)  # [b, p]
        input_mask = jnp.asarray(batch["input_mask"]).astype(jnp.float32)  # [b, s]
        # Rows of packed documents (data.layout="packed"): each token sees its own document.
        documents = {}
        if "document_ids" in batch:
            documents = {"document_ids": batch["document_ids"], "positions": batch["positions"]}

        logits = self.model.apply(
            variables,
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            positions,
            deterministic=deterministic,
            method="generator_logits",
            rngs=rngs,
            **documents,
        )  # [b, p, v]
        generator = losses.loss_sums(logits, None, batch)

        sampled = gumbel_sample(logits, sample_rng)  # [b, p]
        # Only real predictions write; padding ones keep what the row has at their slot.
        original = originals(batch)  # [b, s]
        current = jnp.take_along_axis(batch["input_ids"], positions, axis=1)  # [b, p]
        written = jnp.where(weights > 0, sampled, current).astype(jnp.int32)  # [b, p]
        rows = jnp.arange(original.shape[0])[:, None]  # [b, 1]
        corrupted = (
            jnp.asarray(batch["input_ids"]).astype(jnp.int32).at[rows, positions].set(written)
        )  # [b, s]
        replaced = (corrupted != original).astype(jnp.float32) * input_mask  # [b, s]

        disc_logits = self.model.apply(
            variables,
            corrupted,
            batch["segment_ids"],
            batch["input_mask"],
            deterministic=deterministic,
            packed_length=packed_length,
            method="replaced_logits",
            rngs=rngs,
            **documents,
        )  # [b, s] float32
        per_token = _sigmoid_cross_entropy(disc_logits, replaced)  # [b, s]
        predicted = (disc_logits > 0).astype(jnp.float32) * input_mask  # [b, s]
        return RtdSums(
            generator_loss=generator.mlm_loss,
            generator_correct=generator.mlm_correct,
            generator_weight=generator.mlm_weight,
            discriminator_loss=jnp.sum(per_token * input_mask),
            discriminator_correct=jnp.sum((predicted == replaced) * input_mask),
            tokens=jnp.sum(input_mask),
            replaced=jnp.sum(replaced),
            predicted_replaced=jnp.sum(predicted),
            true_positives=jnp.sum(predicted * replaced),
            replaced_logits=_histogram(disc_logits, replaced),
            original_logits=_histogram(disc_logits, (1.0 - replaced) * input_mask),
        )

    def zero_sums(self) -> RtdSums:
        histograms = ("replaced_logits", "original_logits")
        return RtdSums(
            *(
                jnp.zeros((AUC_BINS,) if name in histograms else (), jnp.float32)
                for name in RtdSums._fields
            )
        )

    def denominators(self, batch):
        """The global batch's masked positions and real tokens."""
        generator = jnp.sum(jnp.asarray(batch["masked_lm_weights"]).astype(jnp.float32))
        tokens = jnp.sum(jnp.asarray(batch["input_mask"]).astype(jnp.float32))
        return generator, tokens

    def loss(self, sums: RtdSums, denominators) -> jax.Array:
        generator, tokens = denominators
        mlm = sums.generator_loss / jnp.maximum(generator, _GUARD)
        return mlm + self.weight * sums.discriminator_loss / jnp.maximum(tokens, _GUARD)

    def metrics(self, sums: RtdSums, prefix: str) -> dict[str, jax.Array]:
        def ratio(a, b):
            return a / jnp.maximum(b, _GUARD)

        return {
            f"{prefix}/generator_loss": ratio(sums.generator_loss, sums.generator_weight),
            f"{prefix}/generator_accuracy": ratio(sums.generator_correct, sums.generator_weight),
            f"{prefix}/discriminator_loss": ratio(sums.discriminator_loss, sums.tokens),
            f"{prefix}/discriminator_accuracy": ratio(sums.discriminator_correct, sums.tokens),
            f"{prefix}/replaced_precision": ratio(sums.true_positives, sums.predicted_replaced),
            f"{prefix}/replaced_recall": ratio(sums.true_positives, sums.replaced),
            f"{prefix}/replaced_share": ratio(sums.replaced, sums.tokens),
            f"{prefix}/replaced_auc": area_under_roc(sums.replaced_logits, sums.original_logits),
            # What a discriminator that calls every token original scores.
            f"{prefix}/all_original_accuracy": 1.0 - ratio(sums.replaced, sums.tokens),
        }


def _histogram(logits: jax.Array, weights: jax.Array) -> jax.Array:
    """[AUC_BINS] weighted counts of float32 logits [b, s] (weights [b, s]) in equal bins."""
    scaled = (logits.astype(jnp.float32) + AUC_LOGIT_RANGE) / (2 * AUC_LOGIT_RANGE)  # [b, s]
    bins = jnp.clip(jnp.floor(scaled * AUC_BINS), 0, AUC_BINS - 1).astype(jnp.int32)  # [b, s]
    return jnp.zeros((AUC_BINS,), jnp.float32).at[bins.reshape(-1)].add(weights.reshape(-1))


def area_under_roc(positives: jax.Array, negatives: jax.Array) -> jax.Array:
    """The probability that a positive scores above a negative (ties in a bin count half),
    from their histograms over the same bins [n]; 0.5 when either is empty."""
    below = jnp.cumsum(negatives) - negatives  # [n] negatives in lower bins
    wins = jnp.sum(positives * (below + 0.5 * negatives))
    pairs = jnp.sum(positives) * jnp.sum(negatives)
    return jnp.where(pairs > 0, wins / jnp.maximum(pairs, _GUARD), 0.5)


def _sigmoid_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Elementwise binary cross-entropy of float32 logits against 0/1 labels, stable."""
    logits = logits.astype(jnp.float32)
    return jnp.maximum(logits, 0.0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))
