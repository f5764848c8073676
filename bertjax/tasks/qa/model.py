"""The question-answering head: the encoder's per-token output -> dense "qa_outputs" [h, 2] ->
start and end logits (`QuestionAnswering`); `qa_sums` is its loss as additive sums, and
`QAObjective` the steps.Loss of a train step. Model.answer runs it through the notebook's
batching path (answer.window_logits).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import capability, encoders
from bertjax.capability import ENCODER
from bertjax.encoders.family import EncoderConfig
from bertjax.engine import steps
from bertjax.nn import distillation, heads, sharding
from bertjax.nn.heads import HeadSums
from bertjax.nn.sharding import BATCH, LABELS, LENGTH

TASK = "question_answering"
# The head's parameters, beside "bert": transformers' name too.
HEAD_NAME = "qa_outputs"
# The head's two outputs, as its HeadSpec records them.
HEAD_LABELS = ("start", "end")


# ----------------------------------------------------------------------------- the head


def qa_outputs(config: EncoderConfig) -> nn.Module:
    """The family's span head "qa_outputs" (EncoderFamily.head): [b, s, h] -> [b, s, 2]."""
    return encoders.family_of(config).head(config, HEAD_NAME, 2, capability.TOKENS).module


class QuestionAnswering(nn.Module):
    """The encoder's per-token output -> dense "qa_outputs" [hidden, 2] -> start, end logits.

    No dropout before the dense layer, as in google's run_squad.py and transformers'
    BertForQuestionAnswering (ModernBERT's encoder runs its head and dropout over the tokens,
    as ModernBertForQuestionAnswering does). Returns float32 (start_logits, end_logits), each
    [batch, seq].
    """

    config: EncoderConfig

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        sequence, _ = encoders.family_of(self.config).module(self.config, name=ENCODER)(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            token_head=True,
        )  # [b, s, h]
        logits = qa_outputs(self.config)(sequence)  # [b, s, 2]
        logits = sharding.constrain(logits, (BATCH, LENGTH, LABELS))
        return logits[..., 0], logits[..., 1]  # [b, s] each


def init_params(model: QuestionAnswering, rng: jax.Array, seq_len: int = 1):
    """Boxed parameters of the head model (`rng -> params`, for steps.make_state)."""
    ids = jnp.zeros((1, seq_len), jnp.int32)  # [batch, seq]
    return model.init({"params": rng}, ids, ids, ids)["params"]


def qa_sums(
    start_logits: jax.Array,
    end_logits: jax.Array,
    start_positions: jax.Array,
    end_positions: jax.Array,
    weights: jax.Array,
    input_mask: jax.Array | None = None,
) -> HeadSums:
    """Per row, the mean of the start and end cross-entropies (google's and transformers'
    loss), summed over rows with their weights; `correct` counts rows whose argmax start and
    end are both right. loss / count is the batch's loss.

    With `input_mask` the softmax and argmax run over the real positions only. google's and
    transformers' losses also spread probability over the padding, so theirs depends on how
    far a batch is padded; this one does not, so a window's loss is the same in a padded
    batch, a length bucket or a micro-batch grouped by length.
    """
    if input_mask is not None:
        lowest = jnp.finfo(jnp.float32).min
        start_logits = jnp.where(input_mask > 0, start_logits.astype(jnp.float32), lowest)
        end_logits = jnp.where(input_mask > 0, end_logits.astype(jnp.float32), lowest)

    def cross_entropy(logits, positions):
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [b, s]
        picked = jnp.take_along_axis(log_probs, positions[:, None].astype(jnp.int32), axis=-1)
        return -picked[:, 0]  # [b]

    loss = 0.5 * (
        cross_entropy(start_logits, start_positions) + cross_entropy(end_logits, end_positions)
    )  # [b]
    correct = (jnp.argmax(start_logits, axis=-1) == start_positions) & (
        jnp.argmax(end_logits, axis=-1) == end_positions
    )  # [b]
    weights = weights.astype(jnp.float32)
    return HeadSums(
        jnp.sum(weights * loss), jnp.sum(weights * correct.astype(jnp.float32)), jnp.sum(weights)
    )


# The logit a padding position gets in the soft loss: nothing of the softmax, and finite
# whatever the temperature divides it by, so no inf arithmetic.
_MASKED_LOGIT = -1e9


def soft_span_loss(
    student: tuple[jax.Array, jax.Array],
    teacher: tuple[jax.Array, jax.Array],
    input_mask: jax.Array,
    temperature: float,
) -> jax.Array:
    """Per window [b], the mean of the start and end distributions' softened KL of the
    student's (start, end) logits [b, s] against the teacher's, over real positions only
    (as `qa_sums` scores the labels)."""

    def masked(logits):
        return jnp.where(input_mask > 0, logits.astype(jnp.float32), _MASKED_LOGIT)

    return 0.5 * sum(
        distillation.soft_cross_entropy(masked(s), masked(t), temperature)
        for s, t in zip(student, teacher)
    )  # [b]


class QAObjective(steps.Loss):
    """The head's loss as sums over windows (see steps.Loss), for make_train_step."""

    def __init__(self, model: QuestionAnswering):
        self.model = model

    def logits(self, params, batch, *, rng, deterministic: bool, packed_length=None):
        return heads.apply_model(
            self.model,
            params,
            batch,
            rng=rng,
            deterministic=deterministic,
            packed_length=packed_length,
        )

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> HeadSums:
        start, end = self.logits(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        return self.batch_sums(start, end, batch)

    def batch_sums(self, start_logits, end_logits, batch) -> HeadSums:
        """qa_sums of a batch's logits, over its real positions."""
        return qa_sums(
            start_logits,
            end_logits,
            batch["start_positions"],
            batch["end_positions"],
            batch["weights"],
            batch["input_mask"],
        )

    def zero_sums(self) -> HeadSums:
        return HeadSums.zeros()

    def denominators(self, batch) -> jax.Array:
        return jnp.sum(batch["weights"].astype(jnp.float32))

    def loss(self, sums: HeadSums, denominators: jax.Array) -> jax.Array:
        return sums.loss / jnp.maximum(denominators, 1.0)

    def metrics(self, sums: HeadSums, prefix: str) -> dict[str, jax.Array]:
        count = jnp.maximum(sums.count, 1.0)
        return {
            f"{prefix}/loss": sums.loss / count,
            f"{prefix}/span_accuracy": sums.correct / count,
        }
