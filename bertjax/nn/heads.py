"""What every fine-tuning head builds on: its loss statistics, its init, its call.

A head model is the encoder of the config's family (bertjax.encoders; parameters under
capability.ENCODER, as in BertForPreTraining, so a pretrained encoder drops in) plus the
family's head of the task (EncoderFamily.head: its linen module and its tensor map, one object
however many layers it has). The head models live with their capability
(bertjax/tasks/<name>/): label heads in bertjax.tasks.labels.model, the span head in
bertjax.tasks.qa. Their losses return sums (see `HeadSums`) so that micro-batches and devices
add up exactly, as bertjax.nn.losses does for pretraining.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

# The label heads' name beside the encoder (transformers' too).
CLASSIFIER = "classifier"


def init_params(model: nn.Module, rng: jax.Array, seq_len: int = 1):
    """Boxed parameters of a head model (`rng -> params`, for steps.make_state)."""
    ids = jnp.zeros((1, seq_len), jnp.int32)  # [batch, seq]
    return model.init({"params": rng}, ids, ids, ids)["params"]


class HeadSums(NamedTuple):
    """Additive statistics of a (micro-)batch; the loss is loss / count over the batch."""

    loss: jax.Array  # summed per-example (per-label, per-token) loss
    correct: jax.Array  # argmax hits (classification, tokens) or per-label hits (multi-label)
    count: jax.Array  # what the loss is averaged over: examples, example-labels or tokens

    @classmethod
    def zeros(cls) -> HeadSums:
        """The sums of no example at all (what accumulation starts from)."""
        return cls(*(jnp.zeros((), jnp.float32) for _ in cls._fields))


def apply_model(model: nn.Module, params, batch, *, rng, deterministic: bool, packed_length=None):
    """A head model over a batch's google-named features, with dropout drawn from `rng` (None:
    no dropout rng, for evaluation)."""
    return model.apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        deterministic=deterministic,
        packed_length=packed_length,
        rngs={"dropout": rng} if rng is not None else {},
    )
