"""Replaced-token detection (bertjax.pretrain.objectives.rtd) on ModernBERT: a generator and a
discriminator sharing the token embeddings, in one linen module.

ModernBERT has no embedding size of its own, so the generator reads the discriminator's
embedded tokens (token table and its norm, hidden size h wide) through its own projection to
its width g. Parameter tree:

  bert                the discriminator's encoder: ModernBertForMaskedLM's "bert" subtree
                      (the family's Encoder), so fine-tuning's init_from and save_hf read it
                      as any ModernBERT encoder; its prediction head ("head") is never run
                      here (frozen, `FROZEN`)
  discriminator_head  dense [h, h] -> GELU -> dense [h, 1], as ELECTRA's discriminator head
  generator/          a MaskedLM of `generator_config` without its embeddings:
    bert/embeddings_project  [h, g] (only when g != h)
    bert/layer_*, bert/final_norm  the discriminator's depth and global/local pattern at g
    bert/head         dense [g, h] -> GELU -> LayerNorm (h)
    decoder_bias      [v]; the logits are against the shared token table

Opened alone (`networks`), the generator is a ModernBertForMaskedLM-shaped tree of
`generator_config` (embedding_size h) whose embeddings are the shared ones; the
discriminator is the family's masked-LM tree with `discriminator_head`, its decoder bias and
prediction head untrained.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import capability
from bertjax.encoders.family import Network, ReplacedTokenDetector, replaced_token_detector
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.encoders.modernbert.model import (
    DECODER_BIAS,
    HEAD,
    Encoder,
    MaskedLM,
    Projection,
    _stds,
    gelu,
)
from bertjax.engine import perf
from bertjax.nn import sharding
from bertjax.nn.sharding import BATCH, EMBED, HIDDEN, LABELS, LENGTH

GENERATOR = "generator"
DISCRIMINATOR_HEAD = "discriminator_head"
ENCODER = capability.ENCODER
EMBEDDINGS = "embeddings"
# The encoder's prediction head (the masked LM's and the classifiers' trunk): the
# discriminator never runs it, so it keeps its initial values (AdamW's decay would shrink
# them otherwise).
FROZEN = (f"{ENCODER}/{HEAD}",)
# Attention heads are this wide in the generator (ELECTRA: hidden // 64 heads).
HEAD_WIDTH = 64


def generator_config(config: ModernBertConfig, fraction: float) -> ModernBertConfig:
    """The generator's config for a discriminator's: hidden size g = round(fraction * h),
    heads g // 64 (at least 1), feed-forward scaled by the same fraction, the same depth and
    layer pattern, embeddings h wide (the discriminator's, projected to g)."""
    hidden = max(1, int(round(config.hidden_size * fraction)))
    heads = max(1, hidden // HEAD_WIDTH)
    if hidden % heads or (hidden // heads) % 2:
        raise ValueError(
            f"generator_hidden_fraction={fraction!r} gives a generator of hidden size {hidden}, "
            f"which does not split into {heads} heads of even size; choose a fraction giving "
            "a multiple of 64 (or an even size under 64)"
        )
    return dataclasses.replace(
        config,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=max(1, int(round(config.intermediate_size * fraction))),
        embedding_size=config.embedding_width,
    )


class DiscriminatorHead(nn.Module):
    """dense [h, h] -> GELU -> dense [h, 1]: float32 logits [b, s] that a token was replaced."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        h, std = cfg.hidden_size, _stds(cfg)["in"]
        x = Projection(
            cfg, "bsh,hk->bsk", (h, h), (EMBED, HIDDEN), (HIDDEN,), std, True, name="dense"
        )(x)  # [b, s, h]
        logits = Projection(
            cfg,
            "bsh,hk->bsk",
            (h, 1),
            (EMBED, LABELS),
            (LABELS,),
            std,
            True,
            dtype="float32",
            name="dense_prediction",
        )(gelu(x))  # [b, s, 1]
        return sharding.constrain(logits[..., 0], (BATCH, LENGTH))  # [b, s]


class Discriminator(nn.Module):
    """The encoder ("bert") and its replaced-token head: `replaced_logits`."""

    config: ModernBertConfig

    def setup(self):
        self.bert = Encoder(self.config)
        self.discriminator_head = DiscriminatorHead(self.config)

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
        x, _ = self.bert(
            input_ids,
            None,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=document_ids,
            positions=positions,
        )  # [b, s, h]
        return self.discriminator_head(x)


class ReplacedTokenDetection(Discriminator):
    """Generator and discriminator with shared token embeddings (the module docstring)."""

    generator_config: ModernBertConfig | None = None

    def setup(self):
        super().setup()
        self.generator = MaskedLM(self.generator_config)

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
        """The generator's float32 logits [b, p, v] at the masked positions."""
        embedded = self.bert.embeddings(input_ids, deterministic)  # [b, s, h]
        return self.generator(
            input_ids,
            None,
            attention_mask,
            masked_lm_positions,
            deterministic=deterministic,
            document_ids=document_ids,
            positions=positions,
            embedded=embedded,
            table=self.bert.token_table(),
        ).mlm_logits

    def everything(self, input_ids):
        """Every output, so that `init` makes every parameter (the prediction head too, so
        the discriminator's encoder is the masked LM's whole)."""
        positions = jnp.zeros(input_ids.shape, jnp.int32)  # [b, s]
        return (
            self.generator_logits(input_ids, None, None, positions, deterministic=True),
            self.replaced_logits(input_ids),
        )


def flops(config: ModernBertConfig, generator: ModernBertConfig, seq_len: int, predictions: int):
    """Both networks: each encoder as perf counts it, the discriminator's head on every
    token, the generator's projection on every token and its head on the predictions."""
    s, v = float(seq_len), float(config.vocab_size)
    h, g = float(config.hidden_size), float(generator.hidden_size)
    total = 0.0
    for network in (config, generator):
        total += perf.training_flops_per_sequence(
            network, seq_len, 0, feed_forward_matrices=3, sentence_pair_head=False
        )
    total += 3.0 * s * (2 * h * h + 2 * h)  # the discriminator's head
    if g != h:
        total += 3.0 * s * 2 * h * g  # the generator's projection
    total += 3.0 * predictions * (2 * g * h + 2 * h * v)  # the generator's head
    return total


def detector(config: ModernBertConfig, fraction: float) -> ReplacedTokenDetector:
    """The family's ReplacedTokenDetector (bertjax.encoders.family)."""
    generator = generator_config(config, fraction)
    return replaced_token_detector(ReplacedTokenDetection, config, generator, flops)


def generator_fraction(config: ModernBertConfig, params: Any) -> float:
    """The generator's width over the discriminator's, read off a run's parameters."""
    width = np.shape(params[GENERATOR][ENCODER]["final_norm"]["scale"])[0]
    return width / config.hidden_size


def has_generator(params: Any) -> bool:
    return isinstance(params, dict) and GENERATOR in params


def networks(config: ModernBertConfig, params: Any, fresh: tuple[str, ...]) -> dict:
    """The two networks of a run's tree: "" the discriminator (the family's masked-LM tree
    with `discriminator_head`; its decoder bias made fresh, the groups `fresh` names
    untrained) and "generator" (a masked LM of generator_config reading the shared
    embeddings)."""
    own = params[GENERATOR]
    generator = {
        ENCODER: {**own[ENCODER], EMBEDDINGS: params[ENCODER][EMBEDDINGS]},
        **{name: value for name, value in own.items() if name != ENCODER},
    }
    discriminator = {name: value for name, value in params.items() if name != GENERATOR}
    if config.decoder_bias:
        # The discriminator has no masked-LM decoder: zeros, as a fresh one starts.
        discriminator[DECODER_BIAS] = np.zeros((config.vocab_size,), np.dtype(config.param_dtype))
    return {
        "": Network(config, discriminator, fresh),
        GENERATOR: Network(generator_config(config, generator_fraction(config, params)), generator),
    }
