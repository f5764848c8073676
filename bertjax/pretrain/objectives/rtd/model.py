"""The two networks replaced-token detection trains, in one linen module.

Parameter tree (the discriminator's is ElectraPreTraining's, so the family reads and writes it):

  bert                the discriminator's ElectraEncoder; its `embeddings` (word, position,
                      token-type tables and their LayerNorm) are shared with the generator
  discriminator_head  ElectraDiscriminatorPredictions: a logit per token that it was replaced
  generator/
    embeddings_project  the generator's own [embedding, generator hidden] projection (only
                        when the two widths differ)
    encoder           BERT's layers at the generator's width
    mlm_head          dense -> GELU -> LayerNorm -> logits against the shared word table

The generator is ELECTRA's (google-research/electra, run_pretraining.py's
get_generator_config): the discriminator's depth, hidden size a fraction of it, FFN four times
that, heads hidden // 64 (at least one).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import sharding
from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.electra.config import ElectraConfig
from bertjax.encoders.electra.model import DiscriminatorHead, ElectraEncoder
from bertjax.sharding import ACTIVATION_EMBED, BATCH, EMBED, HIDDEN, LENGTH

GENERATOR = "generator"


def generator_config(config: ElectraConfig, fraction: float) -> ElectraConfig:
    """The generator's config for a discriminator's: hidden size round(fraction * hidden),
    FFN 4x that, heads hidden // 64 (at least 1); embeddings and depth as the discriminator's."""
    hidden = max(1, int(round(config.hidden_size * fraction)))
    heads = max(1, hidden // 64)
    if hidden % heads:
        raise ValueError(
            f"generator_hidden_fraction={fraction!r} gives a generator of hidden size {hidden}, "
            f"which {heads} heads do not divide; choose a fraction giving a multiple of 64"
        )
    return dataclasses.replace(
        config, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden
    )


class Generator(nn.Module):
    """The generator's own parts: projection, layers and masked-LM head; it reads the
    discriminator's embedded tokens and word table."""

    config: ElectraConfig  # the generator's

    def setup(self):
        cfg = self.config
        if cfg.embedding_size != cfg.hidden_size:
            self.embeddings_project = model_lib._dense(
                cfg.bert, cfg.hidden_size, (EMBED, HIDDEN), "embeddings_project"
            )
        self.encoder = model_lib.Encoder(cfg.bert)
        self.mlm_head = model_lib.MlmHead(cfg.embedding)

    def __call__(self, embedded, attention_mask, masked_lm_positions, word_table, deterministic):
        cfg = self.config
        x = embedded  # [b, s, e]
        if cfg.embedding_size != cfg.hidden_size:
            x = self.embeddings_project(x)  # [b, s, e] -> [b, s, g]
        x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        x = self.encoder(x, attention_mask, deterministic, None, False, None)  # [b, s, g]
        x = jnp.take_along_axis(
            x, masked_lm_positions[..., None].astype(jnp.int32), axis=1
        )  # [b, p, g]
        return self.mlm_head(x, word_table)  # [b, p, v] float32


class ReplacedTokenDetection(nn.Module):
    """Generator and discriminator with shared embeddings (the module docstring's tree)."""

    config: ElectraConfig  # the discriminator's
    generator_config: ElectraConfig

    def setup(self):
        self.bert = ElectraEncoder(self.config)
        self.discriminator_head = DiscriminatorHead(self.config)
        self.generator = Generator(self.generator_config)

    def generator_logits(
        self, input_ids, token_type_ids, attention_mask, masked_lm_positions, *, deterministic
    ) -> jax.Array:
        """The generator's float32 logits [b, p, v] at the masked positions."""
        token_type_ids, attention_mask = model_lib._default_inputs(
            input_ids, token_type_ids, attention_mask
        )
        embedded = self.bert.embeddings(input_ids, token_type_ids, deterministic)  # [b, s, e]
        return self.generator(
            embedded, attention_mask, masked_lm_positions, self.bert.word_table(), deterministic
        )

    def replaced_logits(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
    ) -> jax.Array:
        """The discriminator's float32 logits [b, s] that each token was replaced."""
        x = self.bert.hidden_states(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
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
    config = dataclasses.replace(config, attention_impl="xla")
    generator = dataclasses.replace(generator, attention_impl="xla")

    def init_params(rng: jax.Array):
        ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
        return ReplacedTokenDetection(config, generator).init(
            {"params": rng}, ids, method=ReplacedTokenDetection.everything
        )["params"]

    return init_params
