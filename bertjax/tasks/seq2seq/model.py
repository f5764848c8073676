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

Generation (`generate`): greedy or beam search inside one jitted lax.while_loop, with a
key/value cache for the decoder's self-attention and the cross-attention keys/values of the
encoder output computed once. Beam search follows transformers' (5.x) vectorised beam search
step for step -- 2 * num_beams candidates per step, length_penalty dividing a finished
hypothesis' summed log-probability by its generated length (its [SEP] included) to that power,
and its `early_stopping` rules (True, False or "never") -- so the two give the same tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.capability import ENCODER, HeadSpec
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
from bertjax.nn import attention as attention_lib
from bertjax.nn import sharding
from bertjax.nn.heads import HeadSums
from bertjax.nn.sharding import ACTIVATION_EMBED, BATCH, HEADS, KV, LENGTH

BERT2BERT = "bert2bert"
BERTSHARE = "bertshare"
BERT2RND = "bert2rnd"
RND2RND = "rnd2rnd"
INITS = (BERT2BERT, BERTSHARE, BERT2RND, RND2RND)
EARLY_STOPPING = (False, True, "never")
PAD_ID = 0  # [PAD] is 0 in every bertjax vocabulary
# The fine-tuning task (bertjax.tasks.seq2seq.task) whose checkpoints hold this model.
# Named here, where every run directory reader sees it, so that a run opens without
# importing the fine-tuning package.
TASK = "seq2seq"

# transformers' beam search marks impossible candidates by adding this (not -inf), so that
# sums stay finite; the same constant keeps the two searches' choices identical.
_IMPOSSIBLE = -1.0e9
# Finite "minus infinity" for masked attention logits (as bertjax.nn.attention).
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_QKV = (BATCH, LENGTH, HEADS, KV)


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
    logits = jnp.where(mask[:, None], logits, _MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1)
    if not deterministic and dropout_rate > 0.0:
        keep_prob = 1.0 - dropout_rate
        kept = attention_lib.dropout_keep_mask(dropout_rng, keep_prob, weights.shape)
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
        k = sharding.constrain(self.key(memory), _QKV)  # [b, t, n, d]
        v = sharding.constrain(self.value(memory), _QKV)  # [b, t, n, d]
        return k, v

    def __call__(self, x, keys, values, mask, deterministic: bool):
        cfg = self.config
        q = sharding.constrain(self.query(x), _QKV)  # [b, s, n, d]
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
        y = self.output(sharding.constrain(context, _QKV))  # [b, s, h]
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
            k, v = sharding.constrain(k, _QKV), sharding.constrain(v, _QKV)  # [b, T, n, d]
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


# ------------------------------------------------------------------------------ generation


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How `generate` decodes; the fields mean what transformers' GenerationConfig's do."""

    max_new_tokens: int = 64
    num_beams: int = 1  # 1: greedy
    length_penalty: float = 1.0  # finished beam score = sum log p / generated_length ** this
    no_repeat_ngram_size: int = 0  # 0: off
    early_stopping: bool | str = False  # False | True | "never" (beam search only)
    use_cache: bool = True  # False recomputes the whole prefix every step (for comparison)
    # Ids at or past this are never generated (0: every row of the output layer). A model's
    # vocabulary may have more rows than its tokenizer has pieces; those rows are untrained,
    # and an id among them could not be decoded.
    usable_vocab: int = 0

    def __post_init__(self):
        for name, low in (
            ("max_new_tokens", 1),
            ("num_beams", 1),
            ("no_repeat_ngram_size", 0),
            ("usable_vocab", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(
                    f"GenerationSettings.{name}={value!r} is invalid: must be an int >= {low}"
                )
        if isinstance(self.length_penalty, bool) or not isinstance(
            self.length_penalty, (int, float)
        ):
            raise ValueError(
                f"GenerationSettings.length_penalty={self.length_penalty!r} is invalid: "
                "must be a float"
            )
        if not any(self.early_stopping is v or self.early_stopping == v for v in EARLY_STOPPING):
            raise ValueError(
                f"GenerationSettings.early_stopping={self.early_stopping!r} is invalid: must be "
                f"one of {EARLY_STOPPING}"
            )


class Generated(NamedTuple):
    """What `generate` returns, per input row."""

    tokens: jax.Array  # [b, max_new_tokens] int32: generated ids, [SEP] included, then [PAD]
    lengths: jax.Array  # [b] int32: tokens up to and including [SEP]
    scores: jax.Array  # [b] float32: beam score (length-penalised), or greedy's sum of log p


def _allowed(log_probs: jax.Array, banned: jax.Array, usable_vocab: int) -> jax.Array:
    """log_probs [r, v] with banned tokens and ids at or past usable_vocab (when set) at -inf."""
    if usable_vocab:
        banned = banned | (jnp.arange(log_probs.shape[-1]) >= usable_vocab)
    return jnp.where(banned, -jnp.inf, log_probs)


def banned_tokens(sequences: jax.Array, length: jax.Array, n: int, vocab: int) -> jax.Array:
    """[rows, vocab] bool: tokens that would repeat an n-gram of sequences[:, :length].

    A token is banned when the last n-1 tokens followed by it already occur in the prefix
    (transformers' NoRepeatNGramLogitsProcessor, over the same prefix, start token included).
    """
    rows, total = sequences.shape
    if n == 0 or total < n:
        return jnp.zeros((rows, vocab), bool)
    starts = total - n + 1
    windows = jnp.stack([sequences[:, i : starts + i] for i in range(n)], axis=-1)  # [r, j, n]
    tail = jax.lax.dynamic_slice_in_dim(
        sequences, jnp.maximum(length - (n - 1), 0), n - 1, axis=1
    )  # [r, n - 1]
    match = jnp.all(windows[:, :, : n - 1] == tail[:, None, :], axis=-1)  # [r, j]
    match &= (jnp.arange(starts) <= length - n)[None, :]
    rows_index = jnp.arange(rows)[:, None]  # [r, 1]
    banned = jnp.zeros((rows, vocab), jnp.int32).at[rows_index, windows[:, :, n - 1]].max(match)
    return banned > 0


def _empty_cache(config: BertConfig, rows: int, length: int) -> tuple:
    shape = (rows, length, config.num_heads, config.head_dim)
    zeros = jnp.zeros(shape, jnp.dtype(config.dtype))  # [b, T, n, d]
    zeros = sharding.constrain(zeros, _QKV)
    return tuple((zeros, zeros) for _ in range(config.num_layers))


def _next_logits(model, variables, cross, cross_mask, use_cache: bool):
    """step(sequences [r, T], cache, length) -> (float32 logits [r, v] for position length,
    cache): the cached decoder reads one token, the uncached one the whole buffer."""

    def step(sequences, cache, length):
        if use_cache:
            ids = jax.lax.dynamic_slice_in_dim(sequences, length - 1, 1, axis=1)  # [r, 1]
            logits, cache = model.apply(
                variables,
                ids,
                cross,
                cross_mask,
                cache=cache,
                start=length - 1,
                method=Seq2SeqModel.decode,
            )  # [r, 1, v]
            return logits[:, 0], cache  # [r, v]
        logits, _ = model.apply(variables, sequences, cross, cross_mask, method=Seq2SeqModel.decode)
        return jax.lax.dynamic_index_in_dim(logits, length - 1, axis=1, keepdims=False), cache

    return step


def _greedy(config, settings, step, cache, rows):
    total = settings.max_new_tokens + 1
    vocab = config.bert.vocab_size
    sequences = jnp.zeros((rows, total), jnp.int32).at[:, 0].set(config.decoder_start_id)

    def cond(state):
        length, _, finished, _, _ = state
        return (length < total) & ~jnp.all(finished)

    def body(state):
        length, sequences, finished, cache, score = state
        logits, cache = step(sequences, cache, length)  # [r, v]
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        banned = banned_tokens(sequences, length, settings.no_repeat_ngram_size, vocab)
        log_probs = _allowed(log_probs, banned, settings.usable_vocab)
        token = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)  # [r]
        chosen = jnp.take_along_axis(log_probs, token[:, None], axis=1)[:, 0]  # [r]
        score = score + jnp.where(finished, 0.0, chosen)
        token = jnp.where(finished, PAD_ID, token)
        sequences = jax.lax.dynamic_update_slice_in_dim(sequences, token[:, None], length, 1)
        return length + 1, sequences, finished | (token == config.eos_id), cache, score

    state = (jnp.int32(1), sequences, jnp.zeros((rows,), bool), cache, jnp.zeros((rows,)))
    _, sequences, _, _, score = jax.lax.while_loop(cond, body, state)
    return sequences[:, 1:], score


def _gather(x: jax.Array, index: jax.Array) -> jax.Array:
    """x [b, k, ...] at beams index [b, j] -> [b, j, ...]."""
    index = index.reshape(*index.shape, *([1] * (x.ndim - 2)))
    return jnp.take_along_axis(x, index, axis=1)


def _beam_search(config, settings, step, cache, batch):
    """transformers' vectorised beam search (generation/utils.py, _beam_search), in JAX."""
    k = settings.num_beams
    keep = 2 * k  # candidates per step: enough that k stay open if k of them end in [SEP]
    total = settings.max_new_tokens + 1
    vocab = config.bert.vocab_size
    lp = float(settings.length_penalty)
    es = settings.early_stopping
    early_true = es is True
    positions = jnp.arange(total)

    running = jnp.zeros((batch, k, total), jnp.int32).at[:, :, 0].set(config.decoder_start_id)
    running_scores = jnp.zeros((batch, k)).at[:, 1:].set(_IMPOSSIBLE)
    state = dict(
        length=jnp.int32(1),
        running=running,
        running_scores=running_scores,
        sequences=running,
        scores=jnp.full((batch, k), _IMPOSSIBLE),
        finished=jnp.zeros((batch, k), bool),
        improvable=jnp.ones((batch, 1), bool),
        done=jnp.bool_(False),
        cache=cache,
    )

    def cond(s):
        return ~s["done"]

    def body(s):
        length = s["length"]
        flat = s["running"].reshape(batch * k, total)
        logits, cache = step(flat, s["cache"], length)  # [b * k, v]
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        banned = banned_tokens(flat, length, settings.no_repeat_ngram_size, vocab)
        log_probs = _allowed(log_probs, banned, settings.usable_vocab)
        log_probs = log_probs.reshape(batch, k, vocab) + s["running_scores"][:, :, None]
        top_scores, top_index = jax.lax.top_k(log_probs.reshape(batch, k * vocab), keep)  # [b, K]
        parent = top_index // vocab  # [b, K]
        token = (top_index % vocab).astype(jnp.int32)  # [b, K]
        candidates = _gather(s["running"], parent)  # [b, K, T]
        candidates = jnp.where(positions == length, token[:, :, None], candidates)
        ends = (token == config.eos_id) | (length + 1 >= total)  # [b, K]

        # The best k candidates that did not end continue.
        open_scores = top_scores + ends.astype(jnp.float32) * _IMPOSSIBLE
        _, chosen = jax.lax.top_k(open_scores, k)  # [b, k]
        running = _gather(candidates, chosen)  # [b, k, T]
        running_scores = _gather(open_scores, chosen)  # [b, k]
        rows = _gather(parent, chosen) + (jnp.arange(batch) * k)[:, None]  # [b, k]
        if cache is not None:
            cache = jax.tree.map(lambda c: jnp.take(c, rows.reshape(-1), axis=0), cache)

        # Among the best k candidates, those that ended join the finished hypotheses.
        just_finished = ends & (jnp.arange(keep) < k)[None, :]  # [b, K]
        final = top_scores / (length.astype(jnp.float32) ** lp)
        full = jnp.all(s["finished"], axis=-1, keepdims=True) & early_true  # [b, 1]
        final += full.astype(jnp.float32) * _IMPOSSIBLE
        final += (~s["improvable"]).astype(jnp.float32) * _IMPOSSIBLE
        final += (~just_finished).astype(jnp.float32) * _IMPOSSIBLE
        merged_scores = jnp.concatenate([s["scores"], final], axis=1)  # [b, k + K]
        _, best = jax.lax.top_k(merged_scores, k)  # [b, k]
        sequences = _gather(jnp.concatenate([s["sequences"], candidates], axis=1), best)
        scores = _gather(merged_scores, best)
        finished = _gather(jnp.concatenate([s["finished"], just_finished], axis=1), best)

        # Could an open beam still beat the worst finished one? (transformers' heuristic)
        length = length + 1
        if es == "never" and lp > 0.0:
            best_length = jnp.float32(total - 1)
        else:
            best_length = (length - 1).astype(jnp.float32)
        best_open = running_scores[:, :1] / (best_length**lp)  # [b, 1]
        worst_final = jnp.where(finished, jnp.min(scores, axis=1, keepdims=True), _IMPOSSIBLE)
        improvable = s["improvable"] & jnp.any(best_open > worst_final, axis=-1, keepdims=True)
        done = ~(jnp.any(improvable) & ~(jnp.all(finished) & early_true) & ~jnp.all(ends))
        return dict(
            length=length,
            running=running,
            running_scores=running_scores,
            sequences=sequences,
            scores=scores,
            finished=finished,
            improvable=improvable,
            done=done,
            cache=cache,
        )

    state = jax.lax.while_loop(cond, body, state)
    return state["sequences"][:, 0, 1:], state["scores"][:, 0]


@functools.partial(jax.jit, static_argnames=("config", "settings", "packed_length"))
def generate(
    config: Seq2SeqConfig,
    params: Mapping,
    input_ids: jax.Array,
    attention_mask: jax.Array | None = None,
    token_type_ids: jax.Array | None = None,
    *,
    settings: GenerationSettings = GenerationSettings(),
    packed_length: int | None = None,
) -> Generated:
    """Greedy (num_beams=1) or beam-search decoding of a batch of sources [b, t].

    Compiled once per (config, settings, input shape): the encoder runs once, the cross-
    attention keys/values once, then one lax.while_loop emits a token per step for every row
    (and beam) until each has produced [SEP] or max_new_tokens (beam search: until
    transformers' stopping rules hold). `packed_length` runs the encoder on real tokens only
    (its outputs are the same).
    """
    if attention_mask is None:
        attention_mask = jnp.ones_like(input_ids)
    model = Seq2SeqModel(config)
    variables = {"params": full_params(config, nn.meta.unbox(params))}
    encoded = model.apply(
        variables,
        input_ids,
        token_type_ids,
        attention_mask,
        packed_length=packed_length,
        method=Seq2SeqModel.encode,
    )  # [b, t, h]
    cross = model.apply(variables, encoded, method=Seq2SeqModel.cross_keys_values)
    batch = input_ids.shape[0]
    k = settings.num_beams
    total = settings.max_new_tokens + 1
    if (
        config.bert.position_embedding_type == "learned"
        and total > config.bert.max_position_embeddings
    ):
        raise ValueError(
            f"max_new_tokens={settings.max_new_tokens} is invalid: the decoder has "
            f"{config.bert.max_position_embeddings} positions, so at most "
            f"{config.bert.max_position_embeddings - 1} new tokens"
        )
    cross_mask = attention_mask
    if k > 1:  # every beam reads its row's encoder output
        cross = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), cross)  # [b * k, t, n, d]
        cross_mask = jnp.repeat(attention_mask, k, axis=0)  # [b * k, t]
    cache = _empty_cache(config.bert, batch * k, total) if settings.use_cache else None
    step = _next_logits(model, variables, cross, cross_mask, settings.use_cache)
    if k == 1:
        tokens, scores = _greedy(config, settings, step, cache, batch)
    else:
        tokens, scores = _beam_search(config, settings, step, cache, batch)
    # Everything after the first [SEP] becomes [PAD].
    is_eos = tokens == config.eos_id  # [b, n]
    after = (jnp.cumsum(is_eos, axis=1) - is_eos) > 0
    tokens = jnp.where(after, PAD_ID, tokens)
    ended = jnp.any(is_eos, axis=1)
    lengths = jnp.where(ended, jnp.argmax(is_eos, axis=1) + 1, tokens.shape[1])
    return Generated(tokens, lengths.astype(jnp.int32), scores.astype(jnp.float32))


def strip(generated: Generated, eos_id: int) -> list[list[int]]:
    """Each row's generated ids without the final [SEP] and the padding (host lists)."""
    tokens, lengths = np.asarray(generated.tokens), np.asarray(generated.lengths)
    rows = []
    for row, n in zip(tokens, lengths):
        ids = row[:n].tolist()
        rows.append(ids[:-1] if ids and ids[-1] == eos_id else ids)
    return rows


# ------------------------------------------------------------------------------ as a task


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What a fine-tuned encoder-decoder is beyond its BERT architecture: the init, the
    special ids, the training loss and how evaluation generates.

    A fine-tuning run keeps them in its checkpoints' head (`head` / `from_head`: the
    HeadSpec's typed options), so the run directory reopens on its own and a resumed run
    checks that they did not change.
    """

    decoder_start_id: int
    eos_id: int
    init: str = BERT2BERT
    label_smoothing: float = 0.0
    max_target_length: int = 64
    generation: GenerationSettings = GenerationSettings()

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing={self.label_smoothing!r} is invalid: must be in [0, 1)"
            )
        if self.max_target_length < 2:
            raise ValueError(
                f"max_target_length={self.max_target_length!r} is invalid: must be >= 2 "
                "(a token and [SEP])"
            )
        if self.init not in INITS:
            raise ValueError(f"init={self.init!r} is invalid: must be one of {INITS}")

    def config(self, bert: BertConfig) -> Seq2SeqConfig:
        """The encoder-decoder over `bert` (its layers unrolled, as the decoder needs)."""
        # The decoder is BERT's layers with cross-attention.
        if getattr(bert, "family", None) != BertConfig.family:
            raise ValueError(f"seq2seq needs a BERT encoder; {type(bert).__name__} is not one")
        return Seq2SeqConfig(
            dataclasses.replace(bert, scan_layers=False),
            decoder_start_id=self.decoder_start_id,
            eos_id=self.eos_id,
            init=self.init,
        )

    def head(self) -> HeadSpec:
        """The HeadSpec a fine-tuning run's checkpoints carry."""
        return HeadSpec(TASK, (), self)

    @classmethod
    def from_head(cls, head: HeadSpec) -> TaskOptions:
        """Inverse of `head`."""
        if head.task != TASK:
            raise ValueError(f"head task={head.task!r} is not {TASK!r}")
        return head.options

    @classmethod
    def from_dict(cls, d: dict) -> TaskOptions:
        """Inverse of dataclasses.asdict (the form a checkpoint's meta stores)."""
        return cls(**{**d, "generation": GenerationSettings(**d["generation"])})

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> TaskOptions:
        """The options of a head written before they were typed: name=value labels."""
        values = dict(label.split("=", 1) for label in labels)
        generation = GenerationSettings(
            max_new_tokens=int(values["max_new_tokens"]),
            num_beams=int(values["num_beams"]),
            length_penalty=float(values["length_penalty"]),
            no_repeat_ngram_size=int(values["no_repeat_ngram_size"]),
        )
        return cls(
            decoder_start_id=int(values["decoder_start_id"]),
            eos_id=int(values["eos_id"]),
            init=values["init"],
            label_smoothing=float(values["label_smoothing"]),
            max_target_length=int(values["max_target_length"]),
            generation=generation,
        )


def task_init(bert: BertConfig, head: HeadSpec):
    """`rng -> boxed stored parameters` of a fine-tuning run's encoder-decoder (fresh: the
    run's warm start replaces them), for bertjax.engine.steps.make_state."""
    config = TaskOptions.from_head(head).config(bert)

    def init(rng: jax.Array) -> dict:
        ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
        fresh = Seq2SeqModel(config).init({"params": rng}, ids, None, None, ids)["params"]
        return stored_params(config, fresh)

    return init
