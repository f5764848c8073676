"""BERT encoder-decoder ("bert2bert") for translation and text generation.

The model is transformers' EncoderDecoderModel with BERT on both sides (Rothe, Narayan and
Severyn, "Leveraging Pre-trained Checkpoints for Sequence Generation Tasks", TACL 2020):

  encoder   bertjax.encoders.bert.model.BertModel, parameters under "bert" (a pretrained
            encoder drops in)
  decoder   "decoder": its own embeddings, then per layer causal self-attention -> LayerNorm,
            cross-attention over the encoder output -> LayerNorm, feed-forward -> LayerNorm
            (post-LN, as BertLMHeadModel with add_cross_attention=True), then the MLM head
            (dense + GELU + LayerNorm, logits against the decoder's word embeddings + bias)

Parameter names follow the encoder's, so a decoder layer's "attention" and "mlp" have the
same tree as an encoder layer's and a checkpoint fills them as is; "cross_attention" has the
tree of "attention". Einsum letters are those of bertjax.encoders.bert.model (b s t h n d f v).

Initialisations (Seq2SeqConfig.init, the paper's names; `init_params`):
  bert2bert  encoder and decoder from the checkpoint, cross-attention new
  bertshare  as bert2bert, and the decoder's embeddings, self-attention and feed-forward *are*
             the encoder's (one set of weights, trained together); cross-attention new
  bert2rnd   encoder from the checkpoint, decoder new
  rnd2rnd    everything new
New parameters start as google's BERT starts them (truncated normal initializer_range, zero
biases, LayerNorm ones/zeros). For bertshare the stored tree has no decoder "embeddings" and
no decoder layer "attention"/"mlp": `full_params` puts the encoder's there before applying
the module, so their gradients add up from both uses.

Training (`loss_sums`): teacher forcing, decoder inputs are the targets shifted right behind
the decoder start token ([CLS]); targets end with [SEP]; cross-entropy over target tokens
only, with optional label smoothing; sums and a count as bertjax.nn.heads.HeadSums.

Generation, greedy and beam search: bertjax.tasks.seq2seq.decoding. What a fine-tuned model
is beyond its architecture: bertjax.tasks.seq2seq.options.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.capability import ENCODER
from bertjax.encoders.bert.config import STACKED_LAYERS, BertConfig
from bertjax.encoders.bert.model import (
    BertModel,
    Dropout,
    Embeddings,
    FeedForward,
    HeadsProjection,
    MlmHead,
    OutputProjection,
    _layer_norm,
    unstack_layers,
)
from bertjax.nn import sharding
from bertjax.nn.heads import HeadSums
from bertjax.nn.masks import MASK_VALUE, dropout_keep_mask
from bertjax.nn.sharding import ACTIVATION_EMBED, BATCH, HEADS, KV, LENGTH

BERT2BERT = "bert2bert"
BERTSHARE = "bertshare"
BERT2RND = "bert2rnd"
RND2RND = "rnd2rnd"
INITS = (BERT2BERT, BERTSHARE, BERT2RND, RND2RND)
PAD_ID = 0  # [PAD] is 0 in every bertjax vocabulary
# The fine-tuning task (bertjax.tasks.seq2seq.task) whose checkpoints hold this model.
# Named here, where every run directory reader sees it, so that a run opens without
# importing the fine-tuning package.
TASK = "seq2seq"
QKV = (BATCH, LENGTH, HEADS, KV)


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig:
    """An encoder-decoder: one BERT architecture for both sides, the init, special ids."""

    bert: BertConfig
    decoder_start_id: int  # [CLS]: the first decoder input
    eos_id: int  # [SEP]: ends every target and stops generation
    init: str = BERT2BERT  # one of INITS

    def __post_init__(self):
        if getattr(self.bert, "family", None) != BertConfig.family:
            raise ValueError(f"Seq2SeqConfig.bert={self.bert!r} is invalid: must be a BertConfig")
        if self.init not in INITS:
            raise ValueError(f"Seq2SeqConfig.init={self.init!r} is invalid: must be one of {INITS}")
        for name in ("decoder_start_id", "eos_id"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or not 0 < value < self.bert.vocab_size
            ):
                raise ValueError(
                    f"Seq2SeqConfig.{name}={value!r} is invalid: must be a token id in "
                    f"[1, {self.bert.vocab_size}) (0 is [PAD])"
                )
        if self.bert.scan_layers:
            raise ValueError(
                "Seq2SeqConfig.bert.scan_layers=True is not supported: the encoder-decoder "
                "runs its layers unrolled (set scan_layers=False)"
            )

    @property
    def shared(self) -> bool:
        """Whether the decoder's embeddings, self-attention and feed-forward are the encoder's."""
        return self.init == BERTSHARE

    def to_dict(self) -> dict:
        """JSON-serialisable field values."""
        return {**dataclasses.asdict(self), "bert": self.bert.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping) -> Seq2SeqConfig:
        """Inverse of ``to_dict``."""
        return cls(**{**d, "bert": BertConfig.from_dict(d["bert"])})


# ------------------------------------------------------------------------------ the model


def attend(query, key, value, mask, *, dropout_rate=0.0, dropout_rng=None, deterministic=True):
    """Scaled dot-product attention with an explicit [batch or 1, queries, keys] bool mask.

    q [b, s, n, d], k and v [b, t, n, d] -> [b, s, n, d]; the softmax runs in float32.
    """
    scale = 1.0 / math.sqrt(query.shape[-1])
    logits = (
        jnp.einsum("bsnd,btnd->bnst", query, key, preferred_element_type=jnp.float32) * scale
    )  # [b, n, s, t]
    logits = jnp.where(mask[:, None], logits, MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1)
    if not deterministic and dropout_rate > 0.0:
        keep_prob = 1.0 - dropout_rate
        kept = dropout_keep_mask(dropout_rng, keep_prob, weights.shape)
        weights = jnp.where(kept, weights / keep_prob, 0.0)
    return jnp.einsum("bnst,btnd->bsnd", weights.astype(value.dtype), value)  # [b, s, n, d]


class Attention(nn.Module):
    """Attention block: queries from x, given keys/values, output, dropout, residual, LN.

    Its parameters have the tree of bertjax.encoders.bert.model.SelfAttention (query, key,
    value, output, layer_norm), so an encoder layer's attention fills a decoder's self- or
    cross-attention.
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.query = HeadsProjection(cfg)
        self.key = HeadsProjection(cfg)
        self.value = HeadsProjection(cfg)
        self.output = OutputProjection(cfg)
        self.layer_norm = _layer_norm(cfg)
        self.dropout = Dropout(cfg.hidden_dropout)

    def keys_values(self, memory: jax.Array) -> tuple[jax.Array, jax.Array]:
        """[b, t, h] -> keys and values [b, t, n, d]."""
        k = sharding.constrain(self.key(memory), QKV)  # [b, t, n, d]
        v = sharding.constrain(self.value(memory), QKV)  # [b, t, n, d]
        return k, v

    def __call__(self, x, keys, values, mask, deterministic: bool):
        cfg = self.config
        q = sharding.constrain(self.query(x), QKV)  # [b, s, n, d]
        dropout_active = not deterministic and cfg.attention_dropout > 0
        context = attend(
            q,
            keys,
            values,
            mask,
            dropout_rate=cfg.attention_dropout,
            dropout_rng=self.make_rng("dropout") if dropout_active else None,
            deterministic=deterministic,
        )  # [b, s, n, d]
        y = self.output(sharding.constrain(context, QKV))  # [b, s, h]
        y = self.dropout(y, deterministic=deterministic)
        return self.layer_norm(y + x)


class DecoderLayer(nn.Module):
    """Causal self-attention -> cross-attention -> feed-forward, each post-LayerNorm."""

    config: BertConfig

    def setup(self):
        self.attention = Attention(self.config)
        self.cross_attention = Attention(self.config)
        self.mlp = FeedForward(self.config)

    def cross_keys_values(self, encoded: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The cross-attention keys and values of the encoder output [b, t, h]."""
        return self.cross_attention.keys_values(encoded)

    def __call__(self, x, self_mask, cross_kv, cross_mask, deterministic: bool, cache, start):
        """x [b, s, h] at positions start.. ; cache: None, or this layer's (keys, values)
        [b, T, n, d] to write the new positions into and attend over."""
        k, v = self.attention.keys_values(x)  # [b, s, n, d]
        if cache is not None:
            k = jax.lax.dynamic_update_slice_in_dim(cache[0], k.astype(cache[0].dtype), start, 1)
            v = jax.lax.dynamic_update_slice_in_dim(cache[1], v.astype(cache[1].dtype), start, 1)
            k, v = sharding.constrain(k, QKV), sharding.constrain(v, QKV)  # [b, T, n, d]
            cache = (k, v)
        x = self.attention(x, k, v, self_mask, deterministic)
        x = self.cross_attention(x, cross_kv[0], cross_kv[1], cross_mask, deterministic)
        x = self.mlp(x, deterministic)
        return sharding.constrain(x, (BATCH, LENGTH, ACTIVATION_EMBED)), cache


class Decoder(nn.Module):
    """Embeddings, decoder layers layer_0.., and the MLM head tied to the word embeddings."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        self.layers = tuple(DecoderLayer(cfg, name=f"layer_{i}") for i in range(cfg.num_layers))
        self.mlm_head = MlmHead(cfg)

    def cross_keys_values(self, encoded: jax.Array) -> tuple:
        """Per layer, the cross-attention (keys, values) [b, t, n, d] of the encoder output."""
        return tuple(layer.cross_keys_values(encoded) for layer in self.layers)

    def __call__(self, ids, cross_kvs, cross_mask, deterministic: bool, cache=None, start=0):
        """ids [b, s] at positions start..start+s-1 -> float32 logits [b, s, v] and the cache.

        Without a cache the s positions attend causally among themselves (start must be 0);
        with one (a tuple of per-layer (keys, values) [b, T, n, d]) they attend to cached
        positions up to their own.
        """
        seq = ids.shape[1]
        x = self.embeddings(ids, jnp.zeros_like(ids), deterministic, start=start)  # [b, s, h]
        keys = seq if cache is None else cache[0][0].shape[1]
        query_pos = start + jnp.arange(seq)  # [s]
        self_mask = (jnp.arange(keys)[None, :] <= query_pos[:, None])[None]  # [1, s, t]
        cross_mask = cross_mask.astype(bool)[:, None, :]  # [b, 1, t]
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer(
                x,
                self_mask,
                cross_kvs[i],
                cross_mask,
                deterministic,
                None if cache is None else cache[i],
                start,
            )
            new_cache.append(layer_cache)
        logits = self.mlm_head(x, self.embeddings.word_table())  # [b, s, v]
        return logits, (None if cache is None else tuple(new_cache))


class Seq2SeqModel(nn.Module):
    """BERT encoder ("bert") + BERT decoder with cross-attention ("decoder")."""

    config: Seq2SeqConfig

    def setup(self):
        self.bert = BertModel(self.config.bert)
        self.decoder = Decoder(self.config.bert)

    def encode(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
    ):
        """The encoder output [b, t, h] (zero at padding with packed_length)."""
        encoded, _ = self.bert(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
        )
        return encoded

    def cross_keys_values(self, encoded: jax.Array) -> tuple:
        """Per decoder layer, the cross-attention (keys, values) of the encoder output."""
        return self.decoder.cross_keys_values(encoded)

    def decode(self, ids, cross_kvs, attention_mask, *, cache=None, start=0, deterministic=True):
        """Decoder logits [b, s, v] (and the updated cache) given cross keys/values."""
        return self.decoder(ids, cross_kvs, attention_mask, deterministic, cache, start)

    def __call__(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        decoder_input_ids,
        *,
        deterministic: bool = True,
        packed_length: int | None = None,
    ) -> jax.Array:
        """Teacher-forced logits [b, s, v] (float32) for decoder_input_ids [b, s]."""
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        encoded = self.encode(
            input_ids,
            token_type_ids,
            attention_mask,
            deterministic=deterministic,
            packed_length=packed_length,
        )  # [b, t, h]
        cross = self.cross_keys_values(encoded)
        logits, _ = self.decoder(decoder_input_ids, cross, attention_mask, deterministic)
        return logits


# ------------------------------------------------------------------------------ parameters


def _decoder_shared_paths(num_layers: int) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(decoder path, encoder path) of every subtree bertshare shares."""
    pairs = [(("decoder", "embeddings"), (ENCODER, "embeddings"))]
    for i in range(num_layers):
        for part in ("attention", "mlp"):
            pairs.append(
                (("decoder", f"layer_{i}", part), (ENCODER, "encoder", f"layer_{i}", part))
            )
    return pairs


def _as_dict(tree: Any) -> Any:
    if isinstance(tree, Mapping) and not sharding.is_box(tree):
        return {k: _as_dict(v) for k, v in tree.items()}
    return tree


def _get(tree: Mapping, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _pop(tree: dict, path: tuple[str, ...]) -> None:
    for key in path[:-1]:
        tree = tree[key]
    del tree[path[-1]]


def full_params(config: Seq2SeqConfig, params: Mapping) -> dict:
    """The module's whole parameter tree: for bertshare, the encoder's shared subtrees are
    placed in the decoder too (the same arrays); otherwise `params` as is."""
    params = _as_dict(params)
    if config.shared:
        for decoder_path, encoder_path in _decoder_shared_paths(config.bert.num_layers):
            _set(params, decoder_path, _get(params, encoder_path))
    return params


def stored_params(config: Seq2SeqConfig, params: Mapping) -> dict:
    """Inverse of full_params: for bertshare, drops the decoder's copies of shared subtrees."""
    params = _as_dict(params)
    if config.shared:
        for decoder_path, _ in _decoder_shared_paths(config.bert.num_layers):
            _pop(params, decoder_path)
    return params


def _graft(fresh: Any, source: Any, where: str) -> Any:
    """``fresh`` (boxed) with every value replaced by the same-shaped leaf of ``source``."""
    source = nn.meta.unbox(source)
    if jax.tree.structure(nn.meta.unbox(fresh)) != jax.tree.structure(source):
        raise ValueError(f"pretrained params at {where} do not have the expected structure")

    def one(box, value):
        target = box.value if sharding.is_box(box) else box
        if tuple(np.shape(value)) != tuple(target.shape):
            raise ValueError(
                f"pretrained params at {where}: shape {np.shape(value)} where "
                f"{tuple(target.shape)} is expected"
            )
        value = jnp.asarray(value, target.dtype)
        return box.replace(value=value) if sharding.is_box(box) else value

    return jax.tree.map(one, fresh, source, is_leaf=sharding.is_box)


@functools.partial(jax.jit, static_argnums=0)
def _fresh_params(config: Seq2SeqConfig, rng: jax.Array) -> Any:
    ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
    return Seq2SeqModel(config).init({"params": rng}, ids, None, None, ids)["params"]


def init_params(config: Seq2SeqConfig, rng: jax.Array, pretrained: Mapping | None = None) -> dict:
    """Boxed stored parameters (see stored_params) initialised per ``config.init``.

    ``pretrained`` is a BertForPreTraining params tree ({"bert": ..., "mlm_head": ...}, as
    bertjax.encoders.bert.hf.load returns it): required by bert2bert, bertshare and
    bert2rnd, unused by
    rnd2rnd. Its "mlm_head", when present, starts the decoder's output head.
    """
    fresh = _as_dict(_fresh_params(config, rng))
    if config.init == RND2RND:
        return stored_params(config, fresh)
    if pretrained is None:
        raise ValueError(
            f"Seq2SeqConfig.init={config.init!r} needs pretrained BERT params; use "
            f"init={RND2RND!r} to start from random weights"
        )
    return from_pretrained(config, stored_params(config, fresh), pretrained)


def from_pretrained(config: Seq2SeqConfig, fresh: Mapping, pretrained: Mapping) -> dict:
    """Stored parameters ``fresh`` (boxed or not) warm-started from BertForPreTraining's tree
    (``pretrained``: "bert" and optionally "mlm_head") as ``config.init`` says: the encoder
    always; for bert2bert also the decoder's embeddings, self-attention, feed-forward and
    output head; bertshare's decoder shares the encoder's. Cross-attention stays fresh."""
    pretrained = _as_dict(nn.meta.unbox(pretrained))
    if ENCODER not in pretrained:
        raise ValueError(
            f"pretrained params hold {sorted(pretrained)}; expected BertForPreTraining's tree "
            f"with a {ENCODER!r} entry"
        )
    bert = pretrained[ENCODER]
    if STACKED_LAYERS in bert.get("encoder", {}):
        bert = unstack_layers(bert, config.bert.num_layers)
    fresh = full_params(config, fresh)
    fresh[ENCODER] = _graft(fresh[ENCODER], bert, ENCODER)
    if config.init == BERT2BERT:
        for decoder_path, encoder_path in _decoder_shared_paths(config.bert.num_layers):
            where = "/".join(encoder_path)
            source = _get(bert, encoder_path[1:])
            _set(fresh, decoder_path, _graft(_get(fresh, decoder_path), source, where))
    if config.init in (BERT2BERT, BERTSHARE) and "mlm_head" in pretrained:
        fresh["decoder"]["mlm_head"] = _graft(
            fresh["decoder"]["mlm_head"], pretrained["mlm_head"], "mlm_head"
        )
    return stored_params(config, fresh)


# ------------------------------------------------------------------------------ training


def shift_right(target_ids: jax.Array, decoder_start_id: int) -> jax.Array:
    """Decoder inputs for teacher forcing: [start, y_1, ..., y_{n-1}] for targets [b, n]."""
    start = jnp.full_like(target_ids[:, :1], decoder_start_id)  # [b, 1]
    return jnp.concatenate([start, target_ids[:, :-1]], axis=1)  # [b, n]


def target_features(
    targets: Sequence[Sequence[int]], max_target_length: int, decoder_start_id: int, eos_id: int
) -> dict[str, np.ndarray]:
    """target_ids, target_mask and decoder_input_ids [n, max_target_length] (int32) for
    target token ids given without special tokens: each target is cut to leave room for
    [SEP] at its end, then padded."""
    if max_target_length < 2:
        raise ValueError(f"max_target_length={max_target_length} is invalid: must be >= 2")
    ids = np.zeros((len(targets), max_target_length), np.int32)
    mask = np.zeros_like(ids)
    for row, target in enumerate(targets):
        tokens = [*list(target)[: max_target_length - 1], eos_id]
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    decoder_inputs = np.asarray(shift_right(jnp.asarray(ids), decoder_start_id))
    return {"target_ids": ids, "target_mask": mask, "decoder_input_ids": decoder_inputs}


def loss_sums(
    logits: jax.Array, target_ids: jax.Array, target_mask: jax.Array, label_smoothing: float = 0.0
) -> HeadSums:
    """Cross-entropy of [b, s, v] logits at target tokens (mask 1); pad positions add nothing.

    With label smoothing e the per-token loss is (1 - e) * nll + e * mean over the vocabulary
    of -log p, as transformers' LabelSmoother computes it. `correct` counts argmax hits.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid: must be in [0, 1)")
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [b, s, v]
    is_label = target_ids[..., None] == jnp.arange(logits.shape[-1])  # [b, s, v]
    nll = -jnp.sum(jnp.where(is_label, log_probs, 0.0), axis=-1)  # [b, s]
    if label_smoothing:
        smooth = -jnp.mean(log_probs, axis=-1)  # [b, s]
        nll = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    mask = target_mask.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == target_ids).astype(jnp.float32)  # [b, s]
    return HeadSums(jnp.sum(mask * nll), jnp.sum(mask * correct), jnp.sum(mask))


def batch_loss_sums(
    config: Seq2SeqConfig,
    params: Mapping,
    batch: Mapping[str, jax.Array],
    *,
    deterministic: bool = True,
    rng: jax.Array | None = None,
    label_smoothing: float = 0.0,
) -> HeadSums:
    """HeadSums of a batch: input_ids, input_mask, segment_ids, decoder_input_ids,
    target_ids and target_mask; ``rng`` drives dropout when not deterministic."""
    logits = Seq2SeqModel(config).apply(
        {"params": full_params(config, params)},
        batch["input_ids"],
        batch.get("segment_ids"),
        batch["input_mask"],
        batch["decoder_input_ids"],
        deterministic=deterministic,
        rngs=None if deterministic else {"dropout": rng},
    )  # [b, s, v]
    return loss_sums(logits, batch["target_ids"], batch["target_mask"], label_smoothing)
