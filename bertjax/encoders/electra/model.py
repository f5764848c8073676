"""ELECTRA's linen modules: BERT's embeddings and layers (bertjax.encoders.bert.model), an embedding
projection, and no tanh pooler.

`ElectraEncoder` is the family's module (the call of bertjax.encoders.family), under "bert":

  embeddings          BERT's Embeddings at the embedding width: word, position and token-type
                      tables [rows, embedding], summed, LayerNorm, dropout
  embeddings_project  dense [embedding, hidden]; only when embedding_size != hidden_size
  encoder             BERT's layers (plain or scanned)
  pooler              dense [hidden, hidden] on [CLS], see below

The pooled output. transformers' ElectraClassificationHead is dropout -> dense -> GELU ->
dropout -> out_proj on [CLS]: one head of two layers, which the family builds as one object
(`Electra.head` in bertjax.encoders.electra.family: its tensor map names classifier.dense and
classifier.out_proj, bertjax.encoders.electra.hf.head_tensors). The encoder computes
the head's first three steps as its pooled output, with the dense layer under `pooler`, where
BERT keeps its tanh pooler: every ELECTRA tree holds it there (pretraining and replaced-token
detection ones too, which never train it), so every checkpoint written so far keeps its
layout, a warm start copies one subtree, and Model.embed's "pooler" pooling reads it. The
head's module is the rest (dropout at classifier_rate, then out_proj). Token and span heads
read the hidden states, as ElectraForTokenClassification and ElectraForQuestionAnswering do.
A directory without classifier.dense (ElectraModel, ElectraForPreTraining, ...) starts it
fresh, as a BERT directory without its pooler does.

`ElectraPreTraining` is the tree transformers' pretraining classes are read into: the encoder,
the generator's masked-LM head ("mlm_head": ElectraGeneratorPredictions and the tied
generator_lm_head, which is BERT's MlmHead at the embedding width) and the discriminator's
replaced-token head ("discriminator_head": ElectraDiscriminatorPredictions, the family's head
for capability.REPLACED_TOKENS). A generator directory has the first, a discriminator
directory the second; the other starts fresh.

`Generator` is the family's generator (`generator`, bertjax.encoders.family.Generator): the
masked LM replaced-token detection trains beside a discriminator, reading the discriminator's
embedded tokens and word table. Its tree (under "generator" in a run's) is

    embeddings_project  its own [embedding, generator hidden] projection (only when the two
                        widths differ)
    encoder             BERT's layers at the generator's width
    mlm_head            dense -> GELU -> LayerNorm -> logits against the shared word table

and, opened alone, it is an ElectraPreTraining whose `bert/embeddings` are the
discriminator's, as transformers' ElectraForMaskedLM holds them.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import capability
from bertjax.encoders import family
from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.electra.config import ElectraConfig, generator_config
from bertjax.nn import sharding, unpadding
from bertjax.nn.sharding import ACTIVATION_EMBED, BATCH, EMBED, HIDDEN, LABELS, LENGTH

MLM_HEAD = "mlm_head"
DISCRIMINATOR_HEAD = capability.REPLACED_TOKENS.param
PROJECTION = "embeddings_project"
POOLER = "pooler"
ENCODER = capability.ENCODER
EMBEDDINGS = "embeddings"
LAYERS = "encoder"


def _gelu(config: ElectraConfig, x: jax.Array) -> jax.Array:
    """The exact GELU of ELECTRA's classification head, whatever hidden_act says (the
    embedding config's activation is always "gelu")."""
    return model_lib._activation(config.embedding, x)


class ElectraEncoder(nn.Module):
    """Embeddings, projection and BERT's layers; returns (sequence_output [b, s, h],
    pooled [b, h]) with the families' call (bertjax.encoders.family). ``token_head`` changes
    nothing (ELECTRA's token heads read the hidden states). ``packed_length``, ``cls_only``,
    ``document_ids`` and ``positions`` work as in bertjax.encoders.bert.model.BertModel."""

    config: ElectraConfig

    def setup(self):
        cfg = self.config
        self.embeddings = model_lib.Embeddings(cfg.embedding)
        if cfg.embedding_size != cfg.hidden_size:
            self.embeddings_project = model_lib._dense(
                cfg.bert, cfg.hidden_size, (EMBED, HIDDEN), PROJECTION
            )
        self.encoder = model_lib.Encoder(cfg.bert)
        self.pooler_dropout = model_lib.Dropout(cfg.classifier_rate)
        self.pooler = model_lib._dense(cfg.bert, cfg.hidden_size, (EMBED, HIDDEN), POOLER)

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
        cls_only: bool = False,
        token_head: bool = False,
        document_ids=None,
        positions=None,
    ):
        cfg = self.config
        x = self.hidden_states(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            cls_only=cls_only,
            document_ids=document_ids,
            positions=positions,
        )  # [b, s or 1, h]
        first = self.pooler_dropout(x[:, 0], deterministic=deterministic)  # [b, h]
        pooled = _gelu(cfg, self.pooler(first))  # [b, h]
        return x, sharding.constrain(pooled, (BATCH, ACTIVATION_EMBED))

    def hidden_states(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
        cls_only: bool = False,
        document_ids=None,
        positions=None,
    ) -> jax.Array:
        """The last hidden states [b, s, h] ([b, 1, h] with ``cls_only``), zero at padded
        positions when packed: ElectraModel's last_hidden_state."""
        cfg = self.config
        seq_len = input_ids.shape[-1]
        if (document_ids is None) != (positions is None):
            raise ValueError("document_ids and positions go together: give both or neither")
        if seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        token_type_ids, attention_mask = model_lib._default_inputs(
            input_ids, token_type_ids, attention_mask
        )
        if document_ids is not None:
            document_ids = jnp.where(attention_mask.astype(bool), document_ids, 0)  # [b, s]
        x = self.embeddings(input_ids, token_type_ids, deterministic, positions=positions)
        if cfg.embedding_size != cfg.hidden_size:
            x = self.embeddings_project(x)  # [b, s, e] -> [b, s, h]
        x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        index = None
        if packed_length is not None:
            index = unpadding.packing_index(attention_mask, packed_length, sharding.shards(BATCH))
            x = unpadding.pack_tokens(x, index)  # [g, c, h]
            x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        x = self.encoder(x, attention_mask, deterministic, index, cls_only, document_ids)
        if index is not None and not cls_only:  # x is packed [g, c, h]
            batch, seq = input_ids.shape
            x = unpadding.unpack_tokens(x, index, batch, seq)  # [b, s, h]
        return sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))

    def embed(self, input_ids, token_type_ids=None, *, deterministic=True, positions=None):
        """The embedded tokens [b, s, e] at the embedding width, before the projection."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        return self.embeddings(input_ids, token_type_ids, deterministic, positions=positions)

    def word_table(self) -> jax.Array:
        """The word-embedding matrix [vocab, embedding] (the generator's decoder is tied)."""
        return self.embeddings.word_table()


class DiscriminatorHead(nn.Module):
    """transformers' ElectraDiscriminatorPredictions: dense [h, h] -> hidden_act -> dense
    [h, 1]; float32 logits [b, s, 1] that a token was replaced."""

    config: ElectraConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config.bert
        x = model_lib._dense(cfg, cfg.hidden_size, (EMBED, HIDDEN), "dense")(x)  # [b, s, h]
        x = model_lib._activation(cfg, x)
        return model_lib._dense(cfg, 1, (EMBED, LABELS), "dense_prediction", dtype="float32")(
            x
        )  # [b, s, 1]


class ElectraPreTraining(nn.Module):
    """The encoder ("bert") with the generator's masked-LM head and the discriminator's
    replaced-token head (the module docstring says which directory has which).

    Called, it is the family's pretraining model (bertjax.encoders.family): the masked-LM
    logits at ``masked_lm_positions`` (every position without them) and no sentence-pair
    head."""

    config: ElectraConfig

    def setup(self):
        cfg = self.config
        self.bert = ElectraEncoder(cfg)
        self.mlm_head = model_lib.MlmHead(cfg.embedding)
        self.discriminator_head = DiscriminatorHead(cfg)

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        masked_lm_positions=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
        document_ids=None,
        positions=None,
    ) -> family.PretrainingOutput:
        x = self.bert.hidden_states(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=document_ids,
            positions=positions,
        )  # [b, s, h]
        gathered = x
        if masked_lm_positions is not None:
            # The head runs at the predicted positions only.
            gathered = jnp.take_along_axis(
                x, masked_lm_positions[..., None].astype(jnp.int32), axis=1
            )  # [b, p, h]
        logits = self.mlm_head(gathered, self.bert.word_table())  # [b, p, v]
        return family.PretrainingOutput(mlm_logits=logits, nsp_logits=None, sequence_output=x)

    def everything(self, input_ids, token_type_ids=None, attention_mask=None):
        """Every output, so that `init` makes every parameter (the pooler's and the
        discriminator head's too)."""
        sequence, pooled = self.bert(input_ids, token_type_ids, attention_mask)
        return (
            self(input_ids, token_type_ids, attention_mask),
            self.discriminator_head(sequence),
            pooled,
        )


def pretraining_init(config: ElectraConfig):
    """`rng -> boxed parameters` of `ElectraPreTraining` (every group)."""
    # The parameters do not depend on the attention implementation; a one-token row is no
    # shape for a fused kernel to compile for.
    config = dataclasses.replace(config, attention_impl="xla")

    def init(rng: jax.Array):
        ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
        return ElectraPreTraining(config).init(
            {"params": rng}, ids, method=ElectraPreTraining.everything
        )["params"]

    return init


class Generator(nn.Module):
    """The generator's own parts (the module docstring's tree): projection, layers and
    masked-LM head, reading another network's embedded tokens and word table; called as
    `ElectraPreTraining` is, with ``embedded`` [b, s, e] and ``word_table`` [v, e]."""

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
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        masked_lm_positions=None,
        *,
        embedded,
        word_table,
        deterministic: bool = True,
        packed_length: int | None = None,
        document_ids=None,
        positions=None,
    ) -> family.PretrainingOutput:
        """``document_ids`` [b, s] of packed rows: each token attends to its own document
        (``positions`` are in `embedded` already). The layers run padded (no packing)."""
        cfg = self.config
        _, attention_mask = model_lib._default_inputs(input_ids, token_type_ids, attention_mask)
        if document_ids is not None:
            document_ids = jnp.where(attention_mask.astype(bool), document_ids, 0)  # [b, s]
        x = embedded  # [b, s, e]
        if cfg.embedding_size != cfg.hidden_size:
            x = self.embeddings_project(x)  # [b, s, e] -> [b, s, g]
        x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        x = self.encoder(x, attention_mask, deterministic, None, False, document_ids)  # [b, s, g]
        gathered = x
        if masked_lm_positions is not None:
            gathered = jnp.take_along_axis(
                x, masked_lm_positions[..., None].astype(jnp.int32), axis=1
            )  # [b, p, g]
        logits = self.mlm_head(gathered, word_table)  # [b, p, v] float32
        return family.PretrainingOutput(mlm_logits=logits, nsp_logits=None, sequence_output=x)


def _generator_pretraining_params(own, encoder) -> dict:
    """ElectraPreTraining's tree of a generator's parameters: the shared embeddings under its
    encoder, its head as `mlm_head` (no pooler, no discriminator head)."""
    bert = {EMBEDDINGS: encoder[EMBEDDINGS], LAYERS: own[LAYERS]}
    if PROJECTION in own:
        bert[PROJECTION] = own[PROJECTION]
    return {ENCODER: bert, MLM_HEAD: own[MLM_HEAD]}


def generator(config: ElectraConfig, fraction: float) -> family.Generator:
    """The family's generator beside a discriminator of `config` (config.generator_config)."""
    small = generator_config(config, fraction)
    return family.Generator(small, Generator(small), _generator_pretraining_params)
