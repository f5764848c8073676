"""How a BERT encoder-decoder (bertjax.tasks.seq2seq.model) generates text.

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
from collections.abc import Mapping
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.encoders.bert.config import BertConfig
from bertjax.nn import sharding
from bertjax.tasks.seq2seq.model import PAD_ID, QKV, Seq2SeqConfig, Seq2SeqModel, full_params

EARLY_STOPPING = (False, True, "never")
# transformers' beam search marks impossible candidates by adding this (not -inf), so that
# sums stay finite; the same constant keeps the two searches' choices identical.
_IMPOSSIBLE = -1.0e9


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
    zeros = sharding.constrain(zeros, QKV)
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
