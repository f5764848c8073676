"""BERT for pretraining (masked LM + next-sentence prediction) as Flax linen modules.

Einsum letters used throughout:
  b batch   s sequence (queries)   t sequence (keys)   h hidden size
  n heads   d head size (h // n)   f FFN intermediate  v vocabulary   p masked-LM predictions

Layout follows google-research/bert: post-LayerNorm residual blocks, a tanh pooler on [CLS],
an MLM head whose decoder is tied to the word-embedding table, an NSP head on the pooled
output. Parameters live in ``param_dtype``; matmuls run in ``dtype``; softmax, LayerNorm
statistics and the logits handed to the losses are float32.

Initialisation: ``jax.nn.initializers.truncated_normal(initializer_range)``, which samples a
standard normal truncated at +-2 and multiplies by the stddev without rescaling -- the same
distribution as TensorFlow's ``truncated_normal(stddev=initializer_range)`` used by BERT.
Biases are zero, LayerNorm scales one. ``head_init="lecun_normal"`` is an opt-in departure for
the MLM-transform and NSP kernels only (see config.HEAD_INITS).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax.encoders.bert.config import STACKED_LAYERS, BertConfig
from bertjax.nn import attention as attention_lib
from bertjax.nn import low_precision, sharding
from bertjax.nn.sharding import (
    ACTIVATION_EMBED,
    BATCH,
    CLASSES,
    EMBED,
    HEADS,
    HIDDEN,
    KV,
    LAYERS,
    LENGTH,
    MLP,
    POSITION,
    TOKEN_TYPE,
    VOCAB,
)
from bertjax.nn.unpadding import first_tokens, pack_tokens, packing_index, unpack_tokens


class BertOutput(NamedTuple):
    """Outputs of BertForPreTraining; logits are float32."""

    sequence_output: jax.Array  # [batch, seq, hidden]
    pooled_output: jax.Array  # [batch, hidden]
    mlm_logits: jax.Array  # [batch, predictions, vocab], or [batch, seq, vocab]
    nsp_logits: jax.Array  # [batch, 2]


def _init(config: BertConfig):
    return nn.initializers.truncated_normal(config.initializer_range)


def _head_init(config: BertConfig):
    """The initialiser of the MLM-transform and NSP kernels (BertConfig.head_init)."""
    if config.head_init == "lecun_normal":
        return nn.initializers.lecun_normal()
    return _init(config)


def _param(module: nn.Module, name: str, init, shape: tuple[int, ...], names, config):
    """A parameter annotated with logical axis names, stored in param_dtype."""
    return module.param(
        name, nn.with_logical_partitioning(init, names), shape, jnp.dtype(config.param_dtype)
    )


def _dense(config: BertConfig, features: int, names, name: str, dtype=None, init=None) -> nn.Dense:
    return nn.Dense(
        features,
        dtype=jnp.dtype(dtype or config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
        kernel_init=nn.with_logical_partitioning(init or _init(config), names),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (names[-1],)),
        dot_general=functools.partial(low_precision.dot_general, operand_dtype=config.matmul_dtype),
        name=name,
    )


def _layer_norm(config: BertConfig, name: str = "layer_norm") -> nn.LayerNorm:
    # flax computes the mean and variance in float32 even for bfloat16 inputs.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (HIDDEN,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (HIDDEN,)),
        name=name,
    )


def _activation(config: BertConfig, x: jax.Array) -> jax.Array:
    if config.hidden_act == "gelu_tanh":
        return nn.gelu(x, approximate=True)
    # Exact GELU written with erf, as transformers and torch compute it. jax.nn.gelu's erfc
    # form is equal to within 1e-6 but about three times slower on CPU.
    return 0.5 * x * (1.0 + jax.lax.erf(x * np.float32(1 / math.sqrt(2))).astype(x.dtype))


class Dropout(nn.Module):
    """Inverted dropout drawing 16 random bits per element (attention.dropout_keep_mask)."""

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        keep_prob = 1.0 - self.rate
        keep = attention_lib.dropout_keep_mask(self.make_rng("dropout"), keep_prob, x.shape)
        return jnp.where(keep, x / keep_prob, 0).astype(x.dtype)


def sinusoidal_table(length: int, width: int) -> np.ndarray:
    """The Transformer's fixed position table: sin on even columns, cos on odd ones."""
    positions = np.arange(length, dtype=np.float64)[:, None]  # [length, 1]
    rates = 1.0 / np.power(10000.0, np.arange(0, width, 2, dtype=np.float64) / width)
    angles = positions * rates[None, :]  # [length, width / 2]
    table = np.zeros((length, width), np.float32)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table


class Embeddings(nn.Module):
    """Word + segment + position embeddings, summed, LayerNorm, dropout."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        table = lambda rows, row_name, name: nn.Embed(  # noqa: E731
            rows,
            cfg.hidden_size,
            dtype=jnp.dtype(cfg.dtype),
            param_dtype=jnp.dtype(cfg.param_dtype),
            embedding_init=nn.with_logical_partitioning(_init(cfg), (row_name, EMBED)),
            name=name,
        )
        self.word_embeddings = table(cfg.vocab_size, VOCAB, "word_embeddings")
        if cfg.position_embedding_type == "learned":
            self.position_embeddings = table(
                cfg.max_position_embeddings, POSITION, "position_embeddings"
            )
        self.token_type_embeddings = table(cfg.type_vocab_size, TOKEN_TYPE, "token_type_embeddings")
        self.layer_norm = _layer_norm(cfg)
        self.dropout = Dropout(cfg.hidden_dropout)

    def __call__(self, input_ids, token_type_ids, deterministic: bool, start=None, positions=None):
        """``start`` (an int or int scalar array): the position of the first token, for a
        decoder that embeds one token at a time; positions count from 0 without it.
        ``positions`` [batch, seq]: each token's own position (packed documents restart at 0)."""
        cfg = self.config
        seq_len = input_ids.shape[1]
        offset = 0 if start is None else start
        if positions is not None:
            if cfg.position_embedding_type == "learned":
                table = self.position_embeddings.embedding  # [max_positions, hidden]
            else:
                table = sinusoidal_table(cfg.max_position_embeddings, cfg.hidden_size)
            table = jnp.asarray(table).astype(jnp.dtype(cfg.dtype))
            positions = jnp.take(table, positions, axis=0)  # [batch, seq, hidden]
        elif cfg.position_embedding_type == "learned":
            positions = self.position_embeddings(offset + jnp.arange(seq_len))  # [seq, hidden]
        else:
            table = sinusoidal_table(
                seq_len if start is None else cfg.max_position_embeddings, cfg.hidden_size
            )
            positions = jax.lax.dynamic_slice_in_dim(
                jnp.asarray(table, jnp.dtype(cfg.dtype)), offset, seq_len
            )  # [seq, hidden]
        if positions.ndim == 2:
            positions = positions[None]  # [1, seq, hidden]
        x = (
            self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) + positions
        )  # [batch, seq, hidden]
        x = self.layer_norm(x)
        x = self.dropout(x, deterministic=deterministic)
        return sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))

    def word_table(self) -> jax.Array:
        """The word-embedding matrix [vocab, hidden] (the MLM decoder is tied to it)."""
        return self.word_embeddings.embedding


class HeadsProjection(nn.Module):
    """hidden -> [heads, head_dim] projection with bias (query, key or value)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        n, d = cfg.num_heads, cfg.head_dim
        kernel = _param(
            self, "kernel", _init(cfg), (cfg.hidden_size, n, d), (EMBED, HEADS, KV), cfg
        )
        bias = _param(self, "bias", nn.initializers.zeros_init(), (n, d), (HEADS, KV), cfg)
        dtype = jnp.dtype(cfg.dtype)
        y = low_precision.einsum(
            "bsh,hnd->bsnd", x.astype(dtype), kernel.astype(dtype), operand_dtype=cfg.matmul_dtype
        )  # [b, s, n, d]
        return y + bias.astype(dtype)


class OutputProjection(nn.Module):
    """[heads, head_dim] -> hidden projection with bias (attention output)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        n, d = cfg.num_heads, cfg.head_dim
        kernel = _param(
            self, "kernel", _init(cfg), (n, d, cfg.hidden_size), (HEADS, KV, EMBED), cfg
        )
        bias = _param(
            self, "bias", nn.initializers.zeros_init(), (cfg.hidden_size,), (HIDDEN,), cfg
        )
        dtype = jnp.dtype(cfg.dtype)
        y = low_precision.einsum(
            "bsnd,ndh->bsh", x.astype(dtype), kernel.astype(dtype), operand_dtype=cfg.matmul_dtype
        )  # [b, s, h]
        return y + bias.astype(dtype)


class SelfAttention(nn.Module):
    """Multi-head self-attention, dropout, residual, post-LayerNorm.

    ``queries`` ([batch, q, hidden], unpacked) computes the output at those positions only,
    attending over all of x; without it every position of x is a query. ``document_ids``
    [batch, seq] (packed documents, 0 for padding): each token attends to its own document
    only; ``queries`` are then the rows' first tokens.
    """

    config: BertConfig

    @nn.compact
    def __call__(
        self,
        x,
        attention_mask,
        deterministic: bool,
        token_index=None,
        document_ids=None,
        queries=None,
    ):
        cfg = self.config
        qkv_names = (BATCH, LENGTH, HEADS, KV)
        query_input = x if queries is None else queries
        q = sharding.constrain(HeadsProjection(cfg, name="query")(query_input), qkv_names)
        k = sharding.constrain(HeadsProjection(cfg, name="key")(x), qkv_names)  # [b, t, n, d]
        v = sharding.constrain(HeadsProjection(cfg, name="value")(x), qkv_names)  # [b, t, n, d]
        if token_index is not None:  # x is packed [g, c, h]: attention needs whole sequences
            batch, seq = attention_mask.shape
            unpack = lambda t: sharding.constrain(  # noqa: E731
                unpack_tokens(t, token_index, batch, seq), qkv_names
            )  # [b, s, n, d]
            k, v = unpack(k), unpack(v)
            if queries is None:
                q = unpack(q)
        dropout_active = not deterministic and cfg.attention_dropout > 0
        context = attention_lib.dot_product_attention(
            *low_precision.rounded(cfg.matmul_dtype, q, k, v),
            attention_mask,
            # The fused kernels expect as many queries as keys; a few queries are a cheap
            # matrix-vector product for xla.
            implementation=cfg.attention_impl if queries is None else "xla",
            dropout_rate=cfg.attention_dropout,
            dropout_rng=self.make_rng("dropout") if dropout_active else None,
            deterministic=deterministic,
            document_ids=document_ids,
            query_document_ids=(
                None if document_ids is None or queries is None else document_ids[:, :1]
            ),
        ).astype(cfg.dtype)  # [b, s, n, d]
        context = sharding.constrain(context, qkv_names)
        if token_index is not None and queries is None:
            context = sharding.constrain(pack_tokens(context, token_index), qkv_names)
        y = OutputProjection(cfg, name="output")(context)  # [b, s, h]
        y = Dropout(cfg.hidden_dropout)(y, deterministic=deterministic)
        return _layer_norm(cfg)(y + query_input)


class FeedForward(nn.Module):
    """hidden -> intermediate, GELU, -> hidden, dropout, residual, post-LayerNorm."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, deterministic: bool):
        cfg = self.config
        y = _dense(cfg, cfg.intermediate_size, (EMBED, MLP), "intermediate")(x)  # [b, s, f]
        y = sharding.constrain(_activation(cfg, y), (BATCH, LENGTH, MLP))
        y = _dense(cfg, cfg.hidden_size, (MLP, EMBED), "output")(y)  # [b, s, h]
        y = Dropout(cfg.hidden_dropout)(y, deterministic=deterministic)
        return _layer_norm(cfg)(y + x)


class TransformerLayer(nn.Module):
    """One encoder layer. ``scanned`` makes it return ``(x, None)`` for nn.scan.

    With ``token_index`` (packing_index) x is packed [groups, packed_length, hidden]. With
    ``queries`` (see SelfAttention) the output is [batch, q, hidden] at those positions.
    """

    config: BertConfig
    scanned: bool = False

    @nn.compact
    def __call__(
        self,
        x,
        attention_mask,
        deterministic: bool,
        token_index=None,
        document_ids=None,
        queries=None,
    ):
        x = SelfAttention(self.config, name="attention")(
            x, attention_mask, deterministic, token_index, document_ids, queries
        )
        x = FeedForward(self.config, name="mlp")(x, deterministic)
        x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        return (x, None) if self.scanned else x


_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.dots_saveable,
}


class Encoder(nn.Module):
    """The stack of layers: plain (layer_0..), rematerialised, and/or nn.scan'd ("layers").

    ``cls_only`` returns only each row's [CLS] output, [batch, 1, hidden]: the plain stack
    then runs its last layer's queries, feed-forward and LayerNorms at [CLS] alone (its keys
    and values still come from every token), which is all a pooled head reads. The scanned
    stack shares one layer body, so it computes every position and takes [CLS] after.
    """

    config: BertConfig

    @nn.compact
    def __call__(
        self,
        x,
        attention_mask,
        deterministic: bool,
        token_index=None,
        cls_only=False,
        document_ids=None,
    ):
        cfg = self.config
        layer_cls = TransformerLayer
        if cfg.remat_policy != "none":
            # argnum 3 (counting self) is `deterministic`: a Python bool, must stay static.
            layer_cls = nn.remat(
                layer_cls, policy=_REMAT_POLICIES[cfg.remat_policy], static_argnums=(3,)
            )
        if cfg.scan_layers:
            stack = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: LAYERS},
            )(cfg, scanned=True, name=STACKED_LAYERS)
            x, _ = stack(x, attention_mask, deterministic, token_index, document_ids)
            return first_tokens(x, attention_mask, token_index) if cls_only else x
        for i in range(cfg.num_layers):
            layer = layer_cls(cfg, name=f"layer_{i}")
            if cls_only and i == cfg.num_layers - 1:
                queries = first_tokens(x, attention_mask, token_index)  # [b, 1, h]
                # [b, 1, h]
                return layer(x, attention_mask, deterministic, token_index, document_ids, queries)
            x = layer(x, attention_mask, deterministic, token_index, document_ids)
        return x


def _default_inputs(input_ids, token_type_ids, attention_mask):
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {input_ids.shape}")
    if token_type_ids is None:
        token_type_ids = jnp.zeros_like(input_ids)
    if attention_mask is None:
        attention_mask = jnp.ones_like(input_ids)
    return token_type_ids, attention_mask


class BertModel(nn.Module):
    """Embeddings, encoder and pooler; returns (sequence_output [B,S,H], pooled_output [B,H]).

    ``packed_length`` (an int) runs the encoder on real tokens only, packed into that many
    slots per batch shard (see bertjax.nn.unpadding); every group must hold at most that many real
    tokens (tokens_per_group). Outputs at real positions are the same as unpacked;
    sequence_output is zero at padded positions.

    ``cls_only`` skips what only the other positions' outputs need (see Encoder): the pooled
    output is the same, and sequence_output is [batch, 1, hidden], the [CLS] position alone.

    ``document_ids`` and ``positions`` ([batch, seq] ints, given together) run rows of packed
    documents: a token attends to the tokens of its own document only (ids 1.., 0 for
    padding; the ids are zeroed where attention_mask is 0) and its position embedding is
    looked up at ``positions`` (restarting at 0 per document). Without them nothing changes.
    The pooled output reads the row's first document.
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.pooler = _dense(cfg, cfg.hidden_size, (EMBED, HIDDEN), "pooler")

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic=True,
        packed_length: int | None = None,
        cls_only: bool = False,
        document_ids=None,
        positions=None,
    ):
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
        pooled = jnp.tanh(self.pooler(x[:, 0]))  # [b, h]
        return x, sharding.constrain(pooled, (BATCH, ACTIVATION_EMBED))

    def hidden_states(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic=True,
        packed_length: int | None = None,
        cls_only: bool = False,
        document_ids=None,
        positions=None,
    ) -> jax.Array:
        """The last hidden states [b, s, h] ([b, 1, h] with ``cls_only``), zero at padded
        positions when packed: BertModel's last_hidden_state, no pooler."""
        cfg = self.config
        seq_len = input_ids.shape[-1]
        if (document_ids is None) != (positions is None):
            raise ValueError("document_ids and positions go together: give both or neither")
        if cfg.position_embedding_type == "learned" and seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        token_type_ids, attention_mask = _default_inputs(input_ids, token_type_ids, attention_mask)
        if document_ids is not None:
            document_ids = jnp.where(attention_mask.astype(bool), document_ids, 0)  # [b, s]
        x = self.embeddings(input_ids, token_type_ids, deterministic, positions=positions)
        index = None
        if packed_length is not None:
            index = packing_index(attention_mask, packed_length, sharding.shards(BATCH))
            x = sharding.constrain(pack_tokens(x, index), (BATCH, LENGTH, ACTIVATION_EMBED))
        x = self.encoder(x, attention_mask, deterministic, index, cls_only, document_ids)
        if index is not None and not cls_only:  # x is packed [g, c, h]
            batch, seq = input_ids.shape
            x = unpack_tokens(x, index, batch, seq)  # [b, s, h]
        return sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))  # [b, s or 1, h]

    def embed(self, input_ids, token_type_ids=None, *, deterministic=True, positions=None):
        """The embedded tokens [b, s, h] the layers read (word, position and token-type
        tables summed, LayerNorm, dropout)."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        return self.embeddings(input_ids, token_type_ids, deterministic, positions=positions)

    def word_table(self) -> jax.Array:
        """The word-embedding matrix [vocab, hidden]."""
        return self.embeddings.word_table()


class MlmHead(nn.Module):
    """Dense + GELU + LayerNorm, then logits against the tied word embeddings + bias."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, word_table):
        cfg = self.config
        transform = _dense(cfg, cfg.hidden_size, (EMBED, HIDDEN), "transform", init=_head_init(cfg))
        x = transform(x)  # [b, p, h]
        x = _layer_norm(cfg)(_activation(cfg, x))
        bias = _param(
            self, "output_bias", nn.initializers.zeros_init(), (cfg.vocab_size,), (VOCAB,), cfg
        )
        dtype = jnp.dtype(cfg.dtype)
        logits = low_precision.einsum(
            "bph,vh->bpv",
            x.astype(dtype),
            word_table.astype(dtype),
            out_dtype=jnp.float32,
            operand_dtype=cfg.matmul_dtype,
        )  # [b, p, v]
        logits = logits + bias.astype(jnp.float32)
        return sharding.constrain(logits, (BATCH, LENGTH, VOCAB))


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence-prediction heads."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.bert = BertModel(cfg)
        self.mlm_head = MlmHead(cfg)
        # float32 compute: the NSP logits feed the loss directly.
        self.nsp_head = _dense(
            cfg, 2, (EMBED, CLASSES), "nsp_head", dtype="float32", init=_head_init(cfg)
        )

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        masked_lm_positions=None,
        *,
        deterministic=True,
        packed_length: int | None = None,
        document_ids=None,
        positions=None,
    ) -> BertOutput:
        """``packed_length``: skip padding in the encoder; ``document_ids`` and ``positions``:
        rows of packed documents (see BertModel)."""
        sequence_output, pooled = self.bert(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=document_ids,
            positions=positions,
        )
        if masked_lm_positions is None:
            gathered = sequence_output  # [b, s, h]
        else:
            # Run the head only at the predicted positions: skips most of the vocab matmul.
            gathered = jnp.take_along_axis(
                sequence_output, masked_lm_positions[..., None].astype(jnp.int32), axis=1
            )  # [b, p, h]
        mlm_logits = self.mlm_head(gathered, self.bert.word_table())  # [b, p, v]
        nsp_logits = self.nsp_head(pooled)  # [b, 2]
        return BertOutput(sequence_output, pooled, mlm_logits, nsp_logits)


# ---------------------------------------------------------------------------------------------
# Converting params between the plain layout (layer_0..layer_{L-1}) and the scanned one.


def pretraining_init(
    model: BertForPreTraining, seq_len: int, num_predictions: int
) -> Callable[[jax.Array], Any]:
    """`rng -> boxed params` of a BertForPreTraining for inputs of these shapes."""

    def init_params(rng: jax.Array) -> Any:
        ids = jnp.zeros((1, seq_len), jnp.int32)  # [batch, seq]
        positions = jnp.zeros((1, num_predictions), jnp.int32)  # [batch, predictions]
        return model.init({"params": rng}, ids, ids, ids, positions)["params"]

    return init_params


def _stack_values(values):
    if isinstance(values[0], jax.ShapeDtypeStruct):  # abstract trees (jax.eval_shape)
        return jax.ShapeDtypeStruct((len(values), *values[0].shape), values[0].dtype)
    return jnp.stack(values)  # [layers, ...]


def _stack_leaves(*leaves):
    if sharding.is_box(leaves[0]):
        values = _stack_values([leaf.value for leaf in leaves])  # [layers, ...]
        return leaves[0].replace(value=values, names=(LAYERS, *leaves[0].names))
    return _stack_values(leaves)


def _index_value(value, i: int):
    if isinstance(value, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(value.shape[1:], value.dtype)
    return value[i]


def _unstack_leaf(leaf, i: int):
    if sharding.is_box(leaf):
        if leaf.names[0] != LAYERS:
            raise ValueError(f"expected a leading {LAYERS!r} axis, got names {leaf.names}")
        return leaf.replace(value=_index_value(leaf.value, i), names=tuple(leaf.names[1:]))
    return _index_value(leaf, i)


def _map_encoders(tree: Any, fn) -> Any:
    """Rebuilds ``tree`` as dicts, applying ``fn`` to every subtree stored under "encoder"."""
    if hasattr(tree, "items") and not sharding.is_box(tree):
        return {k: fn(v) if k == "encoder" else _map_encoders(v, fn) for k, v in tree.items()}
    return tree


def stack_layers(params: Any, num_layers: int) -> Any:
    """Plain-stack params (encoder/layer_i) -> scan layout (encoder/layers with a leading [L])."""

    def stack(encoder):
        missing = [f"layer_{i}" for i in range(num_layers) if f"layer_{i}" not in encoder]
        if missing or len(encoder) != num_layers:
            raise ValueError(
                f"encoder holds {sorted(encoder)}; expected exactly layer_0..layer_{num_layers - 1}"
            )
        layers = [encoder[f"layer_{i}"] for i in range(num_layers)]
        return {STACKED_LAYERS: jax.tree.map(_stack_leaves, *layers, is_leaf=sharding.is_box)}

    return _map_encoders(params, stack)


def unstack_layers(params: Any, num_layers: int) -> Any:
    """Scan-layout params (encoder/layers) -> plain stack (encoder/layer_0..layer_{L-1})."""

    def unstack(encoder):
        if set(encoder) != {STACKED_LAYERS}:
            raise ValueError(f"encoder holds {sorted(encoder)}; expected only 'layers'")
        layers = encoder[STACKED_LAYERS]
        for leaf in jax.tree.leaves(layers, is_leaf=sharding.is_box):
            length = (leaf.value if sharding.is_box(leaf) else leaf).shape[0]
            if length != num_layers:
                raise ValueError(f"stacked layers have length {length}, expected {num_layers}")
        return {
            f"layer_{i}": jax.tree.map(
                functools.partial(_unstack_leaf, i=i), layers, is_leaf=sharding.is_box
            )
            for i in range(num_layers)
        }

    return _map_encoders(params, unstack)
