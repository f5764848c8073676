"""transformers' ModernBertForMaskedLM and ModernBertForSequenceClassification as linen
modules, with their state dicts both ways: the reference the parity and unit tests hold the
library's ModernBERT family against (bertjax.encoders.modernbert), kept out of the library,
which serves the same models through its family (model.MaskedLM, the capabilities' heads).

Trees: the encoder under "model" (as "model." prefixes its tensors in transformers), then
"head", "decoder_bias" or "classifier", as the transformers class holds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.encoders.modernbert.hf import (
    CLASSIFICATION,
    MASKED_LM,
    MODEL,
    TIED_DECODER,
    tensor_specs,
)
from bertjax.encoders.modernbert.layouts import stack_layers, unstack_layers
from bertjax.encoders.modernbert.model import (
    ModernBertModel,
    PredictionHead,
    Projection,
    _param,
    _stds,
    masked_lm_logits,
)
from bertjax.nn.sharding import EMBED, LABELS, VOCAB

# The encoder's key in these classes' trees.
ENCODER = "model"


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
            cfg, x, masked_lm_positions, self.head, self.model.word_table(), bias
        )


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
    if kind == MASKED_LM and TIED_DECODER in tensors:
        decoder = tensors.pop(TIED_DECODER)
        table = tensors.get("model.embeddings.tok_embeddings.weight")
        if table is not None and not np.array_equal(decoder, table):
            raise ValueError(
                f"tensor {TIED_DECODER!r} differs from 'model.embeddings.tok_embeddings.weight': "
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
        node[spec.path[-1]] = jnp.asarray(spec.to_bertjax(array), dtype)
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
        state[TIED_DECODER] = state["model.embeddings.tok_embeddings.weight"].copy()
    return state
