"""ElectraConfig: BERT's architecture fields plus the embedding width and the classifier's
dropout, as transformers' ElectraConfig has them.

The config is its own class, not a BertConfig subclass: a family is found by its config's
class, and code that serves BERT alone (the seq2seq decoder is BERT's layers) refuses an
ELECTRA config by its type. The modules are BERT's, built from the two BertConfigs this one
derives: `bert` for the transformer layers (hidden width) and `embedding` for the embeddings
and the generator's head (embedding width).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from bertjax.encoders.bert.config import BertConfig

# transformers' ElectraConfig defaults (ELECTRA-Small's discriminator): a config.json field
# that is absent means these.
HF_DEFAULTS = dict(
    vocab_size=30522,
    embedding_size=128,
    hidden_size=256,
    num_hidden_layers=12,
    num_attention_heads=4,
    intermediate_size=1024,
    max_position_embeddings=512,
    type_vocab_size=2,
)

# The discriminators of the ELECTRA paper (Clark et al. 2020, Table 6) and of google-research/
# electra's configure_pretraining.py: embedding width, hidden width, layers, heads, FFN width.
# "tiny" is this project's CPU demo (configs/electra_tiny.py).
PRESETS: dict[str, dict] = {
    name: dict(embedding_size=e, hidden_size=h, num_layers=n, num_heads=a, intermediate_size=4 * h)
    for name, (e, h, n, a) in {
        "tiny": (128, 128, 2, 2),
        "small": (128, 256, 12, 4),
        "base": (768, 768, 12, 12),
        "large": (1024, 1024, 24, 16),
    }.items()
}

# The fields that fix what the weights mean (shapes and numerics): BERT's and the embedding
# width. A checkpoint opens only into a config that agrees on every one.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "embedding_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "hidden_act",
)

# BertConfig's fields an ElectraConfig shares (every one but those ELECTRA fixes: learned
# positions, google's head initialisation).
_SHARED = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_dropout",
    "attention_dropout",
    "layer_norm_eps",
    "initializer_range",
    "hidden_act",
    "dtype",
    "param_dtype",
    "matmul_dtype",
    "attention_impl",
    "remat_policy",
    "scan_layers",
)


@dataclasses.dataclass(frozen=True)
class ElectraConfig:
    """Architecture and numerics of an ELECTRA encoder; validated on construction.

    ``embedding_size`` is the width of the embedding tables (projected to ``hidden_size``
    when the two differ); ``classifier_dropout`` the rate of the classifiers' dropout (None:
    ``hidden_dropout``, as in transformers).
    """

    # The encoder family this config belongs to (bertjax.encoders.family_of reads it).
    family: ClassVar[str] = "electra"

    vocab_size: int = HF_DEFAULTS["vocab_size"]
    embedding_size: int = HF_DEFAULTS["embedding_size"]
    hidden_size: int = HF_DEFAULTS["hidden_size"]
    num_layers: int = HF_DEFAULTS["num_hidden_layers"]
    num_heads: int = HF_DEFAULTS["num_attention_heads"]
    intermediate_size: int = HF_DEFAULTS["intermediate_size"]
    max_position_embeddings: int = HF_DEFAULTS["max_position_embeddings"]
    type_vocab_size: int = HF_DEFAULTS["type_vocab_size"]
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    classifier_dropout: float | None = None
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    hidden_act: str = "gelu"  # "gelu" (exact erf) | "gelu_tanh"
    dtype: str = "float32"
    param_dtype: str = "float32"
    matmul_dtype: str | None = None  # as BertConfig's
    attention_impl: str = "auto"
    remat_policy: str = "none"
    scan_layers: bool = False

    def __post_init__(self):
        value = self.embedding_size
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(
                f"ElectraConfig.embedding_size={value!r} is invalid: must be a positive int"
            )
        value = self.classifier_dropout
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1
        ):
            raise ValueError(
                f"ElectraConfig.classifier_dropout={value!r} is invalid: must be None or in [0, 1)"
            )
        try:  # BertConfig checks every shared field; its message names ours
            self.bert  # noqa: B018
        except ValueError as err:
            raise ValueError(str(err).replace("BertConfig.", "ElectraConfig.")) from None

    @property
    def bert(self) -> BertConfig:
        """The transformer layers' config (hidden width)."""
        return BertConfig(**{name: getattr(self, name) for name in _SHARED})

    @property
    def embedding(self) -> BertConfig:
        """The config of what runs at the embedding width: the embeddings, and the generator's
        head (transformers' ElectraGeneratorPredictions: its GELU is the exact one whatever
        ``hidden_act``). No attention runs at this width, so one head divides it."""
        return dataclasses.replace(
            self.bert, hidden_size=self.embedding_size, num_heads=1, hidden_act="gelu"
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def classifier_rate(self) -> float:
        """The classifiers' dropout rate: classifier_dropout, else hidden_dropout."""
        if self.classifier_dropout is None:
            return self.hidden_dropout
        return self.classifier_dropout

    def to_dict(self) -> dict:
        """JSON-serialisable field values."""
        return dataclasses.asdict(self)

    @classmethod
    def preset(cls, name: str, **overrides) -> ElectraConfig:
        """A named discriminator size (PRESETS) with field overrides."""
        if name not in PRESETS:
            raise ValueError(
                f"ELECTRA preset {name!r} is unknown: valid presets are {list(PRESETS)}"
            )
        return cls(**{**PRESETS[name], **overrides})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ElectraConfig:
        """Inverse of ``to_dict``; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown ElectraConfig fields {unknown}: valid fields are {sorted(known)}"
            )
        return cls(**d)


def generator_config(config: ElectraConfig, fraction: float) -> ElectraConfig:
    """Replaced-token detection's generator beside a discriminator of `config`, as
    google-research/electra's get_generator_config shapes it: hidden size round(fraction *
    hidden), FFN four times that, heads hidden // 64 (at least 1); the discriminator's depth
    and embeddings."""
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
