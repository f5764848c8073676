"""BERT's config: its presets, the fields that fix what the weights mean, and their checks."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from bertjax.nn import attention as attention_lib

ACTIVATIONS = ("gelu", "gelu_tanh")
# How the kernels of the pretraining heads (the MLM transform and the NSP classifier) start:
# "truncated_normal" is google's (initializer_range, like every other kernel); "lecun_normal"
# draws them with variance 1/fan_in, as transformers' Flax BERT did, to compare with models
# started that way. Neither changes what the weights mean. On the tiny preset lecun_normal
# heads left the unigram plateau later, not sooner (docs/training.md); a larger
# initializer_range for every weight is what shortened it there.
HEAD_INITS = ("truncated_normal", "lecun_normal")
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal")
# The encoder's key for all layers stacked along a leading axis (scan_layers=True).
STACKED_LAYERS = "layers"
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots")

# name -> (hidden_size, num_layers, num_heads, intermediate_size); the intermediate is 4H.
PRESETS: dict[str, dict] = {
    name: dict(hidden_size=h, num_layers=n, num_heads=a, intermediate_size=4 * h)
    for name, (h, n, a) in {
        "tiny": (128, 2, 2),
        "mini": (256, 4, 4),
        "small": (512, 4, 8),
        "medium": (512, 8, 8),
        "base": (768, 12, 12),
        "large": (1024, 24, 16),
    }.items()
}

# The BertConfig fields that fix what the weights mean (their shapes and numerics): a
# checkpoint is only usable by a model that agrees on every one of them.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "hidden_act",
    "position_embedding_type",
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture and numerics of a BERT model; validated on construction."""

    # The encoder family this config belongs to (bertjax.encoders.family_of reads it).
    family: ClassVar[str] = "bert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    hidden_act: str = "gelu"  # "gelu" (exact erf) | "gelu_tanh"
    head_init: str = "truncated_normal"  # "truncated_normal" (google) | "lecun_normal"
    position_embedding_type: str = "learned"  # "learned" | "sinusoidal"
    dtype: str = "float32"  # compute dtype name, e.g. "bfloat16"
    param_dtype: str = "float32"
    # The dtype the encoder's matrix products take their operands in, their sums in float32
    # (bertjax.nn.low_precision); None: dtype. "bfloat16" with dtype float32: the products at the
    # host's bfloat16 rate, activations, norms and residuals in float32.
    matmul_dtype: str | None = None
    attention_impl: str = "auto"  # "auto" | "xla" | "cudnn" | "splash"
    remat_policy: str = "none"  # "none" | "full" | "dots" (save matmul outputs)
    scan_layers: bool = False

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"BertConfig.{name}={value!r} is invalid: must be a positive int")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"BertConfig.hidden_size={self.hidden_size} is invalid: must be divisible by "
                f"num_heads={self.num_heads}"
            )
        for name in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"BertConfig.{name}={value!r} is invalid: must be in [0, 1)")
        for name in ("layer_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(
                    f"BertConfig.{name}={value!r} is invalid: must be a positive float"
                )
        for name, valid in (
            ("hidden_act", ACTIVATIONS),
            ("head_init", HEAD_INITS),
            ("position_embedding_type", POSITION_EMBEDDING_TYPES),
            ("dtype", DTYPES),
            ("param_dtype", DTYPES),
            ("matmul_dtype", (None, *DTYPES)),
            ("attention_impl", attention_lib.IMPLEMENTATIONS),
            ("remat_policy", REMAT_POLICIES),
        ):
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(f"BertConfig.{name}={value!r} is invalid: must be one of {valid}")
        if not isinstance(self.scan_layers, bool):
            raise ValueError(
                f"BertConfig.scan_layers={self.scan_layers!r} is invalid: must be True or False"
            )
        if self.position_embedding_type == "sinusoidal" and self.hidden_size % 2:
            raise ValueError(
                f"BertConfig.hidden_size={self.hidden_size} is invalid with sinusoidal position "
                "embeddings: must be even"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def preset(cls, name: str, **overrides) -> BertConfig:
        """A named size (tiny/mini/small/medium/base/large) with optional field overrides."""
        if name not in PRESETS:
            raise ValueError(f"unknown BERT preset {name!r}: valid presets are {tuple(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self) -> dict:
        """JSON-serialisable field values."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BertConfig:
        """Inverse of ``to_dict``; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown BertConfig fields {unknown}: valid fields are {sorted(known)}"
            )
        return cls(**d)
