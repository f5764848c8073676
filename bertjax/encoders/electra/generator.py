"""ELECTRA's generator beside its discriminator: the small masked LM that replaced-token
detection (bertjax.pretrain.objectives.rtd) trains with the discriminator, and how a run that
trained both is opened as two ELECTRA models.

A run's tree is the discriminator's (ElectraPreTraining's `bert` and `discriminator_head`)
plus `generator`:

  generator/
    embeddings_project  the generator's own [embedding, generator hidden] projection (only
                        when the two widths differ)
    encoder             BERT's layers at the generator's width
    mlm_head            dense -> GELU -> LayerNorm -> logits against the shared word table

The generator reads the discriminator's embeddings (word, position and token-type tables and
their LayerNorm), so opened alone it is an ElectraPreTraining whose `bert/embeddings` are
those, as transformers' ElectraForMaskedLM holds them. Its shape is ELECTRA's
(google-research/electra, run_pretraining.py's get_generator_config): the discriminator's depth
and embeddings, hidden size a fraction of it, FFN four times that, heads hidden // 64.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bertjax import capability
from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.electra.config import ElectraConfig
from bertjax.encoders.electra.model import DISCRIMINATOR_HEAD, MLM_HEAD, PROJECTION
from bertjax.nn import sharding
from bertjax.nn.sharding import ACTIVATION_EMBED, BATCH, EMBED, HIDDEN, LENGTH

GENERATOR = "generator"
# Where the encoder's own groups sit in both trees.
ENCODER = capability.ENCODER
EMBEDDINGS = "embeddings"
LAYERS = "encoder"


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
                cfg.bert, cfg.hidden_size, (EMBED, HIDDEN), PROJECTION
            )
        self.encoder = model_lib.Encoder(cfg.bert)
        self.mlm_head = model_lib.MlmHead(cfg.embedding)

    def __call__(
        self,
        embedded,
        attention_mask,
        masked_lm_positions,
        word_table,
        deterministic,
        document_ids=None,
    ):
        """`document_ids` [b, s] of packed rows: each token attends to its own document."""
        cfg = self.config
        x = embedded  # [b, s, e]
        if cfg.embedding_size != cfg.hidden_size:
            x = self.embeddings_project(x)  # [b, s, e] -> [b, s, g]
        x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        x = self.encoder(x, attention_mask, deterministic, None, False, document_ids)  # [b, s, g]
        x = jnp.take_along_axis(
            x, masked_lm_positions[..., None].astype(jnp.int32), axis=1
        )  # [b, p, g]
        return self.mlm_head(x, word_table)  # [b, p, v] float32


def has_generator(params: Any) -> bool:
    return isinstance(params, dict) and GENERATOR in params


def trained_config(config: ElectraConfig, params: Any) -> ElectraConfig:
    """The generator's config, read off its parameters' widths (the run's fraction)."""
    layer = params[GENERATOR][MLM_HEAD]["transform"]["kernel"]  # [g, e]
    return generator_config(config, layer.shape[0] / config.hidden_size)


def discriminator(params: Any) -> dict:
    """The discriminator's groups of a run's tree (ElectraPreTraining's, without mlm_head)."""
    return {name: value for name, value in params.items() if name != GENERATOR}


def generator(config: ElectraConfig, params: Any) -> tuple[ElectraConfig, dict]:
    """The generator of a run's tree as a model of its own: (its config, ElectraPreTraining's
    tree of it: the shared embeddings under its encoder, its head as `mlm_head`)."""
    own = params[GENERATOR]
    encoder = {EMBEDDINGS: params[ENCODER][EMBEDDINGS], LAYERS: own[LAYERS]}
    if PROJECTION in own:
        encoder[PROJECTION] = own[PROJECTION]
    return trained_config(config, params), {ENCODER: encoder, MLM_HEAD: own[MLM_HEAD]}


# The group each network of a run lacks as an ElectraPreTraining (freshly made when opened).
DISCRIMINATOR_LACKS = (MLM_HEAD,)
GENERATOR_LACKS = (DISCRIMINATOR_HEAD,)
