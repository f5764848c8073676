"""ModernBERT's encoder as Flax linen modules, its prediction head and masked-LM model.

Einsum letters used throughout:
  b batch   s sequence (queries)   t sequence (keys)   h hidden size   n heads
  d head size (h // n)   f feed-forward intermediate   c chunk (3: query/key/value, or
  2: GeGLU input/gate)   v vocabulary   p masked-LM predictions (or 1, a pooled row)
  k the hidden size on the output side of a [hidden, hidden] kernel   l labels

The architecture (transformers' ModernBertModel): token embeddings only, then LayerNorm;
rotary position embeddings on queries and keys (one theta for global layers, another for
local ones); pre-LayerNorm blocks ``x + attn(attn_norm(x))``, ``x + mlp(mlp_norm(x))`` where
layer 0's attention norm is the identity (the embeddings were just normalised); a final
LayerNorm. Layer i attends globally when ``i % global_attn_every_n_layers == 0``; the others
see a sliding window, token i seeing token j when ``|i - j| <= local_attention // 2``. The
feed-forward is GeGLU: ``Wo(gelu(input) * gate)``. No biases by default (attention_bias,
mlp_bias, norm_bias).

Numerics: parameters live in ``param_dtype``; matmuls run in ``dtype``; the rotary angles
and the rotation, the softmax and LayerNorm statistics are float32, and so are the logits.

Initialisation (transformers' _init_weights): a normal truncated at
``+-initializer_cutoff_factor`` standard deviations, with std ``initializer_range`` for the
token embeddings, Wqkv and Wi; ``initializer_range / sqrt(2 * num_layers)`` for both Wo and the
head's dense layer; ``hidden_size ** -0.5`` for a classifier. Biases are zero, LayerNorm
scales one. The MLM decoder is the token-embedding table itself (tied), plus its own bias.

Packed documents: ``segment_ids`` keeps attention within a document, and ``positions`` that
restart at each document restart the rotary phase, so a packed row computes what each of its
documents would alone.

Attention masks and kernels: attention.py.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.capability import ENCODER
from bertjax.encoders.family import Generator, PretrainingOutput
from bertjax.encoders.modernbert import rotary
from bertjax.encoders.modernbert.attention import (
    _MASK_VALUE,
    KernelMasks,
    _banded_attention,
    layer_masks,
)
from bertjax.encoders.modernbert.config import ModernBertConfig, generator_config
from bertjax.nn import attention as attention_lib
from bertjax.nn import low_precision, pooling, sharding, unpadding
from bertjax.nn.sharding import (
    ACTIVATION_EMBED,
    BATCH,
    EMBED,
    HEADS,
    HIDDEN,
    KV,
    LABELS,
    LAYERS,
    LENGTH,
    MLP,
    VOCAB,
)

# ---------------------------------------------------------------------------------------------
# Building blocks.

# The encoder's projection of embeddings narrower or wider than its layers (embedding_size).
EMBEDDINGS_PROJECT = "embeddings_project"
EMBEDDINGS = "embeddings"


def _init(config: ModernBertConfig, std: float):
    cutoff = config.initializer_cutoff_factor
    return nn.initializers.truncated_normal(std, lower=-cutoff, upper=cutoff)


def _stds(config: ModernBertConfig) -> dict[str, float]:
    """The init std of each kind of kernel (transformers' _init_weights)."""
    return {
        "in": config.initializer_range,
        "out": config.initializer_range / math.sqrt(2.0 * config.num_layers),
        "classifier": config.hidden_size**-0.5,
    }


def _param(module: nn.Module, name: str, init, shape, names, config: ModernBertConfig):
    """A parameter annotated with logical axis names, stored in param_dtype."""
    return module.param(
        name, nn.with_logical_partitioning(init, names), shape, jnp.dtype(config.param_dtype)
    )


class Projection(nn.Module):
    """A kernel applied with ``jnp.einsum(equation, x, kernel)``, plus an optional bias over
    the kernel's trailing (output) dimensions."""

    config: ModernBertConfig
    equation: str
    kernel_shape: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    bias_axes: tuple[str | None, ...]  # one per output dimension
    std: float
    use_bias: bool
    dtype: str | None = None  # default: config.dtype

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        dtype = jnp.dtype(self.dtype or cfg.dtype)
        kernel = _param(
            self, "kernel", _init(cfg, self.std), self.kernel_shape, self.kernel_axes, cfg
        )
        y = low_precision.einsum(
            self.equation, x.astype(dtype), kernel.astype(dtype), operand_dtype=cfg.matmul_dtype
        )
        if self.use_bias:
            bias_shape = self.kernel_shape[-len(self.bias_axes) :]
            bias = _param(
                self, "bias", nn.initializers.zeros_init(), bias_shape, self.bias_axes, cfg
            )
            y = y + bias.astype(dtype)
        return y


def _layer_norm(config: ModernBertConfig, name: str) -> nn.LayerNorm:
    # Statistics in float32 whatever the dtype; two-pass variance, as torch computes it.
    return nn.LayerNorm(
        epsilon=config.norm_eps,
        use_bias=config.norm_bias,
        use_fast_variance=False,
        dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (HIDDEN,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (HIDDEN,)),
        name=name,
    )


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU with erf, as torch computes it (jax.nn.gelu's erfc form is slower on CPU)."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * np.float32(1 / math.sqrt(2))).astype(x.dtype))


class Attention(nn.Module):
    """Fused-QKV self-attention with rotary positions; softmax in float32.

    ``mask`` is a boolean mask (ModernBERT's own einsum path: [b, s, t], or banded [b, c, w,
    3w]) or KernelMasks (bertjax.nn.attention's fused kernel, with ``local_window``), as
    `layer_masks` decided for this kind of layer.
    """

    config: ModernBertConfig
    local_window: int | None = None  # a local layer's half-width; None for a global layer

    @nn.compact
    def __call__(self, x, mask, cos, sin, deterministic: bool, index=None):
        cfg = self.config
        h, n, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        qkv_names = (BATCH, LENGTH, HEADS, KV)
        stds = _stds(cfg)
        qkv = Projection(
            cfg,
            "bsh,hcnd->bscnd",
            (h, 3, n, d),
            (EMBED, None, HEADS, KV),
            (None, HEADS, KV),
            stds["in"],
            cfg.attention_bias,
            name="wqkv",
        )(x)  # [b, s, 3, n, d], or packed [g, c, 3, n, d]
        if index is not None:  # packed tokens: attention runs on the rows (see ModernBertModel)
            qkv = unpadding.unpack_tokens(qkv, index, *cos.shape[:2])  # [b, s, 3, n, d]
        # Unstacked, not indexed: the gradient then joins the three parts in one concatenate
        # instead of padding each to qkv's size and adding them (about 4 % of a CPU step).
        parts = jnp.unstack(qkv, axis=2)  # [b, s, n, d] each
        q, k, v = (sharding.constrain(part, qkv_names) for part in parts)
        q, k = rotary.apply(q, cos, sin), rotary.apply(k, cos, sin)
        # Attention's products take matmul_dtype operands; its output returns to qkv's dtype.
        q, k, v = low_precision.rounded(cfg.matmul_dtype, q, k, v)
        weights_dropout = nn.Dropout(cfg.attention_dropout)
        if isinstance(mask, KernelMasks):
            # layer_masks chose a kernel only with attention dropout inactive; the same
            # resolution runs again inside, with the same inputs, so the same kernel.
            context = attention_lib.dot_product_attention(
                q,
                k,
                v,
                mask.attention_mask,
                implementation=cfg.attention_impl,
                document_ids=mask.document_ids,
                local_window=self.local_window,
            )  # [b, s, n, d]
        elif mask.ndim == 4:  # banded (local layers of long rows): see attention_masks
            with jax.named_scope(attention_lib.SCOPE):  # attention's, whichever path computes it
                context = _banded_attention(
                    q, k, v, mask, cfg.window, lambda w: weights_dropout(w, deterministic)
                )
        else:
            with jax.named_scope(attention_lib.SCOPE):
                logits = low_precision.einsum("bsnd,btnd->bnst", q, k, jnp.float32)  # [b, n, s, t]
                logits = jnp.where(mask[:, None], logits * np.float32(d**-0.5), _MASK_VALUE)
                weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)  # [b, n, s, t]
                weights = weights_dropout(weights, deterministic=deterministic)
                context = low_precision.einsum("bnst,btnd->bsnd", weights, v)  # [b, s, n, d]
        context = sharding.constrain(context.astype(qkv.dtype), qkv_names)
        if index is not None:
            context = unpadding.pack_tokens(context, index)  # [g, c, n, d]
        y = Projection(
            cfg,
            "bsnd,ndh->bsh",
            (n, d, h),
            (HEADS, KV, EMBED),
            (HIDDEN,),
            stds["out"],
            cfg.attention_bias,
            name="wo",
        )(context)  # [b, s, h] (packed: [g, c, h])
        return nn.Dropout(cfg.attention_dropout)(y, deterministic=deterministic)


class GegluMlp(nn.Module):
    """Wo(gelu(input) * gate), where Wi yields input and gate side by side."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x, deterministic: bool):
        cfg = self.config
        h, f = cfg.hidden_size, cfg.intermediate_size
        stds = _stds(cfg)
        # Input and gate on their own axis (not one [h, 2f] axis): sharding the intermediate
        # over devices then gives each device the matching slices of both.
        y = Projection(
            cfg,
            "bsh,hcf->bscf",
            (h, 2, f),
            (EMBED, None, MLP),
            (None, MLP),
            stds["in"],
            cfg.mlp_bias,
            name="wi",
        )(x)  # [b, s, 2, f]
        inputs, gate = jnp.unstack(y, axis=2)  # [b, s, f] each (unstacked: as wqkv's above)
        y = gelu(inputs) * gate  # [b, s, f]
        y = sharding.constrain(y, (BATCH, LENGTH, MLP))
        y = nn.Dropout(cfg.mlp_dropout)(y, deterministic=deterministic)
        return Projection(
            cfg,
            "bsf,fh->bsh",
            (f, h),
            (MLP, EMBED),
            (HIDDEN,),
            stds["out"],
            cfg.mlp_bias,
            name="wo",
        )(y)  # [b, s, h]


@jax.custom_vjp
def materialized_gradient(x: jax.Array) -> jax.Array:
    """The identity, whose gradient XLA's CPU compiler must compute into memory of its own.

    In a pre-LayerNorm stack the residual stream's gradient is a chain of additions, one per
    sublayer. XLA's CPU fusion copies that whole chain into every fusion that reads it (the
    transposes feeding each layer's weight gradients), so a backward pass recomputed it once
    per layer: 40% of a 6-layer ModernBERT's backward on CPU (`benchmarks/modernbert.py
    --backward`). A conditional is a fusion boundary XLA cannot remove here (an
    optimization_barrier is dropped before fusion on CPU), so the chain ends at each layer.
    The forward pass is unchanged and gradients equal to float rounding (the fusions differ);
    other platforms fuse without copying and skip it.
    """
    return x


def _materialized_forward(x):
    return x, None


def _materialized_backward(_, grad):
    if jax.default_backend() != "cpu":
        return (grad,)
    first = grad[(0,) * grad.ndim]
    # The predicate is true unless the gradient is NaN, and both branches return `grad`:
    # XLA cannot fold it, so the conditional's result is computed before any consumer.
    return (jax.lax.cond(first == first, lambda g: g, lambda g: g * 1, grad),)


materialized_gradient.defvjp(_materialized_forward, _materialized_backward)


class EncoderLayer(nn.Module):
    """One pre-LayerNorm block; ``first`` (layer 0) has no attention norm."""

    config: ModernBertConfig
    is_global: bool
    first: bool = False

    @nn.compact
    def __call__(self, x, masks, angles, index, deterministic: bool):
        cfg = self.config
        kind = 0 if self.is_global else 1
        x = materialized_gradient(x)
        y = x if self.first else _layer_norm(cfg, "attn_norm")(x)
        window = None if self.is_global else cfg.window
        attention = Attention(cfg, local_window=window, name="attn")
        x = x + attention(y, masks[kind], *angles[kind], deterministic, index)
        x = x + GegluMlp(cfg, name="mlp")(_layer_norm(cfg, "mlp_norm")(x), deterministic)
        return sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))


_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.dots_saveable,
}

# The encoder's key for the repeated layer groups stacked along a leading axis (scan_layers).
GROUPS = "groups"


def _layer_class(config: ModernBertConfig):
    if config.remat_policy == "none":
        return EncoderLayer
    # argnum 5 (counting self) is `deterministic`: a Python bool, must stay static.
    return nn.remat(EncoderLayer, policy=_REMAT_POLICIES[config.remat_policy], static_argnums=(5,))


def group_layout(config: ModernBertConfig) -> tuple[int, int]:
    """(groups, tail) of the scanned stack: after layer 0, ``groups`` repeats of n layers
    (n = global_attn_every_n_layers: n - 1 local, then one global), then ``tail`` local
    layers. ModernBERT-base (22 layers, n = 3) is 1 + 7 * 3 + 0."""
    n = config.global_attn_every_n_layers
    return (config.num_layers - 1) // n, (config.num_layers - 1) % n


class LayerGroup(nn.Module):
    """n consecutive layers, the last one global: the body nn.scan repeats, so compile time
    does not grow with the number of layers. Returns ``(x, None)`` for nn.scan."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x, masks, angles, index, deterministic: bool):
        n = self.config.global_attn_every_n_layers
        layer_cls = _layer_class(self.config)
        for j in range(n):
            x = layer_cls(self.config, is_global=j == n - 1, name=f"layer_{j}")(
                x, masks, angles, index, deterministic
            )
        return x, None


class Embeddings(nn.Module):
    """Token embeddings (config.embedding_width wide), LayerNorm, dropout."""

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.tok_embeddings = _param(
            self,
            "tok_embeddings",
            _init(cfg, _stds(cfg)["in"]),
            (cfg.vocab_size, cfg.embedding_width),
            (VOCAB, EMBED),
            cfg,
        )
        self.norm = _layer_norm(cfg, "norm")
        self.drop = nn.Dropout(cfg.embedding_dropout)

    def __call__(self, input_ids, deterministic: bool):
        # The whole table for the lookup (as fsdp gathers any weight before use): a lookup
        # into a table split by columns would leave rows split by columns, and moving those
        # to batch-split rows makes the partitioner replicate them first.
        table = sharding.constrain(self.tok_embeddings, (VOCAB, ACTIVATION_EMBED))
        x = jnp.take(table, input_ids, axis=0)  # [b, s, e]
        x = self.norm(x.astype(jnp.dtype(self.config.dtype)))
        return self.drop(x, deterministic=deterministic)


# Token packing (``packed_length``) runs the dense layers on real tokens only and attention on
# the rows: each layer gathers its queries, keys and values back into [batch, seq] rows and
# its context into the packed slots again. The gathers cost memory traffic, so packing is
# skipped unless the slots kept are at most this share of the batch's: `benchmarks/
# modernbert.py --packing_sweep` measured the unpadded masked-LM step (L6/H256, 8 rows of
# 512, CPU; three runs on a busy host) at 1.0x-2.0x the padded one up to 0.70 of the slots,
# 0.6x-0.9x from 0.75.
PACKING_MAX_SHARE = 0.7


def packing_pays(batch: int, seq: int, packed_length: int, groups: int) -> bool:
    """Whether packing each of `groups` batch shards' tokens into `packed_length` slots runs
    faster than the padded rows (PACKING_MAX_SHARE)."""
    return packed_length <= PACKING_MAX_SHARE * (batch // groups) * seq


class ModernBertModel(nn.Module):
    """The encoder: ``(input_ids [batch, seq], attention_mask [batch, seq]) -> [batch, seq,
    hidden]``, after the final norm.

    ``segment_ids`` [batch, seq] (packed documents): a token attends only to tokens with the
    same id. ``positions`` [batch, seq]: rotary positions, e.g. restarting at each packed
    document; default 0..seq-1 in every row. Padding is given by ``attention_mask`` in any
    case (1 real, 0 padding; default all real).

    ``packed_length`` (an int) runs the embeddings, projections, feed-forwards and norms on
    the real tokens only, gathered into that many slots per batch shard (bertjax.nn.unpadding's
    packing_index); attention sees the same rows as without it. Every shard must hold at
    most that many real tokens (the train step checks, bertjax.engine.steps). Outputs at real
    tokens are the padded path's; padded positions come back zero. Where packing cannot pay
    (`packing_pays`), the rows run padded.

    ``embedded`` [batch, seq, embedding width]: the tokens as another network's Embeddings
    gave them, read in place of this one's (replaced-token detection's generator reads its
    discriminator's: `generator`); its tree then has no embeddings.
    """

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        if cfg.embedding_width != cfg.hidden_size:
            self.embeddings_project = Projection(
                cfg,
                "bse,eh->bsh",
                (cfg.embedding_width, cfg.hidden_size),
                (EMBED, HIDDEN),
                (HIDDEN,),
                _stds(cfg)["in"],
                cfg.mlp_bias,
                name=EMBEDDINGS_PROJECT,
            )
        layer_cls = _layer_class(cfg)
        plain = range(cfg.num_layers)  # layer indices run one by one
        self.groups = None
        if cfg.scan_layers:
            groups, _ = group_layout(cfg)
            n = cfg.global_attn_every_n_layers
            plain = [0, *range(1 + groups * n, cfg.num_layers)]
            if groups:
                self.groups = nn.scan(
                    LayerGroup,
                    variable_axes={"params": 0},
                    split_rngs={"params": True, "dropout": True},
                    in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                    length=groups,
                    metadata_params={nn.PARTITION_NAME: LAYERS},
                )(cfg, name=GROUPS)
        self.layers = [
            layer_cls(cfg, is_global=cfg.is_global(i), first=i == 0, name=f"layer_{i}")
            for i in plain
        ]
        self.final_norm = _layer_norm(cfg, "final_norm")

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        deterministic: bool = True,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        packed_length: int | None = None,
        embedded: jax.Array | None = None,
    ) -> jax.Array:
        cfg = self.config
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {input_ids.shape}")
        batch, seq = input_ids.shape
        for name, value in (
            ("attention_mask", attention_mask),
            ("segment_ids", segment_ids),
            ("positions", positions),
        ):
            if value is not None and value.shape != input_ids.shape:
                raise ValueError(
                    f"{name} must have input_ids' shape {input_ids.shape}, got {value.shape}"
                )
        if attention_mask is None:
            attention_mask = jnp.ones((batch, seq), jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
        masks = layer_masks(cfg, attention_mask, segment_ids, deterministic)  # global, local
        angles = (
            rotary.tables(positions, cfg.head_dim, cfg.global_rope_theta),
            rotary.tables(positions, cfg.head_dim, cfg.local_rope_theta),
        )  # 2 x (cos, sin) [b, s, d]
        index = None
        groups = sharding.shards(BATCH)
        if packed_length is not None and packing_pays(batch, seq, packed_length, groups):
            index = unpadding.packing_index(attention_mask, packed_length, groups)  # [g, c]
            input_ids = unpadding.pack_tokens(input_ids, index)  # [g, c]
            if embedded is not None:
                embedded = unpadding.pack_tokens(embedded, index)  # [g, c, e]
        if embedded is None:
            x = self.embeddings(input_ids, deterministic)  # [b, s, e] (packed: [g, c, e])
        else:
            x = embedded
        if cfg.embedding_width != cfg.hidden_size:
            x = self.embeddings_project(x)  # [b, s, e] -> [b, s, h]
        x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        x = self.layers[0](x, masks, angles, index, deterministic)
        if self.groups is not None:
            x, _ = self.groups(x, masks, angles, index, deterministic)
        for layer in self.layers[1:]:
            x = layer(x, masks, angles, index, deterministic)
        x = self.final_norm(x)
        if index is not None:
            x = unpadding.unpack_tokens(x, index, batch, seq)  # [b, s, h], zero at padding
        return x

    def word_table(self) -> jax.Array:
        """The token-embedding matrix [vocab, embedding width] (the MLM decoder's weight)."""
        return self.embeddings.tok_embeddings

    def embed(self, input_ids, token_type_ids=None, *, deterministic=True, positions=None):
        """The embedded tokens [b, s, e]: the token table's rows, LayerNorm, dropout (no
        segments; positions are rotary, applied in attention)."""
        return self.embeddings(input_ids, deterministic)


class PredictionHead(nn.Module):
    """dense (hidden -> embedding width, i.e. hidden unless config.embedding_size), GELU,
    LayerNorm: the MLM and classification heads' trunk."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        h = cfg.hidden_size
        x = Projection(
            cfg,
            "bph,hk->bpk",
            (h, cfg.embedding_width),
            (EMBED, HIDDEN),
            (HIDDEN,),
            _stds(cfg)["out"],
            cfg.classifier_bias,
            name="dense",
        )(x)  # [b, p, e]
        return _layer_norm(cfg, "norm")(gelu(x))


def masked_lm_logits(cfg, x, masked_lm_positions, head, table, bias) -> jax.Array:
    """float32 [b, p, v] (or [b, s, v]) logits: the prediction `head` over the hidden states at
    `masked_lm_positions` (all, if None), then the decoder tied to the token `table`."""
    if masked_lm_positions is not None:
        # Run the head only at the predicted positions: skips most of the vocab matmul.
        x = jnp.take_along_axis(
            x, masked_lm_positions[..., None].astype(jnp.int32), axis=1
        )  # [b, p, h]
    x = head(x)  # [b, p, h]
    dtype = jnp.dtype(cfg.dtype)
    logits = low_precision.einsum(
        "bph,vh->bpv",
        x.astype(dtype),
        table.astype(dtype),
        out_dtype=jnp.float32,
        operand_dtype=cfg.matmul_dtype,
    )  # [b, p, v]
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    return sharding.constrain(logits, (BATCH, LENGTH, VOCAB))


# The prediction head's key in the encoder's tree, and the tied decoder's bias beside it.
HEAD = "head"
DECODER_BIAS = "decoder_bias"


class Encoder(ModernBertModel):
    """ModernBertModel and its prediction head, with the families' call (see
    bertjax.encoders.family): pooled is the head on [CLS] or the mean over real tokens;
    ``token_head`` runs the head over every token. Segment ids are ignored;
    ``packed_length`` runs the dense layers on real tokens only (ModernBertModel's token
    packing); with ``cls_only`` every position is still computed (mean pooling needs them).
    ``document_ids`` and ``positions`` describe rows of packed documents (ModernBertModel's
    ``segment_ids`` and ``positions``)."""

    def setup(self):
        super().setup()
        self.head = PredictionHead(self.config)
        self.head_dropout = nn.Dropout(self.config.classifier_dropout)

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
        embedded=None,
    ):
        cfg = self.config
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        x = super().__call__(
            input_ids,
            attention_mask,
            deterministic=deterministic,
            segment_ids=document_ids,
            positions=positions,
            packed_length=packed_length,
            embedded=embedded,
        )  # [b, s, h]
        if cfg.classifier_pooling == "cls":
            pooled = x[:, :1]  # [b, 1, h]
        else:
            pooled = pooling.mean(x, attention_mask)[:, None]  # [b, 1, h]
        pooled = self.head_dropout(self.head(pooled), deterministic=deterministic)[:, 0]  # [b, h]
        if token_head:
            x = self.head_dropout(self.head(x), deterministic=deterministic)  # [b, s, h]
        return x, pooled

    def hidden_states(
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
        """The last hidden states [b, s, h] (after the final norm; zero at padded positions
        when packed), without the prediction head: ModernBertModel's last_hidden_state."""
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        return super().__call__(
            input_ids,
            attention_mask,
            deterministic=deterministic,
            segment_ids=document_ids,
            positions=positions,
            packed_length=packed_length,
        )

    def predictions(self, x: jax.Array) -> jax.Array:
        """The prediction head alone (the masked-LM model's trunk): [b, p, h] -> [b, p, h]."""
        return self.head(x)


class MaskedLM(nn.Module):
    """The encoder ("bert", with the head) and the tied decoder's bias: float32 logits
    [batch, seq or predictions, vocab], as transformers' ModernBertForMaskedLM, with the
    families' pretraining call (bertjax.encoders.family): ``mlm_logits``, no sentence-pair
    head (``nsp_logits`` None) and the last hidden states; ``packed_length`` as the
    encoder's. ``embedded`` (as ModernBertModel takes it) and ``word_table`` [vocab,
    embedding width] are another network's embedded tokens and token table, read in place of
    this model's own (replaced-token detection's generator's: `generator`)."""

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.bert = Encoder(cfg)
        if cfg.decoder_bias:
            self.decoder_bias = _param(
                self, DECODER_BIAS, nn.initializers.zeros_init(), (cfg.vocab_size,), (VOCAB,), cfg
            )

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
        embedded=None,
        word_table=None,
    ) -> PretrainingOutput:
        cfg = self.config
        x, _ = self.bert(
            input_ids,
            None,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            document_ids=document_ids,
            positions=positions,
            embedded=embedded,
        )  # [b, s, h]
        bias = self.decoder_bias if cfg.decoder_bias else None
        table = self.bert.word_table() if word_table is None else word_table  # [v, e]
        logits = masked_lm_logits(
            cfg, x, masked_lm_positions, self.bert.predictions, table, bias
        )  # [b, p, v]
        return PretrainingOutput(mlm_logits=logits, nsp_logits=None, sequence_output=x)


def init_masked_lm(config: ModernBertConfig, rng: jax.Array):
    """The masked-LM model's parameters (boxed), drawn from `rng`."""
    ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
    # The parameters do not depend on the attention implementation; a one-token row is no
    # shape for a fused kernel to compile for.
    config = dataclasses.replace(config, attention_impl="xla")
    return MaskedLM(config).init({"params": rng}, ids)["params"]


class DiscriminatorHead(nn.Module):
    """The family's head for capability.REPLACED_TOKENS (no transformers ModernBERT class has
    one): dense [h, h] -> GELU -> dense [h, 1], float32 logits [b, s, 1] that a token was
    replaced, read off the last hidden states."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        h, std = cfg.hidden_size, _stds(cfg)["in"]
        x = Projection(
            cfg, "bsh,hk->bsk", (h, h), (EMBED, HIDDEN), (HIDDEN,), std, True, name="dense"
        )(x)  # [b, s, h]
        return Projection(
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


def _generator_pretraining_params(own, encoder) -> dict:
    """The masked-LM tree of a generator's parameters, the shared embeddings in its encoder."""
    return {**own, ENCODER: {**own[ENCODER], EMBEDDINGS: encoder[EMBEDDINGS]}}


def generator(config: ModernBertConfig, fraction: float) -> Generator:
    """The family's generator beside a discriminator of `config`: a MaskedLM of
    generator_config, reading the discriminator's embedded tokens (its own projection takes
    them to its width) and token table."""
    small = generator_config(config, fraction)
    return Generator(small, MaskedLM(small), _generator_pretraining_params)
