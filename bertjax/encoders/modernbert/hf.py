"""ModernBERT's transformers format: the tensor map of transformers' ModernBert* classes and
whole directories in and out.

In a task model the encoder's tree ("bert") holds ModernBertModel's parameters and "head",
the prediction head (dense -> GELU -> LayerNorm) that transformers' ModernBertFor* classes
share: the masked-LM model reads it at the masked positions, the sequence classifier on the
pooled row, the token and span classifiers at every token. So a fine-tuned model adds only
its dense layer, and a masked-LM checkpoint starts every head's trunk, as in transformers.

transformers' names: "model." + ModernBertModel's tensors, "head.dense" and "head.norm",
"decoder.bias" (the masked-LM decoder's weight is the token-embedding table, tied, and not
written), and a task's dense layer "classifier" [outputs, hidden] (ModernBertFor
QuestionAnswering names its [2, hidden] layer "classifier" too). config.json's translation is
ModernBertConfig.from_hf_dict / to_hf_dict (config.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bertjax import capability
from bertjax.encoders import family as family_lib
from bertjax.encoders.modernbert.config import ModernBertConfig, _is_int
from bertjax.encoders.modernbert.layouts import stack_layers, unstack_layers
from bertjax.encoders.modernbert.model import DECODER_BIAS, init_masked_lm
from bertjax.storage import fs, hf
from bertjax.text.tokenizer import check_vocab

# The encoder's key in our trees (every family's) and its prefix in transformers' names.
ENCODER = capability.ENCODER
HF_PREFIX = "model."
TIED_DECODER = "decoder.weight"
# transformers' ModernBERT classes: ModernBert<task class>, e.g. ModernBertForQuestionAnswering.
CLASS_PREFIX = "ModernBert"
# transformers' name of a task's dense layer in every ModernBertFor* class.
HF_CLASSIFIER = "classifier"

# Parameter groups a directory may lack (freshly initialised, reported as Model.fresh_heads).
CORE = hf.CORE
MLM_HEAD = hf.MLM_HEAD
POOLER = hf.POOLER

# The key of ModernBertModel's tree in transformers' ModernBertFor* classes ("model.").
_MODEL_KEY = "model"

# ---------------------------------------------------------------------------------------------
# Weights to and from transformers. torch Linear weights are [out, in]; our kernels are
# [in, ...out] with the fused outputs split: Wqkv [3h, h] -> [h, 3, n, d], Wi [2f, h] ->
# [h, 2, f], the attention Wo [h, h] -> [n, d, h].

# What a state dict (or params tree) holds: the encoder alone, or with a task's head.
MODEL = "model"  # ModernBertModel
MASKED_LM = "masked_lm"  # ModernBertForMaskedLM
CLASSIFICATION = "classification"  # ModernBertForSequenceClassification


def tensor_specs(
    config: ModernBertConfig, kind: str = MASKED_LM, num_labels: int | None = None
) -> list[hf.TensorSpec]:
    """Every transformers tensor of ``kind`` (MODEL, MASKED_LM or CLASSIFICATION) for
    ``config``, in transformers' order, with its path in transformers' own tree ("model" for
    ModernBertModel's) and its group (CORE, the prediction head's POOLER, the decoder's
    MLM_HEAD, the classifier's HF_CLASSIFIER); the tied decoder weight is not among them."""
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
    specs: list[hf.TensorSpec] = []
    hf_prefix, root = ("", ()) if kind == MODEL else ("model.", (_MODEL_KEY,))

    def add(hf_name, path, hf_shape, shape=None, transpose=False, group=CORE):
        specs.append(
            hf.TensorSpec(hf_name, tuple(path), hf_shape, shape or hf_shape, transpose, group)
        )

    def norm(hf_name, path, group=CORE):
        add(f"{hf_name}.weight", (*path, "scale"), (h,), group=group)
        if config.norm_bias:
            add(f"{hf_name}.bias", (*path, "bias"), (h,), group=group)

    def linear(hf_name, path, n_in, n_out, kernel_shape, bias_shape, use_bias, group=CORE):
        add(
            f"{hf_name}.weight",
            (*path, "kernel"),
            (n_out, n_in),
            kernel_shape,
            transpose=True,
            group=group,
        )
        if use_bias:
            add(f"{hf_name}.bias", (*path, "bias"), (n_out,), bias_shape, group=group)

    add(
        f"{hf_prefix}embeddings.tok_embeddings.weight",
        (*root, "embeddings", "tok_embeddings"),
        (v, h),
    )
    norm(f"{hf_prefix}embeddings.norm", (*root, "embeddings", "norm"))
    for i in range(config.num_layers):
        layer, ours = f"{hf_prefix}layers.{i}", (*root, f"layer_{i}")
        if i > 0:
            norm(f"{layer}.attn_norm", (*ours, "attn_norm"))
        bias = config.attention_bias
        linear(
            f"{layer}.attn.Wqkv", (*ours, "attn", "wqkv"), h, 3 * h, (h, 3, n, d), (3, n, d), bias
        )
        linear(f"{layer}.attn.Wo", (*ours, "attn", "wo"), h, h, (n, d, h), (h,), bias)
        norm(f"{layer}.mlp_norm", (*ours, "mlp_norm"))
        linear(
            f"{layer}.mlp.Wi", (*ours, "mlp", "wi"), h, 2 * f, (h, 2, f), (2, f), config.mlp_bias
        )
        linear(f"{layer}.mlp.Wo", (*ours, "mlp", "wo"), f, h, (f, h), (h,), config.mlp_bias)
    norm(f"{hf_prefix}final_norm", (*root, "final_norm"))
    if kind != MODEL:
        linear("head.dense", ("head", "dense"), h, h, (h, h), (h,), config.classifier_bias, POOLER)
        norm("head.norm", ("head", "norm"), POOLER)
    if kind == MASKED_LM and config.decoder_bias:
        add("decoder.bias", ("decoder_bias",), (v,), group=MLM_HEAD)
    if kind == CLASSIFICATION:
        if not _is_int(num_labels) or num_labels <= 0:
            raise ValueError(f"num_labels={num_labels!r} is invalid: must be a positive int")
        shapes = ((h, num_labels), (num_labels,))
        linear("classifier", ("classifier",), h, num_labels, *shapes, True, HF_CLASSIFIER)
    return specs


def directory_specs(
    config: ModernBertConfig, head_param: str | None, outputs: int = 0
) -> list[hf.TensorSpec]:
    """Every transformers tensor of a ModernBertForMaskedLM (`head_param` None) or of a task
    class whose dense layer is `head_param` in our tree (`outputs` wide), in transformers'
    order, with paths in our tree; the task's dense layer is the group `head_param`."""
    specs = [
        dataclasses.replace(s, hf_name=HF_PREFIX + s.hf_name, path=(ENCODER, *s.path))
        for s in tensor_specs(config, MODEL)
    ]
    specs += [
        dataclasses.replace(s, path=(ENCODER, *s.path))
        for s in tensor_specs(config, CLASSIFICATION, 1)
        if s.group == POOLER
    ]
    if head_param is None:
        return specs + [
            dataclasses.replace(s, path=(DECODER_BIAS,))
            for s in tensor_specs(config, MASKED_LM)
            if s.group == MLM_HEAD
        ]
    return specs + list(
        family_lib.dense_tensors(
            HF_CLASSIFIER, (head_param,), config.hidden_size, outputs, head_param
        )
    )


def pretraining_specs(config: ModernBertConfig) -> list[hf.TensorSpec]:
    """ModernBertForMaskedLM's tensors with paths in the masked-LM model's tree (the family's
    pretraining tree): the encoder, the prediction head (POOLER) and the decoder's bias."""
    return directory_specs(config, None)


def head_tensors(config: ModernBertConfig, name: str, outputs: int) -> tuple[hf.TensorSpec, ...]:
    """The tensor map of a ModernBERT task head, whatever it reads: the prediction head
    (head.dense -> GELU -> head.norm, kept in the encoder's tree as "head": the masked-LM
    model shares it) and the task's dense layer, "classifier" [outputs, h] in every
    ModernBertFor* class, `name` in our tree."""
    return tuple(spec for spec in directory_specs(config, name, outputs) if spec.group != CORE)


def _transformers_head(head) -> capability.TransformersHead:
    th = capability.of(head).transformers_head(head)
    if th is None:
        raise ValueError(
            f"a {head.task} model is not a transformers ModernBERT class; Model.save_hf writes "
            "it in its own format"
        )
    return th


def read(
    path: str | os.PathLike,
    hf_config: Mapping[str, Any],
    *,
    pretraining_heads: bool = True,
    **overrides,
):
    """Reads a transformers ModernBERT directory: (config, params, head or None, the groups
    the files lacked, freshly initialised). `pretraining_heads` changes nothing: a missing
    prediction head is made fresh, pretraining or not, since it is also the classifiers'
    pooling (and not warned of)."""
    directory = fs.path(path)
    config = ModernBertConfig.from_hf_dict(hf_config, **{"dtype": "float32", **overrides})
    head = capability.head_from_transformers(hf_config, CLASS_PREFIX)
    th = None if head is None else _transformers_head(head)
    specs = directory_specs(
        config, None if th is None else th.param, 0 if th is None else th.outputs
    )
    tensors, source = hf.read_weights(directory)
    names = {s.hf_name for s in specs}
    found: dict[str, np.ndarray] = {}
    for name, array in tensors.items():
        if name not in names and HF_PREFIX + name in names:  # ModernBertModel: no prefix
            name = HF_PREFIX + name
        found[name] = np.asarray(array)
    if TIED_DECODER in found:
        decoder = found.pop(TIED_DECODER)
        table = found.get(f"{HF_PREFIX}embeddings.tok_embeddings.weight")
        if table is not None and not np.array_equal(decoder, table):
            raise ValueError(
                f"{source}: tensor {TIED_DECODER!r} differs from the token embeddings; an "
                "untied decoder is not supported"
            )
    unexpected = sorted(set(found) - names)
    if unexpected:
        raise ValueError(
            f"{source}: unexpected tensor(s) {hf.name_list(unexpected)} for a ModernBERT "
            f"with {config.num_layers} layers"
        )
    required = {CORE} if th is None else {CORE, POOLER, th.param}
    dtype = np.dtype(config.param_dtype)
    flat, missing = hf.match_tensors(
        specs, found, source, required=required, unwanted=(), dtype=dtype
    )
    if missing:
        init_config = dataclasses.replace(config, scan_layers=False, attention_impl="xla")
        fresh = dict(hf.flatten_tree(nn.meta.unbox(init_masked_lm(init_config, jax.random.key(0)))))
        for spec in specs:
            if spec.group in missing:
                flat[spec.path] = np.asarray(fresh[spec.path]).astype(dtype)
    params = hf.unflatten_tree(flat)
    if config.scan_layers:
        params[ENCODER] = jax.tree.map(np.asarray, stack_layers(params[ENCODER], config))
    # Without the prediction head, neither masks nor a pooled row can be predicted.
    fresh_groups = set(missing) | ({MLM_HEAD} if POOLER in missing else set())
    return config, params, head, tuple(sorted(fresh_groups))


def encoder_files(config: ModernBertConfig, params: Any) -> tuple[dict, dict]:
    """(config.json, tensors) of the encoder alone, as `write` writes an untrained head's
    model (ModernBertModel)."""
    return _files(config, params, None, (MLM_HEAD,))


def write(
    config: ModernBertConfig,
    params: Any,
    directory: str | os.PathLike,
    *,
    tokenizer: Any = None,
    head: Any = None,
    untrained: Sequence[str] = (),
) -> None:
    """Writes a transformers directory: config.json, model.safetensors, tokenizer files."""
    hf.require_safetensors()
    if tokenizer is not None:
        check_vocab(config, tokenizer, f"saving to {directory}")
    hf_config, tensors = _files(config, params, head, untrained)
    target = fs.path(directory)
    with hf.staged(target) as staging:
        hf.write_json(staging / hf.CONFIG_NAME, hf_config)
        hf.safetensors_numpy.save_file(
            tensors, staging / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"}
        )
        if tokenizer is not None:
            tokenizer.save_hf(staging, model_max_length=config.max_position_embeddings)


def _files(
    config: ModernBertConfig,
    params: Any,
    head: Any,
    untrained: Sequence[str],
) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json, tensors): ModernBertForMaskedLM, ModernBertModel (an untrained
    prediction head: the encoder alone) or the class of `head`."""
    params = nn.meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    if config.scan_layers:
        params = {**params, ENCODER: unstack_layers(params[ENCODER], config)}
    hf_config = config.to_hf_dict()
    th = None if head is None else _transformers_head(head)
    if th is None:
        specs = directory_specs(config, None)
        hf_config["architectures"] = ["ModernBertForMaskedLM"]
        if untrained:  # no trained prediction head: the encoder alone, as ModernBertModel
            specs = [
                dataclasses.replace(s, hf_name=s.hf_name.removeprefix(HF_PREFIX))
                for s in specs
                if s.group == CORE
            ]
            hf_config["architectures"] = ["ModernBertModel"]
    else:
        specs = directory_specs(config, th.param, th.outputs)
        hf_config["architectures"] = [CLASS_PREFIX + th.task_class]
        labels = {str(i): f"LABEL_{i}" for i in range(th.outputs)}
        hf_config.update({"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}})
        hf_config.update(th.config)
    tensors = hf.tensors_from(specs, params)
    dtype = hf.single_dtype(tensors.values())
    if dtype is not None:
        hf_config["dtype"] = dtype
    return hf_config, tensors
