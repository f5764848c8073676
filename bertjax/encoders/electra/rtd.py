"""The two networks replaced-token detection (bertjax.pretrain.objectives.rtd) trains on
ELECTRA, in one linen module, and the family's ReplacedTokenDetector of them.

Parameter tree: the discriminator's is ElectraPreTraining's (`bert`, `discriminator_head`), so
the family reads and writes it; `generator` is laid out, and opened as a model of its own, by
bertjax.encoders.electra.generator. The discriminator's `bert/embeddings` (word, position and
token-type tables and their LayerNorm) are shared with the generator.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.electra import generator as generator_lib
from bertjax.encoders.electra.config import ElectraConfig
from bertjax.encoders.electra.generator import Generator
from bertjax.encoders.electra.model import POOLER, DiscriminatorHead, ElectraEncoder
from bertjax.encoders.family import (
    ReplacedTokenDetector,
    replaced_token_detector,
    replaced_token_init,
)
from bertjax.engine import perf

# The discriminator's pooler is the fine-tuning classifier's first layer: RTD never runs it.
FROZEN = (f"{generator_lib.ENCODER}/{POOLER}",)


class ReplacedTokenDetection(nn.Module):
    """Generator and discriminator with shared embeddings (the module docstring's tree)."""

    config: ElectraConfig  # the discriminator's
    generator_config: ElectraConfig

    def setup(self):
        self.bert = ElectraEncoder(self.config)
        self.discriminator_head = DiscriminatorHead(self.config)
        self.generator = Generator(self.generator_config)

    def generator_logits(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        masked_lm_positions,
        *,
        deterministic,
        document_ids=None,
        positions=None,
    ) -> jax.Array:
        """The generator's float32 logits [b, p, v] at the masked positions; packed rows
        give their `document_ids` and `positions` [b, s] (each token sees its document)."""
        token_type_ids, attention_mask = model_lib._default_inputs(
            input_ids, token_type_ids, attention_mask
        )
        if document_ids is not None:
            document_ids = jnp.where(attention_mask.astype(bool), document_ids, 0)  # [b, s]
        embedded = self.bert.embeddings(
            input_ids, token_type_ids, deterministic, positions=positions
        )  # [b, s, e]
        return self.generator(
            embedded,
            attention_mask,
            masked_lm_positions,
            self.bert.word_table(),
            deterministic,
            document_ids,
        )

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
        """The discriminator's float32 logits [b, s] that each token was replaced."""
        x = self.bert.hidden_states(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=document_ids,
            positions=positions,
        )  # [b, s, h]
        return self.discriminator_head(x)

    def everything(self, input_ids):
        """Every output, so that `init` makes every parameter (the unused pooler's too, so the
        discriminator's tree is ElectraPreTraining's encoder whole)."""
        positions = jnp.zeros(input_ids.shape, jnp.int32)  # [b, s]
        return (
            self.generator_logits(input_ids, None, None, positions, deterministic=True),
            self.replaced_logits(input_ids),
            self.bert(input_ids)[1],
        )


def init(config: ElectraConfig, generator: ElectraConfig):
    """`rng -> boxed parameters` of `ReplacedTokenDetection`."""
    return replaced_token_init(ReplacedTokenDetection, config, generator)


def detector(config: ElectraConfig, fraction: float) -> ReplacedTokenDetector:
    """The family's ReplacedTokenDetector: the discriminator of `config`, its generator
    `fraction` as wide (generator.generator_config)."""
    generator = generator_lib.generator_config(config, fraction)
    return replaced_token_detector(ReplacedTokenDetection, config, generator, flops)


def flops(config: ElectraConfig, generator: ElectraConfig, seq_len: int, predictions: int):
    """Both networks: each encoder as perf counts it, the discriminator's head on every
    token, the generator's head on the predictions, and the embedding projections."""
    s, e, v = float(seq_len), float(config.embedding_size), float(config.vocab_size)
    total = 0.0
    for network in (config, generator):
        h = float(network.hidden_size)
        total += perf.training_flops_per_sequence(
            network.bert, seq_len, 0, sentence_pair_head=False
        )
        if network.embedding_size != network.hidden_size:
            total += 3.0 * s * 2 * e * h  # the projection
    h, g = float(config.hidden_size), float(generator.hidden_size)
    total += 3.0 * s * (2 * h * h + 2 * h)  # the discriminator's head
    total += 3.0 * predictions * (2 * g * e + 2 * e * e + 2 * e * v)  # the generator's head
    return total
