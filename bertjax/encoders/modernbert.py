"""ModernBERT's encoder as Flax linen modules, with its weights to and from transformers.

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

Local layers of rows longer than three windows attend by chunks (`banded_mask`,
`_banded_attention`): each chunk of a window's queries against its own and its two
neighbours' keys, seq x 3 window scores instead of seq x seq, with the same weights.

Packed documents: ``segment_ids`` keeps attention within a document, and ``positions`` that
restart at each document restart the rotary phase, so a packed row computes what each of its
documents would alone.

Attention kernels (``config.attention_impl``, bertjax.attention; not a transformers
field): for each kind of layer (global, local) `layer_masks` asks
bertjax.attention.resolve_implementation, once per forward. Where it picks a kernel,
those layers call bertjax.attention.dot_product_attention with the padding mask, the segment
ids as document ids and, on local layers, the window, instead of building boolean masks:
blocked on one CPU device (both kinds of layer, documents and windows; "auto"'s choice
there for global layers, and for local layers outside training: see `attention_kernel`),
splash on TPUs (both kinds of layer: a LocalMask band
per head, documents as segment ids; sequences a multiple of 128), cuDNN on NVIDIA GPUs in
bf16/fp16 (global layers of rows without documents only: jax's cuDNN attention takes
neither a two-sided window nor documents; those layers keep the einsum path, the reason
logged once). Everything else runs
the einsum path above, bit for bit as without the option: "xla", several CPU devices,
attention dropout active (the kernels cannot drop weights). On real tokens both paths give
the same weights; a padded query's row differs (it sees padding on a kernel, nothing here),
and nothing reads it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax import attention as attention_lib
from bertjax import packing, sharding
from bertjax.sharding import (
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

DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots")
CLASSIFIER_POOLINGS = ("cls", "mean")
ATTENTION_IMPLEMENTATIONS = attention_lib.IMPLEMENTATIONS
# The implementations served by bertjax.attention's kernels (blocked: CPU blocks with
# documents and windows); any other that resolve_implementation picks ("xla") runs
# ModernBERT's own einsum path.
KERNELS = ("blocked", "cudnn", "splash")

# Special token ids of ModernBERT's tokenizer (a vocabulary of 50,368 rows).
CLS_ID = 50281
SEP_ID = 50282
PAD_ID = 50283

# The encoder's key in a task model's params, as "model." prefixes its tensors in transformers.
ENCODER = "model"

# transformers' names for the two kinds of layer (config.json's layer_types).
HF_GLOBAL = "full_attention"
HF_LOCAL = "sliding_attention"

# name -> architecture fields; base and large are the hub's answerdotai/ModernBERT-*.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4),
    "base": dict(
        hidden_size=768,
        intermediate_size=1152,
        num_layers=22,
        num_heads=12,
        classifier_pooling="mean",
    ),
    "large": dict(
        hidden_size=1024,
        intermediate_size=2624,
        num_layers=28,
        num_heads=16,
        classifier_pooling="mean",
    ),
}

# Large negative logit for masked keys: finite, so a query with no visible key softmaxes to
# uniform weights instead of NaN, and far enough below any real score to weigh exactly 0.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """Architecture and numerics of a ModernBERT encoder; validated on construction.

    Field names follow transformers' ModernBertConfig, except num_layers and num_heads
    (bertjax's names for num_hidden_layers and num_attention_heads).
    """

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_layers: int = 22
    num_heads: int = 12
    # The length the model was trained for; rotary positions have no table to outgrow.
    max_position_embeddings: int = 8192
    local_attention: int = 128  # the whole window: i sees j when |i - j| <= local_attention // 2
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    classifier_bias: bool = False  # the prediction head's dense layer
    decoder_bias: bool = True  # the MLM decoder's bias
    classifier_pooling: str = "cls"  # "cls" | "mean"
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0  # attention weights and the attention output
    mlp_dropout: float = 0.0
    classifier_dropout: float = 0.0
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0  # the truncation, in standard deviations
    pad_token_id: int = PAD_ID
    cls_token_id: int = CLS_ID
    sep_token_id: int = SEP_ID
    dtype: str = "bfloat16"  # compute dtype
    param_dtype: str = "float32"
    remat_policy: str = "none"  # "none" | "full" | "dots" (save matmul outputs)
    scan_layers: bool = False
    # "auto" | "xla" | "cudnn" | "splash" (bertjax.attention); not a transformers field.
    attention_impl: str = "auto"

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "max_position_embeddings",
            "local_attention",
            "global_attn_every_n_layers",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(
                    f"ModernBertConfig.{name}={value!r} is invalid: must be a positive int"
                )
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"ModernBertConfig.hidden_size={self.hidden_size} is invalid: must divide into "
                f"num_heads={self.num_heads} heads of even size (rotary pairs)"
            )
        for name in (
            "global_rope_theta",
            "local_rope_theta",
            "norm_eps",
            "initializer_range",
            "initializer_cutoff_factor",
        ):
            value = getattr(self, name)
            if not _is_number(value) or not value > 0:
                raise ValueError(
                    f"ModernBertConfig.{name}={value!r} is invalid: must be a positive number"
                )
        for name in ("embedding_dropout", "attention_dropout", "mlp_dropout", "classifier_dropout"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value < 1:
                raise ValueError(f"ModernBertConfig.{name}={value!r} is invalid: must be in [0, 1)")
        for name in (
            "attention_bias",
            "mlp_bias",
            "norm_bias",
            "classifier_bias",
            "decoder_bias",
            "scan_layers",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(
                    f"ModernBertConfig.{name}={value!r} is invalid: must be True or False"
                )
        for name in ("pad_token_id", "cls_token_id", "sep_token_id"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"ModernBertConfig.{name}={value!r} is invalid: must be an id in "
                    f"[0, vocab_size={self.vocab_size})"
                )
        for name, valid in (
            ("classifier_pooling", CLASSIFIER_POOLINGS),
            ("dtype", DTYPES),
            ("param_dtype", DTYPES),
            ("remat_policy", REMAT_POLICIES),
            ("attention_impl", ATTENTION_IMPLEMENTATIONS),
        ):
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(
                    f"ModernBertConfig.{name}={value!r} is invalid: must be one of {valid}"
                )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def window(self) -> int:
        """How far a local layer's token sees on each side: |i - j| <= window."""
        return self.local_attention // 2

    def is_global(self, layer: int) -> bool:
        """Whether layer ``layer`` attends over the whole sequence (else a sliding window)."""
        return layer % self.global_attn_every_n_layers == 0

    @classmethod
    def preset(cls, name: str, **overrides) -> ModernBertConfig:
        """A named size (tiny/base/large) with optional field overrides."""
        if name not in PRESETS:
            raise ValueError(
                f"unknown ModernBERT preset {name!r}: valid presets are {tuple(PRESETS)}"
            )
        return cls(**{**PRESETS[name], **overrides})

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **overrides) -> ModernBertConfig:
        """A config from transformers' ModernBertConfig as a dict (config.json).

        Reads both the current form (layer_types, rope_parameters) and the older one
        (global_attn_every_n_layers, global_rope_theta, local_rope_theta). ``overrides`` set
        fields transformers does not have (dtype, param_dtype, remat_policy, scan_layers,
        attention_impl).
        """
        model_type = hf.get("model_type", "modernbert")
        if model_type != "modernbert":
            raise ValueError(f"config model_type={model_type!r} is not 'modernbert'")
        for key in ("hidden_activation", "classifier_activation"):
            if hf.get(key, "gelu") != "gelu":
                raise ValueError(f"config {key}={hf[key]!r} is not supported: only 'gelu' is")
        if hf.get("tie_word_embeddings", True) is not True:
            raise ValueError(
                "config tie_word_embeddings=False is not supported: the MLM decoder is the "
                "token-embedding table"
            )
        num_layers = hf.get("num_hidden_layers", cls.num_layers)
        every = hf.get("global_attn_every_n_layers", cls.global_attn_every_n_layers)
        if hf.get("layer_types") is not None:
            every = _period_of(list(hf["layer_types"]), every)
        rope = hf.get("rope_parameters") or {}
        thetas = {}
        for layer_type, old_key, default in (
            (HF_GLOBAL, "global_rope_theta", cls.global_rope_theta),
            (HF_LOCAL, "local_rope_theta", cls.local_rope_theta),
        ):
            params = rope.get(layer_type) or {}
            if params.get("rope_type", "default") != "default":
                raise ValueError(
                    f"config rope_parameters[{layer_type!r}].rope_type="
                    f"{params['rope_type']!r} is not supported: only 'default' is"
                )
            thetas[old_key] = float(params.get("rope_theta", hf.get(old_key, default)))
        fields = dict(
            vocab_size=hf.get("vocab_size", cls.vocab_size),
            hidden_size=hf.get("hidden_size", cls.hidden_size),
            intermediate_size=hf.get("intermediate_size", cls.intermediate_size),
            num_layers=num_layers,
            num_heads=hf.get("num_attention_heads", cls.num_heads),
            global_attn_every_n_layers=every,
            **thetas,
        )
        for name in (
            "max_position_embeddings",
            "local_attention",
            "norm_eps",
            "attention_bias",
            "mlp_bias",
            "norm_bias",
            "classifier_bias",
            "decoder_bias",
            "classifier_pooling",
            "embedding_dropout",
            "attention_dropout",
            "mlp_dropout",
            "classifier_dropout",
            "initializer_range",
            "initializer_cutoff_factor",
            "pad_token_id",
            "cls_token_id",
            "sep_token_id",
        ):
            if hf.get(name) is not None:
                fields[name] = hf[name]
        return cls(**{**fields, **overrides})

    def to_hf_dict(self) -> dict[str, Any]:
        """transformers' ModernBertConfig fields (config.json), current and older names both."""
        thetas = {HF_GLOBAL: self.global_rope_theta, HF_LOCAL: self.local_rope_theta}
        return dict(
            model_type="modernbert",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            max_position_embeddings=self.max_position_embeddings,
            local_attention=self.local_attention,
            global_attn_every_n_layers=self.global_attn_every_n_layers,
            layer_types=[
                HF_GLOBAL if self.is_global(i) else HF_LOCAL for i in range(self.num_layers)
            ],
            rope_parameters={
                kind: {"rope_type": "default", "rope_theta": float(theta)}
                for kind, theta in thetas.items()
            },
            global_rope_theta=float(self.global_rope_theta),
            local_rope_theta=float(self.local_rope_theta),
            norm_eps=self.norm_eps,
            attention_bias=self.attention_bias,
            mlp_bias=self.mlp_bias,
            norm_bias=self.norm_bias,
            classifier_bias=self.classifier_bias,
            decoder_bias=self.decoder_bias,
            classifier_pooling=self.classifier_pooling,
            embedding_dropout=self.embedding_dropout,
            attention_dropout=self.attention_dropout,
            mlp_dropout=self.mlp_dropout,
            classifier_dropout=self.classifier_dropout,
            initializer_range=self.initializer_range,
            initializer_cutoff_factor=self.initializer_cutoff_factor,
            hidden_activation="gelu",
            classifier_activation="gelu",
            pad_token_id=self.pad_token_id,
            cls_token_id=self.cls_token_id,
            sep_token_id=self.sep_token_id,
            bos_token_id=self.cls_token_id,
            eos_token_id=self.sep_token_id,
            tie_word_embeddings=True,
        )


def _period_of(layer_types: list[str], hint: int) -> int:
    """The n for which layer_types is "global when i % n == 0"; ``hint`` is tried first."""

    def pattern(n):
        return [HF_GLOBAL if i % n == 0 else HF_LOCAL for i in range(len(layer_types))]

    for n in (hint, *range(1, len(layer_types) + 1)):
        if _is_int(n) and n > 0 and pattern(n) == layer_types:
            return n
    raise ValueError(
        f"config layer_types={layer_types} is not supported: layer i must be "
        f"{HF_GLOBAL!r} exactly when i % n == 0 for some n"
    )


# ---------------------------------------------------------------------------------------------
# Building blocks.


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
        y = jnp.einsum(self.equation, x.astype(dtype), kernel.astype(dtype))
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


def rotary_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """(cos, sin), each [batch, seq, head_dim] float32, for NeoX-style rotary embeddings:
    dimension k and k + head_dim / 2 rotate together at frequency theta ** (-2k / head_dim)."""
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim  # [d / 2]
    inv_freq = 1.0 / (jnp.float32(theta) ** exponents)  # [d / 2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, s, d / 2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [b, s, d]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [batch, seq, heads, head_dim] by the tables [batch, seq, head_dim] in float32;
    returns x's dtype."""
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)  # [b, s, n, d / 2] each
    rotated = jnp.concatenate([-second, first], axis=-1)  # [b, s, n, d]
    return (x32 * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


def attention_masks(
    attention_mask: jax.Array, segment_ids: jax.Array | None, window: int
) -> tuple[jax.Array, jax.Array]:
    """(global, local) boolean masks: query s may attend to key t.

    A key must be a real token (attention_mask) of the query's segment; local layers also
    need |s - t| <= window. Positions within the row set the window: documents are
    contiguous, so a row distance within one document is that document's distance.

    The global mask is [batch, seq, seq]. The local one is too for short rows; for rows longer
    than three windows it is banded (`banded_mask`): [batch, chunks, window, 3 * window], each
    chunk of `window` queries against the keys of its own and its two neighbouring chunks, so
    that local layers compute seq x 3 window scores instead of seq x seq.
    """
    visible = global_mask(attention_mask, segment_ids)
    return visible, local_mask(attention_mask, segment_ids, window, visible)


def global_mask(attention_mask: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """[batch, seq, seq] bool: key t is a real token of query s's segment."""
    batch, seq = attention_mask.shape
    visible = jnp.broadcast_to(attention_mask.astype(bool)[:, None, :], (batch, seq, seq))
    if segment_ids is not None:
        visible = visible & (segment_ids[:, :, None] == segment_ids[:, None, :])  # [b, s, t]
    return visible


def local_mask(
    attention_mask: jax.Array,
    segment_ids: jax.Array | None,
    window: int,
    visible: jax.Array | None = None,
) -> jax.Array:
    """The local layers' mask (see attention_masks); ``visible``: global_mask's, if made."""
    seq = attention_mask.shape[1]
    if is_banded(seq, window):
        return banded_mask(attention_mask, segment_ids, window)
    if visible is None:
        visible = global_mask(attention_mask, segment_ids)
    index = np.arange(seq)
    near = np.abs(index[:, None] - index[None, :]) <= window  # [s, t]
    return visible & near[None]


class KernelMasks(NamedTuple):
    """What a layer on a fused kernel (bertjax.attention's cudnn or splash) gets in place of
    a boolean mask: the padding mask and the document ids (1.. per document, 0 for padding;
    None without documents), both [batch, seq]. The kernels mask block by block from these
    (and the window, which the layer knows), so no [seq, seq] mask is made for them."""

    attention_mask: jax.Array
    document_ids: jax.Array | None


def attention_kernel(
    config: ModernBertConfig,
    batch: int,
    seq: int,
    *,
    deterministic: bool,
    documents: bool,
    local_window: int | None,
) -> str | None:
    """The kernel ("blocked", "cudnn" or "splash") one kind of layer runs on, or None for
    ModernBERT's own einsum path: bertjax.attention.resolve_implementation's choice for
    config.attention_impl (which logs, once, why a requested kernel cannot serve).

    "auto" keeps local layers on the einsum path in training: their chunked einsum
    attention's backward measured faster on CPU than the blocked one's (0.76x-1.02x for
    blocked, forward + backward; `benchmarks/modernbert.py --attention`), while the blocked
    forward is faster (1.25x) and global layers gain both ways (1.6x forward, 1.1x with the
    backward)."""
    impl = attention_lib.resolve_implementation(
        config.attention_impl,
        dtype=jnp.dtype(config.dtype),
        batch=batch,
        seq_len=seq,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        dropout_active=not deterministic and config.attention_dropout > 0,
        document_mask=documents,
        local_window=local_window,
    )
    if impl == "blocked" and config.attention_impl == "auto" and local_window is not None:
        return None if not deterministic else impl
    return impl if impl in KERNELS else None


def layer_masks(
    config: ModernBertConfig,
    attention_mask: jax.Array,
    segment_ids: jax.Array | None,
    deterministic: bool,
) -> tuple[Any, Any]:
    """(global, local) masks for the layers: for each kind of layer, KernelMasks where it runs
    on a fused kernel (`attention_kernel`), else the boolean mask of `attention_masks`.

    Made once per forward, outside nn.scan and remat, and handed to every layer: the layers
    then only choose their path by the mask's type, and the implementation (a string) never
    has to cross the scan or the rematerialised call as an argument.
    """
    batch, seq = attention_mask.shape
    kernels = [
        attention_kernel(
            config,
            batch,
            seq,
            deterministic=deterministic,
            documents=segment_ids is not None,
            local_window=window,
        )
        for window in (None, config.window)
    ]
    if not any(kernels):
        return attention_masks(attention_mask, segment_ids, config.window)
    document_ids = None
    if segment_ids is not None:
        # bertjax.attention numbers documents 1.. and padding 0 (padded queries see padded
        # keys); segment ids may be any ints, padding's included: shift them to start at 1.
        real = attention_mask.astype(bool)
        first = jnp.min(segment_ids)
        document_ids = jnp.where(real, segment_ids - first + 1, 0).astype(jnp.int32)  # [b, s]
    on_kernel = KernelMasks(attention_mask, document_ids)
    return (
        on_kernel if kernels[0] else global_mask(attention_mask, segment_ids),
        on_kernel if kernels[1] else local_mask(attention_mask, segment_ids, config.window),
    )


def is_banded(seq: int, window: int) -> bool:
    """Whether local layers attend by chunks (`banded_mask`): rows longer than 3 windows."""
    return seq > 3 * window


def _chunks(seq: int, window: int) -> int:
    return -(-seq // window)


def banded_mask(attention_mask: jax.Array, segment_ids: jax.Array | None, window: int) -> jax.Array:
    """[batch, chunks, window, 3 * window] bool: query i of chunk c (position c * window + i)
    may attend to key j of the band (position (c - 1) * window + j)."""
    batch, seq = attention_mask.shape
    chunks = _chunks(seq, window)
    query = np.arange(chunks)[:, None] * window + np.arange(window)[None]  # [c, w]
    key = (np.arange(chunks)[:, None] - 1) * window + np.arange(3 * window)[None]  # [c, 3w]
    near = np.abs(query[:, :, None] - key[:, None, :]) <= window  # [c, w, 3w]
    inside = (key >= 0) & (key < seq)  # [c, 3w]
    key_index = np.clip(key, 0, seq - 1)  # [c, 3w]
    query_index = np.clip(query, 0, seq - 1)  # [c, w]
    real = attention_mask.astype(bool)[:, key_index] & inside[None]  # [b, c, 3w]
    mask = real[:, :, None, :] & near[None]  # [b, c, w, 3w]
    if segment_ids is not None:
        same = segment_ids[:, query_index][..., None] == segment_ids[:, key_index][:, :, None, :]
        mask = mask & same  # [b, c, w, 3w]
    return mask


def _band(x: jax.Array, window: int) -> jax.Array:
    """[b, s, n, d] keys or values -> [b, chunks, 3 * window, n, d]: each chunk's band (the
    chunk before, itself and the chunk after; zeros beyond the row)."""
    batch, seq, heads, dim = x.shape
    chunks = _chunks(seq, window)
    padded = jnp.pad(x, ((0, 0), (window, (chunks + 1) * window - seq), (0, 0), (0, 0)))
    blocks = padded.reshape(batch, chunks + 2, window, heads, dim)  # [b, c + 2, w, n, d]
    return jnp.concatenate([blocks[:, :-2], blocks[:, 1:-1], blocks[:, 2:]], axis=2)


def _banded_attention(q, k, v, mask, window: int, dropout) -> jax.Array:
    """Attention within the band of each chunk of `window` queries ([b, s, n, d] each, `mask`
    from `banded_mask`): the weights the dense local mask gives every real query (a padding
    query's differ, and nothing reads them), at seq x 3 window scores. `dropout` applies to
    the weights, drawing its masks on this layout."""
    batch, seq, heads, dim = q.shape
    chunks = _chunks(seq, window)
    q = jnp.pad(q, ((0, 0), (0, chunks * window - seq), (0, 0), (0, 0)))
    q = q.reshape(batch, chunks, window, heads, dim)  # [b, c, w, n, d]
    k, v = _band(k, window), _band(v, window)  # [b, c, 3w, n, d]
    logits = jnp.einsum(
        "bcqnd,bctnd->bcnqt", q, k, preferred_element_type=jnp.float32
    )  # [b, c, n, w, 3w]
    logits = jnp.where(mask[:, :, None], logits * np.float32(dim**-0.5), _MASK_VALUE)
    weights = dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype))  # [b, c, n, w, 3w]
    context = jnp.einsum("bcnqt,bctnd->bcqnd", weights, v)  # [b, c, w, n, d]
    return context.reshape(batch, chunks * window, heads, dim)[:, :seq]


class Attention(nn.Module):
    """Fused-QKV self-attention with rotary positions; softmax in float32.

    ``mask`` is a boolean mask (ModernBERT's own einsum path: [b, s, t], or banded [b, c, w,
    3w]) or KernelMasks (bertjax.attention's fused kernel, with ``local_window``), as
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
            qkv = packing.unpack_tokens(qkv, index, *cos.shape[:2])  # [b, s, 3, n, d]
        q, k, v = (sharding.constrain(qkv[:, :, i], qkv_names) for i in range(3))  # [b, s, n, d]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
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
            context = _banded_attention(
                q, k, v, mask, cfg.window, lambda w: weights_dropout(w, deterministic)
            )
        else:
            logits = jnp.einsum(
                "bsnd,btnd->bnst", q, k, preferred_element_type=jnp.float32
            )  # [b, n, s, t]
            logits = jnp.where(mask[:, None], logits * np.float32(d**-0.5), _MASK_VALUE)
            weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)  # [b, n, s, t]
            weights = weights_dropout(weights, deterministic=deterministic)
            context = jnp.einsum("bnst,btnd->bsnd", weights, v)  # [b, s, n, d]
        context = sharding.constrain(context, qkv_names)
        if index is not None:
            context = packing.pack_tokens(context, index)  # [g, c, n, d]
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
        y = gelu(y[:, :, 0]) * y[:, :, 1]  # [b, s, f]
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


class EncoderLayer(nn.Module):
    """One pre-LayerNorm block; ``first`` (layer 0) has no attention norm."""

    config: ModernBertConfig
    is_global: bool
    first: bool = False

    @nn.compact
    def __call__(self, x, masks, rotary, index, deterministic: bool):
        cfg = self.config
        kind = 0 if self.is_global else 1
        y = x if self.first else _layer_norm(cfg, "attn_norm")(x)
        window = None if self.is_global else cfg.window
        attention = Attention(cfg, local_window=window, name="attn")
        x = x + attention(y, masks[kind], *rotary[kind], deterministic, index)
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
    def __call__(self, x, masks, rotary, index, deterministic: bool):
        n = self.config.global_attn_every_n_layers
        layer_cls = _layer_class(self.config)
        for j in range(n):
            x = layer_cls(self.config, is_global=j == n - 1, name=f"layer_{j}")(
                x, masks, rotary, index, deterministic
            )
        return x, None


class Embeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout."""

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.tok_embeddings = _param(
            self,
            "tok_embeddings",
            _init(cfg, _stds(cfg)["in"]),
            (cfg.vocab_size, cfg.hidden_size),
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
        x = jnp.take(table, input_ids, axis=0)  # [b, s, h]
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
    the real tokens only, gathered into that many slots per batch shard (bertjax.packing's
    packing_index); attention sees the same rows as without it. Every shard must hold at
    most that many real tokens (the train step checks, bertjax.steps). Outputs at real
    tokens are the padded path's; padded positions come back zero. Where packing cannot pay
    (`packing_pays`), the rows run padded.
    """

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = Embeddings(cfg)
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
        rotary = (
            rotary_tables(positions, cfg.head_dim, cfg.global_rope_theta),
            rotary_tables(positions, cfg.head_dim, cfg.local_rope_theta),
        )  # 2 x (cos, sin) [b, s, d]
        index = None
        groups = sharding.shards(BATCH)
        if packed_length is not None and packing_pays(batch, seq, packed_length, groups):
            index = packing.packing_index(attention_mask, packed_length, groups)  # [g, c]
            input_ids = packing.pack_tokens(input_ids, index)  # [g, c]
        x = self.embeddings(input_ids, deterministic)  # [b, s, h] (packed: [g, c, h])
        x = sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED))
        x = self.layers[0](x, masks, rotary, index, deterministic)
        if self.groups is not None:
            x, _ = self.groups(x, masks, rotary, index, deterministic)
        for layer in self.layers[1:]:
            x = layer(x, masks, rotary, index, deterministic)
        x = self.final_norm(x)
        if index is not None:
            x = packing.unpack_tokens(x, index, batch, seq)  # [b, s, h], zero at padding
        return x

    def token_table(self) -> jax.Array:
        """The token-embedding matrix [vocab, hidden] (the MLM decoder's weight)."""
        return self.embeddings.tok_embeddings


class PredictionHead(nn.Module):
    """dense (hidden -> hidden), GELU, LayerNorm: the MLM and classification heads' trunk."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        h = cfg.hidden_size
        x = Projection(
            cfg,
            "bph,hk->bpk",
            (h, h),
            (EMBED, HIDDEN),
            (HIDDEN,),
            _stds(cfg)["out"],
            cfg.classifier_bias,
            name="dense",
        )(x)  # [b, p, h]
        return _layer_norm(cfg, "norm")(gelu(x))


class ModernBertForMaskedLM(nn.Module):
    """The encoder and the MLM head: logits [batch, seq, vocab] (float32), or
    [batch, predictions, vocab] at ``masked_lm_positions`` [batch, predictions] only."""

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.model = ModernBertModel(cfg)  # params under ENCODER
        self.head = PredictionHead(cfg)
        if cfg.decoder_bias:
            self.decoder_bias = _param(
                self, "decoder_bias", nn.initializers.zeros_init(), (cfg.vocab_size,), (VOCAB,), cfg
            )

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        masked_lm_positions: jax.Array | None = None,
        *,
        deterministic: bool = True,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        cfg = self.config
        x = self.model(
            input_ids,
            attention_mask,
            deterministic=deterministic,
            segment_ids=segment_ids,
            positions=positions,
        )  # [b, s, h]
        bias = self.decoder_bias if cfg.decoder_bias else None
        return masked_lm_logits(
            cfg, x, masked_lm_positions, self.head, self.model.token_table(), bias
        )


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
    logits = jnp.einsum(
        "bph,vh->bpv", x.astype(dtype), table.astype(dtype), preferred_element_type=jnp.float32
    )  # [b, p, v]
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    return sharding.constrain(logits, (BATCH, LENGTH, VOCAB))


class ModernBertForSequenceClassification(nn.Module):
    """The encoder, pooling (config.classifier_pooling: [CLS] or the mean over real tokens),
    the prediction head and a classifier: logits [batch, num_labels] (float32)."""

    config: ModernBertConfig
    num_labels: int

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        deterministic: bool = True,
    ) -> jax.Array:
        cfg = self.config
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        x = ModernBertModel(cfg, name=ENCODER)(
            input_ids, attention_mask, deterministic=deterministic
        )  # [b, s, h]
        if cfg.classifier_pooling == "cls":
            pooled = x[:, :1]  # [b, 1, h]
        else:
            weights = attention_mask.astype(jnp.float32)[..., None]  # [b, s, 1]
            total = jnp.sum(x.astype(jnp.float32) * weights, axis=1, keepdims=True)  # [b, 1, h]
            pooled = total / jnp.sum(weights, axis=1, keepdims=True)  # [b, 1, h]
        pooled = PredictionHead(cfg, name="head")(pooled)  # [b, 1, h]
        pooled = nn.Dropout(cfg.classifier_dropout)(pooled, deterministic=deterministic)
        logits = Projection(
            cfg,
            "bph,hl->bpl",
            (cfg.hidden_size, self.num_labels),
            (EMBED, LABELS),
            (LABELS,),
            _stds(cfg)["classifier"],
            True,
            dtype="float32",
            name="classifier",
        )(pooled)  # [b, 1, l]
        return logits[:, 0]  # [b, l]


# ---------------------------------------------------------------------------------------------
# The two layouts of the encoder's params: plain (layer_0 .. layer_{L-1}) and scanned
# (layer_0, the groups stacked under "groups" with a leading [groups] axis, the tail layers).


def stack_layers(encoder: Mapping[str, Any], config: ModernBertConfig) -> dict:
    """ModernBertModel params, plain layout -> scanned layout (unboxed arrays)."""
    groups, _ = group_layout(config)
    n = config.global_attn_every_n_layers
    grouped = {f"layer_{1 + g * n + j}" for g in range(groups) for j in range(n)}
    missing = sorted(grouped - set(encoder))
    if missing:
        raise ValueError(f"encoder params have no {missing[0]!r}: expected the plain layout")
    out = {key: value for key, value in encoder.items() if key not in grouped}
    if groups:
        out[GROUPS] = {
            f"layer_{j}": jax.tree.map(
                lambda *xs: jnp.stack(xs),  # [groups, ...]
                *[encoder[f"layer_{1 + g * n + j}"] for g in range(groups)],
            )
            for j in range(n)
        }
    return out


def unstack_layers(encoder: Mapping[str, Any], config: ModernBertConfig) -> dict:
    """ModernBertModel params, scanned layout -> plain layout (unboxed arrays)."""
    groups, _ = group_layout(config)
    n = config.global_attn_every_n_layers
    out = {key: value for key, value in encoder.items() if key != GROUPS}
    if not groups:
        return out
    if GROUPS not in encoder:
        raise ValueError(f"encoder params have no {GROUPS!r}: expected the scanned layout")
    for j in range(n):
        stacked = encoder[GROUPS][f"layer_{j}"]
        for leaf in jax.tree.leaves(stacked):
            if np.shape(leaf)[0] != groups:
                raise ValueError(
                    f"stacked layers have {np.shape(leaf)[0]} groups, the config {groups}"
                )
        for g in range(groups):
            out[f"layer_{1 + g * n + j}"] = jax.tree.map(lambda x, g=g: x[g], stacked)
    return out


# ---------------------------------------------------------------------------------------------
# Weights to and from transformers. torch Linear weights are [out, in]; our kernels are
# [in, ...out] with the fused outputs split: Wqkv [3h, h] -> [h, 3, n, d], Wi [2f, h] ->
# [h, 2, f], the attention Wo [h, h] -> [n, d, h].

# What a state dict (or params tree) holds: the encoder alone, or with a task's head.
MODEL = "model"  # ModernBertModel
MASKED_LM = "masked_lm"  # ModernBertForMaskedLM
CLASSIFICATION = "classification"  # ModernBertForSequenceClassification

_TIED_DECODER = "decoder.weight"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One transformers tensor and the parameter it maps to."""

    hf_name: str
    path: tuple[str, ...]  # key path in our params tree
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    transpose: bool  # a torch Linear weight

    def to_ours(self, array: np.ndarray) -> np.ndarray:
        if self.transpose:
            array = array.T  # [in, out]
        return np.ascontiguousarray(array.reshape(self.shape))

    def to_hf(self, array: np.ndarray) -> np.ndarray:
        if self.transpose:
            # Our kernels flatten row-major to [in, out]; torch stores the transpose.
            array = array.reshape(self.hf_shape[::-1]).T  # [out, in]
        # A fresh, writable array: torch.from_numpy warns on the read-only views jax gives.
        return np.array(array.reshape(self.hf_shape), order="C")


def tensor_specs(
    config: ModernBertConfig, kind: str = MASKED_LM, num_labels: int | None = None
) -> list[TensorSpec]:
    """Every transformers tensor of ``kind`` (MODEL, MASKED_LM or CLASSIFICATION) for
    ``config``, in transformers' order; the tied decoder weight is not among them."""
    if kind not in (MODEL, MASKED_LM, CLASSIFICATION):
        raise ValueError(
            f"unknown kind {kind!r}: valid kinds are {(MODEL, MASKED_LM, CLASSIFICATION)}"
        )
    h, f, n, d, v = (
        config.hidden_size,
        config.intermediate_size,
        config.num_heads,
        config.head_dim,
        config.vocab_size,
    )
    specs: list[TensorSpec] = []
    hf_prefix, root = ("", ()) if kind == MODEL else ("model.", (ENCODER,))

    def add(hf_name, path, hf_shape, shape=None, transpose=False):
        specs.append(TensorSpec(hf_name, tuple(path), hf_shape, shape or hf_shape, transpose))

    def norm(hf_name, path):
        add(f"{hf_name}.weight", (*path, "scale"), (h,))
        if config.norm_bias:
            add(f"{hf_name}.bias", (*path, "bias"), (h,))

    def linear(hf_name, path, n_in, n_out, kernel_shape, bias_shape, use_bias):
        add(f"{hf_name}.weight", (*path, "kernel"), (n_out, n_in), kernel_shape, transpose=True)
        if use_bias:
            add(f"{hf_name}.bias", (*path, "bias"), (n_out,), bias_shape)

    add(
        f"{hf_prefix}embeddings.tok_embeddings.weight",
        (*root, "embeddings", "tok_embeddings"),
        (v, h),
    )
    norm(f"{hf_prefix}embeddings.norm", (*root, "embeddings", "norm"))
    for i in range(config.num_layers):
        hf, ours = f"{hf_prefix}layers.{i}", (*root, f"layer_{i}")
        if i > 0:
            norm(f"{hf}.attn_norm", (*ours, "attn_norm"))
        bias = config.attention_bias
        linear(f"{hf}.attn.Wqkv", (*ours, "attn", "wqkv"), h, 3 * h, (h, 3, n, d), (3, n, d), bias)
        linear(f"{hf}.attn.Wo", (*ours, "attn", "wo"), h, h, (n, d, h), (h,), bias)
        norm(f"{hf}.mlp_norm", (*ours, "mlp_norm"))
        linear(f"{hf}.mlp.Wi", (*ours, "mlp", "wi"), h, 2 * f, (h, 2, f), (2, f), config.mlp_bias)
        linear(f"{hf}.mlp.Wo", (*ours, "mlp", "wo"), f, h, (f, h), (h,), config.mlp_bias)
    norm(f"{hf_prefix}final_norm", (*root, "final_norm"))
    if kind != MODEL:
        linear("head.dense", ("head", "dense"), h, h, (h, h), (h,), config.classifier_bias)
        norm("head.norm", ("head", "norm"))
    if kind == MASKED_LM and config.decoder_bias:
        add("decoder.bias", ("decoder_bias",), (v,))
    if kind == CLASSIFICATION:
        if not _is_int(num_labels) or num_labels <= 0:
            raise ValueError(f"num_labels={num_labels!r} is invalid: must be a positive int")
        linear("classifier", ("classifier",), h, num_labels, (h, num_labels), (num_labels,), True)
    return specs


def _hf_kind(names) -> str:
    if "classifier.weight" in names:
        return CLASSIFICATION
    if any(name.startswith(("head.", "decoder.")) for name in names):
        return MASKED_LM
    return MODEL


def params_from_hf(state_dict: Mapping[str, Any], config: ModernBertConfig) -> dict:
    """Our params from a transformers state dict (numpy arrays or torch tensors), in the
    layout config.scan_layers asks for.

    What the state dict holds decides the tree: ModernBertForMaskedLM's (head and decoder) or
    ModernBertForSequenceClassification's (head and classifier) gives that module's params,
    ModernBertModel's (names with or without "model.") the encoder's. A missing, mis-shaped
    or unexpected tensor is an error that names it.
    """
    tensors = {name: np.asarray(value) for name, value in state_dict.items()}
    kind = _hf_kind(tensors)
    if kind == MODEL and any(name.startswith("model.") for name in tensors):
        tensors = {name.removeprefix("model."): value for name, value in tensors.items()}
    num_labels = None
    if kind == CLASSIFICATION:
        num_labels = tensors["classifier.weight"].shape[0]
    if kind == MASKED_LM and _TIED_DECODER in tensors:
        decoder = tensors.pop(_TIED_DECODER)
        table = tensors.get("model.embeddings.tok_embeddings.weight")
        if table is not None and not np.array_equal(decoder, table):
            raise ValueError(
                f"tensor {_TIED_DECODER!r} differs from 'model.embeddings.tok_embeddings.weight': "
                "an untied decoder is not supported"
            )
    specs = tensor_specs(config, kind, num_labels)
    unexpected = sorted(set(tensors) - {spec.hf_name for spec in specs})
    if unexpected:
        raise ValueError(f"tensors {unexpected} are not parameters of this {kind} config")
    dtype = jnp.dtype(config.param_dtype)
    params: dict = {}
    for spec in specs:
        if spec.hf_name not in tensors:
            raise ValueError(f"tensor {spec.hf_name!r} is missing (expected shape {spec.hf_shape})")
        array = tensors[spec.hf_name]
        if array.shape != spec.hf_shape:
            raise ValueError(
                f"tensor {spec.hf_name!r} has shape {array.shape}, expected {spec.hf_shape}"
            )
        node = params
        for key in spec.path[:-1]:
            node = node.setdefault(key, {})
        node[spec.path[-1]] = jnp.asarray(spec.to_ours(array), dtype)
    if config.scan_layers:
        if kind == MODEL:
            return stack_layers(params, config)
        params[ENCODER] = stack_layers(params[ENCODER], config)
    return params


def params_to_hf(params: Mapping[str, Any], config: ModernBertConfig) -> dict[str, np.ndarray]:
    """transformers' state dict (numpy, in param_dtype) from our params, boxed or not: the
    inverse of params_from_hf. A masked-LM tree also gets the tied "decoder.weight"."""
    params = nn.meta.unbox(params)
    if ENCODER not in params:
        kind, num_labels = MODEL, None
    elif "classifier" in params:
        kind, num_labels = CLASSIFICATION, np.shape(params["classifier"]["kernel"])[-1]
    else:
        kind, num_labels = MASKED_LM, None
    if config.scan_layers:
        if kind == MODEL:
            params = unstack_layers(params, config)
        else:
            params = {**params, ENCODER: unstack_layers(params[ENCODER], config)}
    state: dict[str, np.ndarray] = {}
    for spec in tensor_specs(config, kind, num_labels):
        node = params
        for key in spec.path:
            if key not in node:
                raise ValueError(f"params have no {'/'.join(spec.path)} (for {spec.hf_name!r})")
            node = node[key]
        array = np.asarray(jax.device_get(node))
        if array.shape != spec.shape:
            raise ValueError(
                f"params {'/'.join(spec.path)} has shape {array.shape}, expected {spec.shape}"
            )
        state[spec.hf_name] = spec.to_hf(array)
    if kind == MASKED_LM:
        state[_TIED_DECODER] = state["model.embeddings.tok_embeddings.weight"].copy()
    return state
