"""ModernBERT's config: presets, transformers' config.json both ways, and their checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from bertjax.nn import attention as attention_lib

DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots")
CLASSIFIER_POOLINGS = ("cls", "mean")
ATTENTION_IMPLEMENTATIONS = attention_lib.IMPLEMENTATIONS
# The implementations served by bertjax.nn.attention's kernels (blocked: CPU blocks with
# documents and windows); any other that resolve_implementation picks ("xla") runs
# ModernBERT's own einsum path.
KERNELS = ("blocked", "cudnn", "splash")

# Special token ids of ModernBERT's tokenizer (a vocabulary of 50,368 rows).
CLS_ID = 50281
SEP_ID = 50282
PAD_ID = 50283


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

    # The encoder family this config belongs to (bertjax.encoders.family_of reads it).
    family: ClassVar[str] = "modernbert"

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
    # The dtype the encoder's matrix products take their operands in, their sums in float32
    # (bertjax.nn.low_precision); None: dtype. "bfloat16" with dtype float32: the products at the
    # host's bfloat16 rate, activations, norms and residuals in float32.
    matmul_dtype: str | None = None
    remat_policy: str = "none"  # "none" | "full" | "dots" (save matmul outputs)
    scan_layers: bool = False
    # "auto" | "xla" | "cudnn" | "splash" (bertjax.nn.attention); not a transformers field.
    attention_impl: str = "auto"
    # The token embeddings' width where it differs from hidden_size: a projection to
    # hidden_size follows their norm and the prediction head maps back to it (a replaced-token
    # detection generator reading its discriminator's embeddings, bertjax.encoders.modernbert.
    # rtd). None: hidden_size. transformers has no such ModernBERT.
    embedding_size: int | None = None

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
        if self.embedding_size is not None and (
            not _is_int(self.embedding_size) or self.embedding_size <= 0
        ):
            raise ValueError(
                f"ModernBertConfig.embedding_size={self.embedding_size!r} is invalid: must be "
                "None or a positive int"
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
            ("matmul_dtype", (None, *DTYPES)),
            ("remat_policy", REMAT_POLICIES),
            ("attention_impl", ATTENTION_IMPLEMENTATIONS),
        ):
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(
                    f"ModernBertConfig.{name}={value!r} is invalid: must be one of {valid}"
                )

    @property
    def embedding_width(self) -> int:
        """The token embeddings' width (embedding_size, else hidden_size)."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

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
        fields transformers does not have (dtype, param_dtype, matmul_dtype, remat_policy,
        scan_layers, attention_impl).
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
        if self.embedding_width != self.hidden_size:
            raise ValueError(
                f"ModernBertConfig.embedding_size={self.embedding_size} differs from "
                f"hidden_size={self.hidden_size}: transformers has no ModernBERT class with "
                "projected embeddings (a replaced-token detection generator), so it is not "
                "written in its format"
            )
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


# Attention heads are this wide in replaced-token detection's generator (ELECTRA: hidden // 64).
GENERATOR_HEAD_WIDTH = 64


def generator_config(config: ModernBertConfig, fraction: float) -> ModernBertConfig:
    """Replaced-token detection's generator beside a discriminator of `config`: hidden size
    g = round(fraction * h), heads g // 64 (at least 1), feed-forward scaled by the same
    fraction, the same depth and layer pattern, embeddings h wide (the discriminator's,
    projected to g)."""
    hidden = max(1, int(round(config.hidden_size * fraction)))
    heads = max(1, hidden // GENERATOR_HEAD_WIDTH)
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
