"""Sentence embeddings: a BERT encoder, a pooling, optional normalisation; search over them.

A bi-encoder embeds each text on its own: [CLS] text [SEP] through the encoder of the
config's family (parameters under "bert", as in every other bertjax model), then one vector
per text from the encoder's outputs:

  mean  the mean over the text's tokens ([CLS] and [SEP] included, padding not): the default,
        what sentence-transformers' models mostly use
  cls   the output at [CLS]
  max   the element-wise maximum over the text's tokens

and, with `normalize`, the vector scaled to unit length. `EmbeddingSpec` holds these choices
with the longest input (`max_seq_length`, [CLS] and [SEP] included); it travels with a trained
model, as sentence-transformers' modules.json, pooling config and sentence_bert_config.json do
(bertjax.tasks.embed.hf writes and reads those).

Texts become inputs as sentence-transformers' tokenizers make them: an empty text is
[CLS] [SEP], a long one keeps its first max_seq_length - 2 tokens. `embed_inputs` runs a model
over a padded batch (Model.embed batches texts through the notebook's one path); `similarity`
and `search` (exact top-k by cosine similarity, blocked and jitted) work on the vectors.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import encoders
from bertjax.capability import ENCODER
from bertjax.encoders.family import EncoderConfig
from bertjax.inference.vectors import l2_normalize
from bertjax.nn import pooling as pooling_lib
from bertjax.nn import sharding
from bertjax.nn.sharding import ACTIVATION_EMBED, BATCH
from bertjax.text.tokenizer import Tokenizer

MEAN = "mean"
CLS = "cls"
MAX = "max"
POOLINGS = (MEAN, CLS, MAX)
# The fine-tuning task (and HeadSpec task name) of a trained embedding model.
EMBEDDING_TASK = "embedding"


@dataclasses.dataclass(frozen=True)
class EmbeddingSpec:
    """How a model turns a text into one vector: pooling, normalisation, longest input."""

    pooling: str = MEAN
    normalize: bool = False
    max_seq_length: int = 128  # [CLS] and [SEP] included

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"EmbeddingSpec.pooling={self.pooling!r} is invalid: must be one of {POOLINGS}"
            )
        if not isinstance(self.normalize, bool):
            raise ValueError(
                f"EmbeddingSpec.normalize={self.normalize!r} is invalid: must be True or False"
            )
        length = self.max_seq_length
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 2:
            raise ValueError(
                f"EmbeddingSpec.max_seq_length={length!r} is invalid: must be an int >= 2 "
                "(room for [CLS] and [SEP])"
            )

    def check(self, config: EncoderConfig) -> None:
        """Fails unless the model has a position for every token of the longest input."""
        if self.max_seq_length > config.max_position_embeddings:
            raise ValueError(
                f"EmbeddingSpec.max_seq_length={self.max_seq_length} is invalid for this model: "
                f"must be at most its max_position_embeddings={config.max_position_embeddings}"
            )

    def to_dict(self) -> dict:
        """JSON-serialisable form, for checkpoint meta."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EmbeddingSpec:
        return cls(**d)

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> EmbeddingSpec:
        """The spec an embedding head's labels carried before options were typed (other
        `name=value` labels ignored)."""
        items = dict(label.split("=", 1) for label in labels if "=" in label)
        missing = [k for k in ("pooling", "normalize", "max_seq_length") if k not in items]
        if missing:
            raise ValueError(f"embedding head labels {list(labels)} lack {missing}")
        return cls(
            pooling=items["pooling"],
            normalize=items["normalize"] == "True",
            max_seq_length=int(items["max_seq_length"]),
        )


# ----------------------------------------------------------------------------- pooling


def pool(sequence: jax.Array, input_mask: jax.Array, pooling: str) -> jax.Array:
    """One float32 vector per row from [batch, seq, hidden] encoder outputs: [batch, hidden].

    `input_mask` [batch, seq] marks the text's tokens. "cls" reads position 0 only, so
    `sequence` may be the encoder's [batch, 1, hidden] cls_only output. A row without tokens
    (padding a batch) pools to zeros.
    """
    if pooling == CLS:
        return sequence[:, 0].astype(jnp.float32)  # [b, h]
    mask = input_mask[..., None].astype(bool)  # [b, s, 1]
    values = sequence.astype(jnp.float32)
    if pooling == MAX:
        lowest = jnp.finfo(jnp.float32).min
        best = jnp.max(jnp.where(mask, values, lowest), axis=1)  # [b, h]
        return jnp.where(jnp.any(mask, axis=1), best, 0.0)
    if pooling != MEAN:
        raise ValueError(f"pooling={pooling!r} is invalid: must be one of {POOLINGS}")
    return pooling_lib.mean(sequence, input_mask)  # [b, h]


class BiEncoder(nn.Module):
    """The encoder ("bert") -> pooling -> optional normalisation: [batch, hidden] float32."""

    config: EncoderConfig
    pooling: str = MEAN
    normalize: bool = False

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
    ) -> jax.Array:
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        sequence, _ = encoders.family_of(self.config).module(self.config, name=ENCODER)(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
            # [CLS] pooling reads one position: the last layer runs its queries there only.
            cls_only=self.pooling == CLS,
        )  # [b, s or 1, h]
        vectors = pool(sequence, attention_mask, self.pooling)  # [b, h]
        if self.normalize:
            vectors = l2_normalize(vectors)
        return sharding.constrain(vectors, (BATCH, ACTIVATION_EMBED))


def make_model(config: EncoderConfig, spec: EmbeddingSpec) -> BiEncoder:
    """The linen module of an embedding model."""
    return BiEncoder(config, spec.pooling, spec.normalize)


def init_params(model: BiEncoder, rng: jax.Array, seq_len: int = 1):
    """Boxed parameters of a bi-encoder (`rng -> params`, for steps.make_state)."""
    ids = jnp.zeros((1, seq_len), jnp.int32)  # [batch, seq]
    return model.init({"params": rng}, ids, ids, ids)["params"]


# ----------------------------------------------------------------------------- text to vectors


def token_ids(tokenizer: Tokenizer, texts: Sequence[str], max_seq_length: int) -> list[list[int]]:
    """[CLS] tokens [SEP] per text, cut to max_seq_length; an empty text is [CLS] [SEP].

    Special tokens written in a text ("[MASK]") become their ids, as transformers'
    tokenizers (and so sentence-transformers) read them.
    """
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{i}] is of type {type(text).__name__}, not str")
    encoded = tokenizer.encode_batch(list(texts), special_tokens_in_text=True)
    budget = max_seq_length - 2
    return [[tokenizer.cls_id, *ids[:budget], tokenizer.sep_id] for ids in encoded]


def pad_inputs(sequences: Sequence[Sequence[int]], length: int, rows: int | None = None) -> dict:
    """Token id lists -> zero-padded int32 [rows, length] input_ids, input_mask, segment_ids."""
    rows = len(sequences) if rows is None else rows
    input_ids = np.zeros((rows, length), np.int32)
    input_mask = np.zeros((rows, length), np.int32)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = ids
        input_mask[row, : len(ids)] = 1
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": np.zeros_like(input_ids),
    }


@functools.partial(jax.jit, static_argnames=("config", "pooling", "normalize", "packed_length"))
def embed_inputs(
    params,
    batch,
    *,
    config: EncoderConfig,
    pooling: str,
    normalize: bool,
    packed_length: int | None = None,
):
    """float32 [b, hidden] vectors of a padded batch; params is BiEncoder's tree ("bert");
    `packed_length` as the encoder's."""
    return BiEncoder(config, pooling, normalize).apply(
        {"params": {ENCODER: params[ENCODER]}},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        deterministic=True,
        packed_length=packed_length,
    )
