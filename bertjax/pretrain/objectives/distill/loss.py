"""What a pretraining distillation step minimises (DistilBERT, Sanh et al. 2019), as sums.

The student (any family's masked-LM model) reads the batch; the frozen teacher's outputs on
the same batch come with it (bertjax.engine.teacher: its masked-LM logits at the masked
positions and its last hidden states). Three terms, as DistilBERT weighs them:

  ce    T^2 * KL(teacher || student) of the masked positions' vocabulary distributions,
        both softened by the temperature T (DistilBERT's loss_ce, T = 2), mean over masked
        positions
  mlm   the student's masked-LM cross-entropy against the original tokens, mean over masked
        positions (google-research/bert's normalisation)
  cos   1 - cos(student, teacher) of the last hidden states, mean over real tokens

loss = alpha_ce * ce + alpha_mlm * mlm + alpha_cos * cos (DistilBERT's 5, 2, 1).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.engine import steps
from bertjax.engine import teacher as teacher_lib
from bertjax.nn import distillation, losses

# Guards divisions by a count that may be zero (a micro-batch without masked positions).
_GUARD = 1e-5


@dataclasses.dataclass(frozen=True)
class DistillSettings:
    """The objective's own fields (config.teacher, config.distill_*)."""

    teacher: str = ""  # a pretraining run or a transformers directory, one tokenizer with ours
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    # The teacher's encoder layers the student starts from (empty: a random start).
    student_layers: tuple[int, ...] = ()


class DistillSums(NamedTuple):
    """Additive statistics of a (micro-)batch."""

    masked: losses.LossSums  # the student's masked LM against the labels
    soft_loss: jax.Array  # summed softened KL over masked positions (weights)
    cos_loss: jax.Array  # summed 1 - cos over real tokens
    tokens: jax.Array  # real tokens


class DistillLoss(steps.Loss):
    """The module docstring's loss, on a family's pretraining `model` (the student)."""

    def __init__(self, model: nn.Module, settings: DistillSettings):
        self.model = model
        self.settings = settings

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> DistillSums:
        output = self.model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=batch.get("document_ids"),
            positions=batch.get("positions"),
            rngs={"dropout": rng} if rng is not None else {},
        )
        teacher = teacher_lib.teacher_outputs(batch)
        weights = jnp.asarray(batch["masked_lm_weights"]).astype(jnp.float32)  # [b, p]
        soft = distillation.soft_cross_entropy(
            output.mlm_logits, teacher["mlm_logits"], self.settings.temperature
        )  # [b, p]
        mask = jnp.asarray(batch["input_mask"]).astype(jnp.float32)  # [b, s]
        cos = distillation.cosine_distance(output.sequence_output, teacher["hidden"])  # [b, s]
        return DistillSums(
            masked=losses.loss_sums(output.mlm_logits, None, batch),
            soft_loss=jnp.sum(weights * soft),
            cos_loss=jnp.sum(mask * cos),
            tokens=jnp.sum(mask),
        )

    def zero_sums(self) -> DistillSums:
        zero = jnp.zeros((), jnp.float32)
        return DistillSums(
            losses.LossSums(*(zero for _ in losses.LossSums._fields)), zero, zero, zero
        )

    def denominators(self, batch):
        """The global batch's masked positions and real tokens."""
        masked = jnp.sum(jnp.asarray(batch["masked_lm_weights"]).astype(jnp.float32))
        tokens = jnp.sum(jnp.asarray(batch["input_mask"]).astype(jnp.float32))
        return masked, tokens

    def loss(self, sums: DistillSums, denominators) -> jax.Array:
        masked, tokens = (jnp.maximum(d, _GUARD) for d in denominators)
        s = self.settings
        return (
            s.alpha_ce * sums.soft_loss / masked
            + s.alpha_mlm * sums.masked.mlm_loss / masked
            + s.alpha_cos * sums.cos_loss / tokens
        )

    def metrics(self, sums: DistillSums, prefix: str) -> dict[str, jax.Array]:
        out = losses.metrics(sums.masked, prefix, sentence_pair=False)
        masked = jnp.maximum(sums.masked.mlm_weight, _GUARD)
        out[f"{prefix}/distill_ce"] = sums.soft_loss / masked
        out[f"{prefix}/distill_cos"] = sums.cos_loss / jnp.maximum(sums.tokens, _GUARD)
        return out
