"""Hugging Face transformers BERT weights in and out.

`load` reads a transformers BERT directory (config.json plus model.safetensors,
a sharded model.safetensors.index.json, or pytorch_model.bin) into a `BertConfig` and the
parameter tree of `bertjax.model.BertForPreTraining`; `save` writes the reverse, a
directory that `transformers.BertForPreTraining.from_pretrained` loads with nothing
missing or unexpected. Given a tokenizer, `save` also writes its files (tokenizer.json and
the rest, see `bertjax.tokenizer.Tokenizer.save_hf`), so that `AutoTokenizer` and the
fill-mask pipeline work on the directory; `load_tokenizer` reads a directory's tokenizer
back (bertjax's sentencepiece model, a WordPiece tokenizer.json, or BERT's vocab.txt).

Fine-tuned models travel too: `save(..., head=HeadSpec)` writes the transformers class of the
head's capability (bertjax.capability.TransformersHead: BertForSequenceClassification,
BertForTokenClassification, BertForQuestionAnswering, with their config fields such as
id2label), and `load_with_report` reads one back, its head in `LoadReport.head` (asked of every
capability) and the head's dense layer under its own name beside "bert".

This is BERT's transformers format (the "bert" encoder family); bertjax.encoders.read_transformers
opens a directory of any family, chosen by config.json's model_type, and each family's
write_transformers writes one (ModernBERT's reuses the file layer below).

Safetensors files are read and written with `safetensors.numpy`, so neither torch nor
transformers is needed at run time; torch is imported only to read pytorch_model.bin.

Directories may be local or `gs://` (bertjax.fs): files are read whole through the storage
layer, and an export to GCS is written in a local temporary directory, then uploaded file by
file (each object appears only once its upload is complete).

Layout differences handled here: torch Linear weights are [out, in] and ours are
[in, out]; the attention projections are split per head, [H, N*D] -> [H, N, D] for
query/key/value and [N*D, H] -> [N, D, H] for the attention output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import json
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import capability, fs
from bertjax import model as model_lib
from bertjax.capability import HeadSpec, TransformersHead
from bertjax.model import ARCHITECTURE_FIELDS, BertConfig
from bertjax.tokenizer import (
    HF_SPECIAL_TOKENS,
    HF_TOKENIZER_CONFIG_FILE,
    HF_TOKENIZER_FILE,
    SENTENCEPIECE_FILE,
    WORDPIECE_VOCAB_FILE,
    SentencePieceTokenizer,
    Tokenizer,
    WordPieceTokenizer,
    tokenizer_from_json,
)

try:
    from safetensors import SafetensorError
    from safetensors import numpy as safetensors_numpy
except ImportError:  # the `hf` extra is not installed; `load`/`save` say so when called
    safetensors_numpy = None

    class SafetensorError(Exception):
        """Stands in for safetensors' error type, which nothing raises without it."""


logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"
TORCH_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"

# Parameter groups: the encoder core must be in every checkpoint; each other group is
# either complete or entirely absent (then freshly initialised and reported).
CORE = "core"
POOLER = "pooler"
MLM_HEAD = "mlm_head"
NSP_HEAD = "nsp_head"
SINUSOIDAL = "sinusoidal"  # the fixed position table: written by `save`, never a parameter

# HF hidden_act -> ours. "gelu" in HF is the exact erf form, like ours; "gelu_fast" is the
# tanh form with sqrt(2/pi) rounded to 10 digits, below float32 resolution.
_ACT_FROM_HF = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}
_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}

# Tensors older transformers versions wrote that carry no parameters of their own.
_BUFFER_NAMES = frozenset({"bert.embeddings.position_ids"})
# Tied copies: the MLM decoder shares the word embeddings and the prediction bias.
TIED_DECODER_WEIGHT = "cls.predictions.decoder.weight"
TIED_DECODER_BIAS = "cls.predictions.decoder.bias"
PREDICTION_BIAS = "cls.predictions.bias"
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One HF tensor and the bertjax parameter it maps to."""

    hf_name: str  # canonical HF name, with the "bert." prefix
    path: tuple[str, ...]  # key path in the (unstacked) bertjax params tree
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]  # bertjax shape
    transpose: bool  # torch Linear weight: [out, in] vs our [in, ...out]
    group: str

    def to_bertjax(self, array: np.ndarray) -> np.ndarray:
        """Converts the HF tensor to the bertjax layout."""
        if self.transpose:
            array = array.T  # [in, out]
        return np.ascontiguousarray(array.reshape(self.shape))

    def to_hf(self, array: np.ndarray) -> np.ndarray:
        """Converts the bertjax parameter to the HF layout."""
        if self.transpose:
            # Our kernels flatten row-major to [in, out]; HF stores the transpose.
            return np.ascontiguousarray(array.reshape(self.hf_shape[::-1]).T)  # [out, in]
        return np.ascontiguousarray(array.reshape(self.hf_shape))


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What `load_with_report` did beyond copying tensors."""

    source: str  # the weights file(s) read
    initialized: tuple[str, ...]  # bertjax param paths freshly initialised
    ignored: tuple[str, ...]  # HF tensors skipped (buffers, tied copies)
    head: HeadSpec | None = None  # a fine-tuned checkpoint's head (BertFor<Task>)

    def __str__(self) -> str:
        lines = [f"read {self.source}"]
        if self.initialized:
            lines.append(
                "freshly initialised (not in the checkpoint): " + ", ".join(self.initialized)
            )
        if self.ignored:
            lines.append("ignored: " + ", ".join(self.ignored))
        return "\n".join(lines)


def tensor_specs(config: BertConfig) -> list[TensorSpec]:
    """Every HF tensor of BertForPreTraining for `config`, in HF's order.

    With sinusoidal positions the position table has no bertjax parameter: its spec has
    group SINUSOIDAL and `save` writes the fixed table as HF's learned embeddings.
    """
    h, n, f = config.hidden_size, config.num_heads, config.intermediate_size
    d = h // n
    v = config.vocab_size
    specs: list[TensorSpec] = []

    def add(hf_name, path, hf_shape, shape=None, transpose=False, group=CORE):
        specs.append(
            TensorSpec(
                hf_name, tuple(path), tuple(hf_shape), tuple(shape or hf_shape), transpose, group
            )
        )

    def layer_norm(hf_prefix, path, group=CORE):
        add(f"{hf_prefix}.weight", (*path, "scale"), (h,), group=group)
        add(f"{hf_prefix}.bias", (*path, "bias"), (h,), group=group)

    def dense(hf_prefix, path, n_in, n_out, kernel_shape=None, bias_shape=None, group=CORE):
        add(
            f"{hf_prefix}.weight",
            (*path, "kernel"),
            (n_out, n_in),
            kernel_shape or (n_in, n_out),
            transpose=True,
            group=group,
        )
        add(f"{hf_prefix}.bias", (*path, "bias"), (n_out,), bias_shape or (n_out,), group=group)

    emb = ("bert", "embeddings")
    add("bert.embeddings.word_embeddings.weight", (*emb, "word_embeddings", "embedding"), (v, h))
    add(
        "bert.embeddings.position_embeddings.weight",
        (*emb, "position_embeddings", "embedding"),
        (config.max_position_embeddings, h),
        group=CORE if config.position_embedding_type == "learned" else SINUSOIDAL,
    )
    add(
        "bert.embeddings.token_type_embeddings.weight",
        (*emb, "token_type_embeddings", "embedding"),
        (config.type_vocab_size, h),
    )
    layer_norm("bert.embeddings.LayerNorm", (*emb, "layer_norm"))

    for i in range(config.num_layers):
        hf = f"bert.encoder.layer.{i}"
        ours = ("bert", "encoder", f"layer_{i}")
        for name in ("query", "key", "value"):
            dense(
                f"{hf}.attention.self.{name}",
                (*ours, "attention", name),
                h,
                h,
                kernel_shape=(h, n, d),
                bias_shape=(n, d),
            )
        dense(
            f"{hf}.attention.output.dense",
            (*ours, "attention", "output"),
            h,
            h,
            kernel_shape=(n, d, h),
        )
        layer_norm(f"{hf}.attention.output.LayerNorm", (*ours, "attention", "layer_norm"))
        dense(f"{hf}.intermediate.dense", (*ours, "mlp", "intermediate"), h, f)
        dense(f"{hf}.output.dense", (*ours, "mlp", "output"), f, h)
        layer_norm(f"{hf}.output.LayerNorm", (*ours, "mlp", "layer_norm"))

    dense("bert.pooler.dense", ("bert", "pooler"), h, h, group=POOLER)
    # HF's order within cls.predictions: bias first, then the transform.
    add(PREDICTION_BIAS, ("mlm_head", "output_bias"), (v,), group=MLM_HEAD)
    dense("cls.predictions.transform.dense", ("mlm_head", "transform"), h, h, group=MLM_HEAD)
    layer_norm("cls.predictions.transform.LayerNorm", ("mlm_head", "layer_norm"), group=MLM_HEAD)
    dense("cls.seq_relationship", ("nsp_head",), h, 2, group=NSP_HEAD)
    return specs


def config_from_hf(hf_config: Mapping[str, Any], **overrides) -> BertConfig:
    """Builds a BertConfig from a transformers BERT config dict (config.json)."""
    model_type = hf_config.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"config.json: model_type={model_type!r} is not supported; valid: 'bert'")
    act = hf_config.get("hidden_act", "gelu")
    if act not in _ACT_FROM_HF:
        raise ValueError(
            f"config.json: hidden_act={act!r} is not supported; valid: {sorted(_ACT_FROM_HF)}"
        )
    pos_type = hf_config.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ValueError(
            f"config.json: position_embedding_type={pos_type!r} is not supported; valid: 'absolute'"
        )
    required = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
    )
    for key in required:
        if key not in hf_config:
            raise ValueError(f"config.json: missing required field {key!r}")
    fields = dict(
        vocab_size=int(hf_config["vocab_size"]),
        hidden_size=int(hf_config["hidden_size"]),
        num_layers=int(hf_config["num_hidden_layers"]),
        num_heads=int(hf_config["num_attention_heads"]),
        intermediate_size=int(hf_config["intermediate_size"]),
        max_position_embeddings=int(hf_config.get("max_position_embeddings", 512)),
        type_vocab_size=int(hf_config.get("type_vocab_size", 2)),
        hidden_dropout=float(hf_config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(hf_config.get("attention_probs_dropout_prob", 0.1)),
        layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-12)),
        initializer_range=float(hf_config.get("initializer_range", 0.02)),
        hidden_act=_ACT_FROM_HF[act],
        position_embedding_type="learned",
    )
    valid = {f.name for f in dataclasses.fields(BertConfig)}
    for key in overrides:
        # These fix what the weights mean: overriding one would reinterpret the checkpoint.
        if key in ARCHITECTURE_FIELDS:
            raise ValueError(
                f"override {key}={overrides[key]!r} is not allowed: it is fixed by the "
                f"checkpoint; overridable: {sorted(valid - set(ARCHITECTURE_FIELDS))}"
            )
        if key not in valid:
            raise ValueError(
                f"override {key!r} is not a BertConfig field; "
                f"overridable: {sorted(valid - set(ARCHITECTURE_FIELDS))}"
            )
    return BertConfig(**{**fields, **overrides})


def config_to_hf(config: BertConfig, head: HeadSpec | None = None) -> dict[str, Any]:
    """The transformers config.json dict for `config` (architecture BertForPreTraining, or the
    transformers class of `head` with its config fields, e.g. the labels).

    Sinusoidal positions become HF's absolute (learned) ones: `save` writes the table.
    """
    hf_config = {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": _ACT_TO_HF[config.hidden_act],
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "dtype": str(np.dtype(config.param_dtype)),
    }
    if head is not None:
        th = _transformers_head(head)
        hf_config["architectures"] = [th.architecture]
        hf_config.update(th.config)
    return hf_config


# A BertModel's tensors: the encoder and its pooler, no pretraining heads.
_ENCODER_GROUPS = (CORE, SINUSOIDAL, POOLER)
_ENCODER_PREFIX = "bert."


def encoder_files(config: BertConfig, params: Mapping) -> tuple[dict[str, Any], dict]:
    """(config.json, tensors) of the encoder in `params["bert"]` (any task model's tree,
    boxed or not) as transformers' BertModel: what a sentence-transformers Transformer module
    holds."""
    params = nn.meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    if "bert" not in params:
        raise ValueError(f"params hold {sorted(params)}; expected the encoder under 'bert'")
    params = {"bert": params["bert"]}
    if config.scan_layers:
        params = model_lib.unstack_layers(params, config.num_layers)
    flat = dict(flatten_tree(params))
    tensors: dict[str, np.ndarray] = {}
    for spec in tensor_specs(config):
        if spec.group not in _ENCODER_GROUPS:
            continue
        name = spec.hf_name.removeprefix(_ENCODER_PREFIX)  # a BertModel's own names
        if spec.group == SINUSOIDAL:
            tensors[name] = _sinusoidal_tensor(config)
        else:
            tensors[name] = spec.to_hf(_parameter(flat, spec))
    hf_config = config_to_hf(config)
    hf_config["architectures"] = ["BertModel"]
    hf_config.pop("tie_word_embeddings", None)  # a BertModel has no decoder to tie
    return hf_config, tensors


def _parameter(flat: Mapping[tuple[str, ...], Any], spec: TensorSpec) -> np.ndarray:
    """The parameter a tensor is made of, as numpy, checked to be there with its shape."""
    name = "/".join(spec.path)
    if spec.path not in flat:
        raise ValueError(f"params: missing parameter {name!r} (shape {spec.shape})")
    array = to_numpy(flat[spec.path])
    if tuple(array.shape) != spec.shape:
        raise ValueError(
            f"params: parameter {name!r} has shape {tuple(array.shape)}, expected {spec.shape}"
        )
    return array


def _sinusoidal_tensor(config: BertConfig) -> np.ndarray:
    """The fixed position table, written as transformers' learned position embeddings."""
    table = model_lib.sinusoidal_table(config.max_position_embeddings, config.hidden_size)
    return table.astype(np.dtype(config.param_dtype))


def _transformers_head(head: HeadSpec) -> TransformersHead:
    th = capability.of(head).transformers_head(head)
    if th is None:
        raise ValueError(
            f"a {head.task} model is not a transformers BERT class; Model.save_hf writes it "
            "in its own format"
        )
    return th


def head_specs(config: BertConfig, head: TransformersHead) -> list[TensorSpec]:
    """Every HF tensor of a fine-tuned model: the encoder, the pooler and the head's dense
    layer [outputs, hidden] under its own name.

    transformers' BertForTokenClassification and BertForQuestionAnswering have no pooler:
    `save` leaves it out for those, and `load_with_report` initialises it afresh (bertjax's
    encoder always has one).
    """
    h, n, name = config.hidden_size, head.outputs, head.param
    specs = [spec for spec in tensor_specs(config) if spec.group in (CORE, SINUSOIDAL, POOLER)]
    specs.append(TensorSpec(f"{name}.weight", (name, "kernel"), (n, h), (h, n), True, name))
    specs.append(TensorSpec(f"{name}.bias", (name, "bias"), (n,), (n,), False, name))
    return specs


def load(path: str | os.PathLike, *, seed: int = 0, **overrides) -> tuple[BertConfig, dict]:
    """Reads a transformers BERT directory into (BertConfig, params).

    Params are unboxed numpy arrays in BertForPreTraining's tree (stacked when the config
    has scan_layers=True), in the config's param_dtype. Heads missing from the checkpoint
    (a BertModel checkpoint has no cls.* tensors) are freshly initialised from `seed` and
    reported with a logging warning; `load_with_report` also returns the list.
    `overrides` set non-architecture BertConfig fields (dtype, param_dtype, attention_impl,
    remat_policy, scan_layers, dropout rates).
    """
    config, params, _ = load_with_report(path, seed=seed, **overrides)
    return config, params


def load_with_report(
    path: str | os.PathLike, *, seed: int = 0, pretraining_heads: bool = True, **overrides
) -> tuple[BertConfig, dict, LoadReport]:
    """Like `load`, also returning a LoadReport of initialised and ignored tensors.

    Without `pretraining_heads` (a fine-tuning run, which never uses them) MLM and NSP heads
    the directory lacks are neither initialised nor reported: the parameters hold what the
    directory has.
    """
    directory = fs.path(path)
    if fs.kind(directory) != "directory":
        raise FileNotFoundError(
            f"{directory}: not a directory (expected a transformers BERT "
            f"directory with {CONFIG_NAME} and {SAFE_WEIGHTS_NAME})"
        )
    config_path = directory / CONFIG_NAME
    if fs.kind(config_path) != "file":
        raise FileNotFoundError(f"{config_path}: missing; a transformers BERT directory needs it")
    hf_config = read_config(config_path)
    config = config_from_hf(hf_config, **overrides)
    try:
        head = capability.head_from_transformers(hf_config)
    except ValueError as err:
        raise ValueError(f"{config_path}: {err}") from None
    required = {CORE}
    if head is None:
        specs = tensor_specs(config)
    else:
        th = _transformers_head(head)
        specs = head_specs(config, th)
        required.add(th.param)

    tensors, source = read_weights(directory)
    found, ignored = _canonical_tensors(tensors, source)
    by_name = {spec.hf_name: spec for spec in specs}

    unexpected = sorted(set(found) - set(by_name))
    if unexpected:
        raise ValueError(
            f"{source}: unexpected tensor(s) {name_list(unexpected)} for a BERT "
            f"with {config.num_layers} layers"
        )

    dtype = np.dtype(config.param_dtype)
    flat, missing_groups = match_tensors(
        specs,
        found,
        source,
        required=required,
        unwanted=() if pretraining_heads else (MLM_HEAD, NSP_HEAD),
        dtype=dtype,
        expected_from=f" from {config_path}",
    )

    initialized: list[str] = []
    if missing_groups:
        paths = tuple(spec.path for spec in specs if spec.group in missing_groups)
        for path, value in _fresh_params(config, paths, seed).items():
            flat[path] = value.astype(dtype)
            initialized.append("/".join(path))
        logger.warning(
            "%s: no tensors for %s; freshly initialised: %s",
            source,
            ", ".join(missing_groups),
            ", ".join(initialized),
        )

    params = unflatten_tree(flat)
    if config.scan_layers:
        # Back to host arrays: stack_layers stacks with jnp.
        params = jax.tree.map(np.asarray, model_lib.stack_layers(params, config.num_layers))
    report = LoadReport(
        source=source,
        initialized=tuple(initialized),
        ignored=tuple(ignored),
        head=head,
    )
    return config, params, report


def save(
    config: BertConfig,
    params: Mapping,
    path: str | os.PathLike,
    tokenizer: Tokenizer | None = None,
    head: HeadSpec | None = None,
    *,
    untrained: Sequence[str] = (),
) -> None:
    """Writes config.json and model.safetensors loadable by transformers.BertForPreTraining.

    With a `head`, `params` is a fine-tuned model's tree ("bert" and the head's dense layer,
    e.g. "classifier" or "qa_outputs") and the directory loads in the transformers class its
    capability names (BertForSequenceClassification with the labels as id2label,
    BertForTokenClassification, BertForQuestionAnswering).

    `params` is BertForPreTraining's tree (boxed or unboxed, stacked per the config's
    scan_layers, optionally wrapped in {"params": ...}); tensors keep their dtype. With a
    tokenizer, its files are written too (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json and its own tokenizer.model or vocab.txt).

    `untrained` names parameter groups (MLM_HEAD, NSP_HEAD, POOLER) that were never trained
    (freshly initialised when a BertModel directory was read): they are left out, so the
    export claims only what exists (a BertModel without the MLM head, BertForMaskedLM without
    the NSP head) and a reload refuses what the original refused.

    The files are written into a temporary sibling directory and moved in only once every
    one is complete: a failure part-way (a full disk) leaves a previous export whole.
    """
    require_safetensors()
    unknown = sorted(set(untrained) - {MLM_HEAD, NSP_HEAD, POOLER})
    if unknown:
        raise ValueError(
            f"untrained={unknown} is invalid: valid groups are {[MLM_HEAD, NSP_HEAD, POOLER]}"
        )
    if tokenizer is not None:
        check_vocab(config, tokenizer, f"saving to {path}")
    params = nn.meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    if config.scan_layers:
        params = model_lib.unstack_layers(params, config.num_layers)
    hf_config = config_to_hf(config, head)
    flat = {path: leaf for path, leaf in flatten_tree(params)}
    th = None if head is None else _transformers_head(head)
    specs = tensor_specs(config) if th is None else head_specs(config, th)
    expected = {spec.path for spec in specs if spec.group != SINUSOIDAL}
    if th is not None and not th.pooler:  # in params, not written
        specs = [spec for spec in specs if spec.group != POOLER]
    if head is None and untrained:
        specs = [spec for spec in specs if spec.group not in untrained]
        if MLM_HEAD in untrained:
            hf_config["architectures"] = ["BertModel"]
        elif NSP_HEAD in untrained:
            hf_config["architectures"] = ["BertForMaskedLM"]
    unexpected = sorted("/".join(p) for p in set(flat) - expected)
    if unexpected:
        raise ValueError(f"params: unexpected parameter(s) {name_list(unexpected)} for {config}")

    tensors: dict[str, np.ndarray] = {}
    dtypes = set()
    for spec in specs:
        if spec.group == SINUSOIDAL:
            continue
        array = _parameter(flat, spec)
        tensors[spec.hf_name] = spec.to_hf(array)
        dtypes.add(array.dtype)
    if len(dtypes) == 1:
        hf_config["dtype"] = str(next(iter(dtypes)))
    for spec in specs:
        if spec.group == SINUSOIDAL:
            tensors[spec.hf_name] = _sinusoidal_tensor(config)
    # HF's order, which is also the order of the specs.
    tensors = {spec.hf_name: tensors[spec.hf_name] for spec in specs}

    directory = fs.path(path)
    with staged(directory) as staging:
        write_json(staging / CONFIG_NAME, hf_config)
        # transformers refuses safetensors files whose metadata does not name a known format.
        safetensors_numpy.save_file(tensors, staging / SAFE_WEIGHTS_NAME, metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_hf(staging, model_max_length=config.max_position_embeddings)
    for stale in (SAFE_WEIGHTS_INDEX_NAME, TORCH_WEIGHTS_NAME, TORCH_WEIGHTS_INDEX_NAME):
        if (directory / stale).exists():
            logger.warning(
                "%s: left in place; %s takes precedence when loading",
                directory / stale,
                SAFE_WEIGHTS_NAME,
            )


def check_vocab(config: BertConfig, tokenizer: Tokenizer, what: str) -> None:
    """Fails unless every id of the tokenizer has a row in the model's vocabulary.

    A model may have more rows than the tokenizer has pieces (vocabularies padded to a
    multiple of 8), never fewer.
    """
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"{what}: the tokenizer has {tokenizer.vocab_size} pieces but the model's "
            f"vocabulary has {config.vocab_size} rows; they do not belong together"
        )


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer of a transformers BERT directory (or of a bertjax export).

    Read in this order: bertjax's sentencepiece model (tokenizer.model, which `save`
    writes beside tokenizer.json: same ids, same fingerprint), a tokenizer.json (BERT's
    WordPiece, or another pipeline with BERT's special tokens, as ModernBERT's byte-level
    BPE), then BERT's vocab.txt with tokenizer_config.json's do_lower_case (True when absent, as in
    transformers), strip_accents and tokenize_chinese_chars.
    """
    directory = fs.path(path)
    sentencepiece_file = directory / SENTENCEPIECE_FILE
    json_file = directory / HF_TOKENIZER_FILE
    vocab_file = directory / WORDPIECE_VOCAB_FILE
    # Read as bytes through the storage layer (the files may be on gs://), with the sources
    # Tokenizer.load and WordPieceTokenizer.from_vocab would name.
    if fs.kind(sentencepiece_file) == "file":
        return SentencePieceTokenizer(
            fs.read_bytes(sentencepiece_file), source=f"tokenizer model {str(sentencepiece_file)!r}"
        )
    if json_file.is_file():
        return tokenizer_from_json(
            fs.read_text(json_file), source=f"tokenizer model {str(json_file)!r}"
        )
    if vocab_file.is_file():
        settings = _tokenizer_config(directory)
        # As transformers reads vocab.txt: universal newlines, only the newline stripped.
        lines = io.StringIO(fs.read_text(vocab_file), newline=None).readlines()
        return WordPieceTokenizer(
            [line.rstrip("\n") for line in lines],
            lowercase=bool(settings.get("do_lower_case", True)),
            strip_accents=settings.get("strip_accents"),
            tokenize_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)),
            source=f"WordPiece vocabulary {str(vocab_file)!r}",
        )
    raise FileNotFoundError(
        f"{directory}: no tokenizer found; expected {HF_TOKENIZER_FILE}, {WORDPIECE_VOCAB_FILE} "
        f"or {SENTENCEPIECE_FILE}"
    )


def _tokenizer_config(directory: fs.AnyPath) -> dict[str, Any]:
    """tokenizer_config.json (empty when absent), refusing special tokens BERT does not use."""
    config_file = directory / HF_TOKENIZER_CONFIG_FILE
    if not config_file.is_file():
        return {}
    settings = json.loads(fs.read_text(config_file))
    for name, expected in HF_SPECIAL_TOKENS.items():
        value = settings.get(name, expected)
        if isinstance(value, dict):  # transformers' serialized AddedToken
            value = value.get("content")
        if value != expected:
            raise ValueError(
                f"{config_file}: {name}={value!r}; bertjax reads BERT vocabularies whose "
                f"special tokens are {sorted(HF_SPECIAL_TOKENS.values())}"
            )
    return settings


def require_safetensors() -> None:
    if safetensors_numpy is None:
        raise ImportError(
            "reading and writing transformers weights needs the safetensors "
            "package: pip install 'bertjax[hf]'"
        )


def read_weights(directory: fs.AnyPath) -> tuple[dict[str, np.ndarray], str]:
    """Reads every tensor of the directory's weights, in the order transformers prefers."""
    safe = directory / SAFE_WEIGHTS_NAME
    safe_index = directory / SAFE_WEIGHTS_INDEX_NAME
    torch_file = directory / TORCH_WEIGHTS_NAME
    torch_index = directory / TORCH_WEIGHTS_INDEX_NAME
    if safe.is_file():
        require_safetensors()
        return _read_safetensors(safe), str(safe)
    if safe_index.is_file():
        require_safetensors()
        tensors = {}
        for shard in _index_shards(safe_index):
            tensors.update(_read_safetensors(directory / shard))
        return tensors, str(safe_index)
    if torch_file.is_file():
        return _read_torch_file(torch_file), str(torch_file)
    if torch_index.is_file():
        tensors = {}
        for shard in _index_shards(torch_index):
            tensors.update(_read_torch_file(directory / shard))
        return tensors, str(torch_index)
    raise FileNotFoundError(
        f"{directory}: no weights found; expected one of {SAFE_WEIGHTS_NAME}, "
        f"{SAFE_WEIGHTS_INDEX_NAME}, {TORCH_WEIGHTS_NAME}, {TORCH_WEIGHTS_INDEX_NAME}"
    )


def read_config(path: fs.AnyPath) -> dict[str, Any]:
    """config.json as a dict; a file that is not a JSON object is named with what is wrong."""
    try:
        value = json.loads(fs.read_text(path))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: line {err.lineno}: not valid JSON ({err.msg}); expected a transformers "
            "config object"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"{path}: holds a JSON {type(value).__name__}; expected a transformers config object"
        )
    return value


def _read_safetensors(path: fs.AnyPath) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file; a damaged file is named with what is wrong."""
    try:
        if fs.is_remote(path):  # read whole: the tensors are all wanted anyway
            return dict(safetensors_numpy.load(fs.read_bytes(path)))
        return dict(safetensors_numpy.load_file(path))
    except fs.StorageError:
        raise
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing (named by the weights index)") from None
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{path}: not a readable safetensors file ({reason}); it is truncated or damaged, "
            "export or download it again"
        ) from None


def write_json(path: pathlib.Path, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


@contextlib.contextmanager
def staged(directory: fs.AnyPath):
    """Yields a temporary sibling of `directory`; once the block completes, moves its files in.

    Each file then replaces its namesake by one rename, after every file was written whole,
    so a failure while writing (a full disk, a bad tensor) leaves the old files untouched;
    other files already in `directory` stay. Subdirectories are merged the same way. Files
    get the umask's permissions, as `open` would give them (safetensors and temporary
    directories are private by default). A failure is reported against `directory`, the
    path the caller gave, never the temporary one.

    For a `gs://` directory the files are made in a local temporary directory and uploaded
    once all are complete (see `upload`): a failure while writing them uploads nothing.
    """
    if fs.is_remote(directory):
        with tempfile.TemporaryDirectory(prefix="bertjax-export-") as staging:
            with _writing(directory):
                yield pathlib.Path(staging)
            upload(staging, directory)
        return
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(
            tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent)
        )
    except OSError as err:
        raise OSError(err.errno, f"cannot write {directory}: {err.strerror}") from None
    try:
        with _writing(directory):
            yield staging
        umask = os.umask(0)
        os.umask(umask)
        _move_into(staging, directory, umask)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _writing(directory: fs.AnyPath):
    """A failure while writing an export's files (a full disk: an OSError from `open`, a
    SafetensorError from safetensors' own writer) as one OSError naming `directory`, the
    path the caller gave, and the cause."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, f"cannot write {directory}: {err.strerror or err}") from None
    except SafetensorError as err:
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OSError(f"cannot write {directory}: {cause}") from None


def _move_into(staging: pathlib.Path, directory: pathlib.Path, umask: int) -> None:
    """Renames each file of `staging` over its namesake in `directory`, subdirectories too."""
    directory.mkdir(exist_ok=True)
    for entry in sorted(staging.iterdir()):
        if entry.is_dir():
            _move_into(entry, directory / entry.name, umask)
            continue
        os.chmod(entry, 0o666 & ~umask)
        os.replace(entry, directory / entry.name)


def upload(local: str | os.PathLike, directory: str | os.PathLike) -> None:
    """Copies a local directory's files (and subdirectories) into `directory` (local or
    gs://), each file written whole; config.json last, so that a reader who finds it finds
    the weights it describes already there."""
    local = pathlib.Path(local)
    files = sorted(
        (f for f in local.rglob("*") if f.is_file()),
        key=lambda f: (f.relative_to(local).as_posix() == CONFIG_NAME, f.relative_to(local).parts),
    )
    fs.makedirs(directory)
    for file in files:
        fs.write_bytes(fs.join(directory, *file.relative_to(local).parts), file.read_bytes())


def _index_shards(index_path: fs.AnyPath) -> list[str]:
    weight_map = json.loads(fs.read_text(index_path)).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index_path}: no 'weight_map' of tensor name -> shard file")
    return sorted(set(weight_map.values()))


def _read_torch_file(file: fs.AnyPath) -> dict[str, np.ndarray]:
    """Reads a torch state dict; torch is optional, so it is imported only here."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        raise ImportError(
            f"{file}: reading {TORCH_WEIGHTS_NAME} needs torch, which is not installed; "
            f"install the extra (pip install 'bertjax[hf]') or convert the checkpoint to "
            f"{SAFE_WEIGHTS_NAME}"
        ) from e
    source = io.BytesIO(fs.read_bytes(file)) if fs.is_remote(file) else file
    state = torch.load(source, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise ValueError(f"{file}: expected a state dict of tensors, got {type(state).__name__}")
    tensors = {}
    for name, tensor in state.items():
        tensor = tensor.detach().contiguous()
        if tensor.dtype == torch.bfloat16:
            # numpy has no native bfloat16: move the bits and view them as ml_dtypes' type.
            tensors[name] = tensor.view(torch.int16).numpy().view(jnp.bfloat16)
        else:
            tensors[name] = tensor.numpy()
    return tensors


def _canonical_name(name: str) -> str:
    """HF tensor name with the "bert." prefix and weight/bias LayerNorm naming."""
    if name.endswith("LayerNorm.gamma"):
        name = name[: -len("gamma")] + "weight"
    elif name.endswith("LayerNorm.beta"):
        name = name[: -len("beta")] + "bias"
    if name.split(".", 1)[0] in ("embeddings", "encoder", "pooler"):
        name = "bert." + name  # BertModel checkpoints have no prefix
    return name


def match_tensors(
    specs, found, source, *, required, unwanted, dtype, expected_from: str = ""
) -> tuple[dict[tuple[str, ...], np.ndarray], list[str]]:
    """A transformers file's tensors `found` (by name) matched to a family's tensor specs:
    (bertjax's arrays by path in `dtype`, the groups with no tensor at all, in spec order,
    leaving out `unwanted` ones). A group that is `required`, or partly present, must be
    whole; a tensor of another shape is refused, naming the file (and `expected_from`)."""
    present = {spec.group for spec in specs if spec.hf_name in found}
    flat: dict[tuple[str, ...], np.ndarray] = {}
    missing: list[str] = []
    for spec in specs:
        if spec.hf_name not in found:
            if spec.group in required or spec.group in present:
                raise ValueError(
                    f"{source}: missing tensor {spec.hf_name!r} (shape {spec.hf_shape})"
                )
            if spec.group not in unwanted and spec.group not in missing:
                missing.append(spec.group)
            continue
        array = found[spec.hf_name]
        if tuple(array.shape) != spec.hf_shape:
            raise ValueError(
                f"{source}: tensor {spec.hf_name!r} has shape {tuple(array.shape)}, "
                f"expected {spec.hf_shape}{expected_from}"
            )
        flat[spec.path] = spec.to_bertjax(array).astype(dtype)
    return flat, missing


def _canonical_tensors(
    tensors: Mapping[str, np.ndarray], source: str
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Renames tensors to canonical names and drops buffers and tied copies (checked)."""
    found: dict[str, np.ndarray] = {}
    original: dict[str, str] = {}
    for name, array in tensors.items():
        canonical = _canonical_name(name)
        if canonical in found:
            raise ValueError(
                f"{source}: tensors {original[canonical]!r} and {name!r} are the "
                f"same parameter {canonical!r}"
            )
        found[canonical] = np.asarray(array)
        original[canonical] = name

    ignored = []
    for name in sorted(_BUFFER_NAMES & set(found)):
        del found[name]
        ignored.append(original[name])
    if TIED_DECODER_WEIGHT in found:
        decoder = found.pop(TIED_DECODER_WEIGHT)
        words = found.get(WORD_EMBEDDINGS)
        if words is not None and not np.array_equal(decoder, words):
            raise ValueError(
                f"{source}: tensor {original[TIED_DECODER_WEIGHT]!r} differs from "
                f"{original[WORD_EMBEDDINGS]!r}; untied MLM decoder weights are "
                "not supported (bertjax ties them to the word embeddings)"
            )
        ignored.append(original[TIED_DECODER_WEIGHT])
    if TIED_DECODER_BIAS in found:
        decoder_bias = found.pop(TIED_DECODER_BIAS)
        bias = found.setdefault(PREDICTION_BIAS, decoder_bias)
        if not np.array_equal(bias, decoder_bias):
            raise ValueError(
                f"{source}: tensor {original[TIED_DECODER_BIAS]!r} differs from "
                f"{original[PREDICTION_BIAS]!r}; they must be the same bias"
            )
        if PREDICTION_BIAS not in original:
            original[PREDICTION_BIAS] = original[TIED_DECODER_BIAS]
        else:
            ignored.append(original[TIED_DECODER_BIAS])
    return found, ignored


def _fresh_params(
    config: BertConfig, paths: tuple[tuple[str, ...], ...], seed: int
) -> dict[tuple[str, ...], np.ndarray]:
    """The parameters at `paths`, initialised as BertForPreTraining's own init does."""
    init_config = dataclasses.replace(
        config, scan_layers=False, attention_impl="xla", remat_policy="none"
    )
    fresh = _init_selected(init_config, paths, jax.random.key(seed))
    return {path: np.asarray(value) for path, value in zip(paths, fresh)}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init_selected(
    config: BertConfig, paths: tuple[tuple[str, ...], ...], key: jax.Array
) -> list[jax.Array]:
    # Returning only the selected leaves lets XLA drop the rest of the init, which for
    # the encoder is most of the compile and run time.
    ids = jnp.zeros((1, 1), jnp.int32)  # [batch, seq]
    params = nn.meta.unbox(model_lib.BertForPreTraining(config).init(key, ids)["params"])
    return [_get(params, path) for path in paths]


def to_numpy(leaf: Any) -> np.ndarray:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        raise ValueError(
            "params hold arrays spread over several processes; gather them first "
            "(jax.experimental.multihost_utils.process_allgather) and save from "
            "one process"
        )
    return np.asarray(jax.device_get(leaf))


def flatten_tree(tree: Mapping, prefix: tuple[str, ...] = ()):
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from flatten_tree(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def unflatten_tree(flat: Mapping[tuple[str, ...], Any]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def _get(tree: Mapping, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def name_list(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
