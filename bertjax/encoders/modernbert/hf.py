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
from bertjax.encoders.modernbert.config import ModernBertConfig, _is_int
from bertjax.encoders.modernbert.model import (
    DECODER_BIAS,
    HEAD,
    init_masked_lm,
    stack_layers,
    unstack_layers,
)
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
    hf_prefix, root = ("", ()) if kind == MODEL else ("model.", (_MODEL_KEY,))

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


@dataclasses.dataclass(frozen=True)
class Spec:
    """A transformers tensor, its parameter, and the group a directory may lack."""

    tensor: TensorSpec
    group: str


def directory_specs(
    config: ModernBertConfig, head_param: str | None, outputs: int = 0
) -> list[Spec]:
    """Every transformers tensor of a ModernBertForMaskedLM (`head_param` None) or of a task
    class whose dense layer is `head_param` in our tree (`outputs` wide), in transformers'
    order, with paths in our tree."""
    specs = [
        Spec(dataclasses.replace(s, hf_name=HF_PREFIX + s.hf_name, path=(ENCODER, *s.path)), CORE)
        for s in tensor_specs(config, MODEL)
    ]
    specs += [
        Spec(dataclasses.replace(s, path=(ENCODER, *s.path)), POOLER)
        for s in tensor_specs(config, CLASSIFICATION, 1)
        if s.hf_name.startswith(HEAD + ".")
    ]
    if head_param is None:
        specs += [
            Spec(dataclasses.replace(s, path=(DECODER_BIAS,)), MLM_HEAD)
            for s in tensor_specs(config, MASKED_LM)
            if s.hf_name == "decoder.bias"
        ]
        return specs
    h = config.hidden_size
    specs.append(
        Spec(
            TensorSpec(
                f"{HF_CLASSIFIER}.weight", (head_param, "kernel"), (outputs, h), (h, outputs), True
            ),
            head_param,
        )
    )
    specs.append(
        Spec(
            TensorSpec(
                f"{HF_CLASSIFIER}.bias", (head_param, "bias"), (outputs,), (outputs,), False
            ),
            head_param,
        )
    )
    return specs


def head_tensors(config: ModernBertConfig, name: str, outputs: int) -> tuple[hf.TensorSpec, ...]:
    """The tensor map of a ModernBERT task head, whatever it reads: the prediction head
    (head.dense -> GELU -> head.norm, kept in the encoder's tree as "head": the masked-LM
    model shares it) and the task's dense layer, "classifier" [outputs, h] in every
    ModernBertFor* class, `name` in our tree."""
    return tuple(
        hf.TensorSpec(*dataclasses.astuple(spec.tensor), spec.group)
        for spec in directory_specs(config, name, outputs)
        if spec.group != CORE
    )


def _transformers_head(head) -> capability.TransformersHead:
    th = capability.of(head).transformers_head(head)
    if th is None:
        raise ValueError(
            f"a {head.task} model is not a transformers ModernBERT class; Model.save_hf writes "
            "it in its own format"
        )
    return th


def read(path: str | os.PathLike, hf_config: Mapping[str, Any], **overrides):
    """Reads a transformers ModernBERT directory: (config, params, head or None, the groups
    the files lacked, freshly initialised)."""
    # A missing prediction head is made fresh, pretraining or not: it is also the
    # classifiers' pooling (and not warned of).
    directory = fs.path(path)
    config = ModernBertConfig.from_hf_dict(hf_config, **{"dtype": "float32", **overrides})
    head = capability.head_from_transformers(hf_config, CLASS_PREFIX)
    th = None if head is None else _transformers_head(head)
    specs = directory_specs(
        config, None if th is None else th.param, 0 if th is None else th.outputs
    )
    tensors, source = hf.read_weights(directory)
    names = {s.tensor.hf_name for s in specs}
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
    present = {s.group for s in specs if s.tensor.hf_name in found}
    dtype = np.dtype(config.param_dtype)
    flat: dict[tuple[str, ...], np.ndarray] = {}
    missing: list[str] = []
    for spec in specs:
        t = spec.tensor
        if t.hf_name not in found:
            if spec.group in required or spec.group in present:
                raise ValueError(f"{source}: missing tensor {t.hf_name!r} (shape {t.hf_shape})")
            missing.append(spec.group)
            continue
        array = found[t.hf_name]
        if tuple(array.shape) != t.hf_shape:
            raise ValueError(
                f"{source}: tensor {t.hf_name!r} has shape {tuple(array.shape)}, expected "
                f"{t.hf_shape}"
            )
        flat[t.path] = t.to_ours(array).astype(dtype)
    if missing:
        init_config = dataclasses.replace(config, scan_layers=False, attention_impl="xla")
        fresh = dict(hf.flatten_tree(nn.meta.unbox(init_masked_lm(init_config, jax.random.key(0)))))
        for spec in specs:
            if spec.group in missing:
                flat[spec.tensor.path] = np.asarray(fresh[spec.tensor.path]).astype(dtype)
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
            specs = [s for s in specs if s.group == CORE]
            specs = [
                Spec(
                    dataclasses.replace(s.tensor, hf_name=s.tensor.hf_name.removeprefix(HF_PREFIX)),
                    s.group,
                )
                for s in specs
            ]
            hf_config["architectures"] = ["ModernBertModel"]
    else:
        specs = directory_specs(config, th.param, th.outputs)
        hf_config["architectures"] = [CLASS_PREFIX + th.task_class]
        labels = {str(i): f"LABEL_{i}" for i in range(th.outputs)}
        hf_config.update({"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}})
        hf_config.update(th.config)
    flat = dict(hf.flatten_tree(params))
    tensors: dict[str, np.ndarray] = {}
    dtypes = set()
    for spec in specs:
        t = spec.tensor
        if t.path not in flat:
            raise ValueError(f"params: missing parameter {'/'.join(t.path)!r} (shape {t.shape})")
        array = hf.to_numpy(flat[t.path])
        if tuple(array.shape) != t.shape:
            raise ValueError(
                f"params: parameter {'/'.join(t.path)!r} has shape {tuple(array.shape)}, "
                f"expected {t.shape}"
            )
        tensors[t.hf_name] = t.to_hf(array)
        dtypes.add(array.dtype)
    if len(dtypes) == 1:
        hf_config["dtype"] = str(next(iter(dtypes)))
    return hf_config, tensors
