"""The two networks replaced-token detection trains, built on any family with a generator
from what every family offers: its encoder module, the head it builds for
capability.REPLACED_TOKENS, and its generator (EncoderFamily.generator).

Parameter tree, whatever the family:

  bert                the discriminator's encoder (the family's module), as the family's
                      pretraining tree holds it, so fine-tuning's init_from and save_hf read
                      it as any encoder of the family; its embeddings are both networks'
  discriminator_head  the family's replaced-token head on the last hidden states (ELECTRA:
                      ElectraForPreTraining's discriminator_predictions; ModernBERT: dense ->
                      GELU -> dense)
  generator           the family's generator: a masked LM `fraction` as wide that reads the
                      discriminator's embedded tokens (projected to its width) and word table,
                      so its tree has no embeddings (ELECTRA: embeddings_project, encoder,
                      mlm_head; ModernBERT: a masked LM's tree without embeddings)

The discriminator never computes its encoder's pooled output (`pooled_output_layers`: BERT's
and ELECTRA's pooler, ModernBERT's prediction head), which the tree keeps whole anyway so that
it opens as the family's model: those layers are frozen at their initial values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import capability, encoders
from bertjax.engine import perf
from bertjax.nn import sharding
from bertjax.nn.sharding import BATCH, LENGTH

ENCODER = capability.ENCODER
DISCRIMINATOR_HEAD = capability.REPLACED_TOKENS.param
GENERATOR = "generator"


def discriminator_head(config: Any) -> encoders.family.Head:
    """The family's replaced-token head (capability.REPLACED_TOKENS) of `config`."""
    head = capability.REPLACED_TOKENS
    return encoders.family_of(config).head(
        config, head.param, head.outputs, head.reads, head.task_class
    )


class Discriminator(nn.Module):
    """The family's encoder and its replaced-token head: `replaced_logits`."""

    config: Any

    def setup(self):
        self.encoder = encoders.family_of(self.config).module(self.config, name=ENCODER)
        head = discriminator_head(self.config)
        # The head's own rate: 0 for every family's (ElectraDiscriminatorPredictions has none).
        self.head_dropout = nn.Dropout(head.dropout)
        self.head = head.module

    def replaced_logits(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
        document_ids=None,
        positions=None,
    ) -> jax.Array:
        """The discriminator's float32 logits [b, s] that each token was replaced; packed
        rows give their `document_ids` and `positions` [b, s] (each token sees its
        document)."""
        x = self.encoder.hidden_states(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=document_ids,
            positions=positions,
        )  # [b, s, h]
        logits = self.head(self.head_dropout(x, deterministic=deterministic))  # [b, s, 1]
        return sharding.constrain(logits[..., 0], (BATCH, LENGTH))  # [b, s]


class ReplacedTokenDetection(Discriminator):
    """Generator and discriminator with shared embeddings (the module docstring's tree)."""

    fraction: float = 0.25  # the generator's width over the discriminator's

    def setup(self):
        super().setup()
        self.generator = (
            encoders.family_of(self.config).generator(self.config, self.fraction).module
        )

    def generator_logits(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        masked_lm_positions,
        *,
        deterministic: bool,
        document_ids=None,
        positions=None,
    ) -> jax.Array:
        """The generator's float32 logits [b, p, v] at the masked positions, reading the
        discriminator's embedded tokens and word table."""
        embedded = self.encoder.embed(
            input_ids, token_type_ids, deterministic=deterministic, positions=positions
        )  # [b, s, e]
        return self.generator(
            input_ids,
            token_type_ids,
            attention_mask,
            masked_lm_positions,
            deterministic=deterministic,
            document_ids=document_ids,
            positions=positions,
            embedded=embedded,
            word_table=self.encoder.word_table(),
        ).mlm_logits

    def everything(self, input_ids):
        """Every output, so that `init` makes every parameter: the encoder's pooled output
        too, so that the discriminator's encoder is the family's whole."""
        positions = jnp.zeros(input_ids.shape, jnp.int32)  # [b, s]
        return (
            self.generator_logits(input_ids, None, None, positions, deterministic=True),
            self.replaced_logits(input_ids),
            self.encoder(input_ids)[1],
        )


def init(config: Any, fraction: float):
    """`rng -> boxed parameters` of `ReplacedTokenDetection`, traced on one token with xla
    attention (the parameters do not depend on the implementation)."""
    config = dataclasses.replace(config, attention_impl="xla")

    def init_params(rng: jax.Array):
        ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
        return ReplacedTokenDetection(config, fraction).init(
            {"params": rng}, ids, method="everything"
        )["params"]

    return init_params


def flops(config: Any, fraction: float, seq_len: int, predictions: int) -> float:
    """Matmul FLOPs to train both networks on one sequence: each as perf counts a family's
    masked LM (the discriminator with no predictions, the generator with them), and the
    discriminator's head on every token."""
    family = encoders.family_of(config)
    generator = family.generator(config, fraction).config
    h = float(config.hidden_size)
    return (
        perf.training_flops_per_sequence(
            config,
            seq_len,
            0,
            feed_forward_matrices=family.feed_forward_matrices,
            sentence_pair_head=False,
        )
        + perf.training_flops_per_sequence(
            generator,
            seq_len,
            predictions,
            feed_forward_matrices=family.feed_forward_matrices,
            sentence_pair_head=False,
        )
        + 3.0 * seq_len * (2 * h * h + 2 * h)  # the discriminator's head
    )
