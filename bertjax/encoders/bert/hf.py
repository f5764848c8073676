"""BERT's transformers format: config.json, the tensor map, and whole directories in and out.

`load` reads a transformers BERT directory (config.json plus model.safetensors, a sharded
model.safetensors.index.json, or pytorch_model.bin) into a `BertConfig` and the parameter tree
of `BertForPreTraining`; `save` writes the reverse, a directory that
`transformers.BertForPreTraining.from_pretrained` loads with nothing missing or unexpected.
Given a tokenizer, `save` also writes its files (tokenizer.json and the rest, see
`bertjax.text.tokenizer.Tokenizer.save_hf`), so that `AutoTokenizer` and the fill-mask pipeline
work on the directory.

Fine-tuned models travel too: `save(..., head=HeadSpec)` writes the transformers class of the
head's capability (bertjax.capability.TransformersHead: BertForSequenceClassification,
BertForTokenClassification, BertForQuestionAnswering, with their config fields such as
id2label), and `load_with_report` reads one back, its head in `LoadReport.head` (asked of every
capability) and the head's dense layer under its own name beside "bert".

The files themselves (safetensors, sharded indexes, staging, upload, tokenizer files) are
read and written by bertjax.storage.hf, which no family owns.

Layout differences handled here: torch Linear weights are [out, in] and ours are
[in, out]; the attention projections are split per head, [H, N*D] -> [H, N, D] for
query/key/value and [N*D, H] -> [N, D, H] for the attention output.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import capability
from bertjax.capability import HeadSpec, TransformersHead
from bertjax.encoders import family as family_lib
from bertjax.encoders.bert import model as bert_model
from bertjax.encoders.bert.config import ARCHITECTURE_FIELDS, BertConfig
from bertjax.storage import fs
from bertjax.storage.hf import (
    CONFIG_NAME,
    CORE,
    MLM_HEAD,
    NSP_HEAD,
    POOLER,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SINUSOIDAL,
    TORCH_WEIGHTS_INDEX_NAME,
    TORCH_WEIGHTS_NAME,
    TensorSpec,
    _get,
    match_tensors,
    name_list,
    read_config,
    read_weights,
    refuse_unexpected,
    require_safetensors,
    safetensors_numpy,
    single_dtype,
    staged,
    tensors_from,
    unflatten_tree,
    write_json,
)
from bertjax.text.tokenizer import Tokenizer, check_vocab

logger = logging.getLogger(__name__)

# transformers' BERT classes: Bert<task class>, e.g. BertForQuestionAnswering.
CLASS_PREFIX = "Bert"


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
        hf_config["architectures"] = [CLASS_PREFIX + th.task_class]
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
        params = bert_model.unstack_layers(params, config.num_layers)
    specs = [
        # A BertModel's own names carry no prefix.
        dataclasses.replace(spec, hf_name=spec.hf_name.removeprefix(_ENCODER_PREFIX))
        for spec in tensor_specs(config)
        if spec.group in _ENCODER_GROUPS
    ]
    tensors = tensors_from(specs, params, fixed=_fixed_tensors(config))
    hf_config = config_to_hf(config)
    hf_config["architectures"] = ["BertModel"]
    hf_config.pop("tie_word_embeddings", None)  # a BertModel has no decoder to tie
    return hf_config, tensors


def _fixed_tensors(config: BertConfig) -> dict[str, np.ndarray]:
    """The tensors no parameter holds, by group: the fixed position table of sinusoidal
    positions, written as transformers' learned position embeddings."""
    if config.position_embedding_type == "learned":
        return {}
    table = bert_model.sinusoidal_table(config.max_position_embeddings, config.hidden_size)
    return {SINUSOIDAL: table.astype(np.dtype(config.param_dtype))}


def _transformers_head(head: HeadSpec) -> TransformersHead:
    th = capability.of(head).transformers_head(head)
    if th is None:
        raise ValueError(
            f"a {head.task} model is not a transformers BERT class; Model.save_hf writes it "
            "in its own format"
        )
    return th


def head_tensors(config: BertConfig, name: str, outputs: int) -> tuple[TensorSpec, ...]:
    """The tensor map of a BERT task head: one dense layer [outputs, hidden] under its own
    name in both trees (transformers' Bert<task class>), whatever it reads: a sequence head
    reads BertModel's pooler, which is the encoder's."""
    return family_lib.dense_tensors(name, (name,), config.hidden_size, outputs, name)


def head_specs(config: BertConfig, head: TransformersHead) -> list[TensorSpec]:
    """Every HF tensor of a fine-tuned model: the encoder, the pooler and the head's
    (`head_tensors`).

    transformers' BertForTokenClassification and BertForQuestionAnswering have no pooler:
    `save` leaves it out for those, and `load_with_report` initialises it afresh (bertjax's
    encoder always has one).
    """
    specs = [spec for spec in tensor_specs(config) if spec.group in (CORE, SINUSOIDAL, POOLER)]
    return specs + list(head_tensors(config, head.param, head.outputs))


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


def read(
    path: str | os.PathLike,
    hf_config: Mapping[str, Any] | None = None,
    *,
    pretraining_heads: bool = True,
    **overrides,
) -> tuple[BertConfig, dict, HeadSpec | None, tuple[str, ...]]:
    """Reads a transformers BERT directory as every family's reader does (the family's
    read_transformers): (config, params, head or None, the groups the files did not have,
    freshly initialised). config.json is read from the directory (`hf_config` is what it
    holds)."""
    config, params, report = load_with_report(
        path, pretraining_heads=pretraining_heads, **overrides
    )
    fresh = {name.split("/")[0] for name in report.initialized}
    if "bert" in fresh:  # bert/pooler: a BertModel checkpoint saved without its pooler
        fresh = (fresh - {"bert"}) | {POOLER}
    return config, params, report.head, tuple(sorted(fresh))


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
        head = capability.head_from_transformers(hf_config, CLASS_PREFIX)
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
        params = jax.tree.map(np.asarray, bert_model.stack_layers(params, config.num_layers))
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
        params = bert_model.unstack_layers(params, config.num_layers)
    hf_config = config_to_hf(config, head)
    th = None if head is None else _transformers_head(head)
    specs = tensor_specs(config) if th is None else head_specs(config, th)
    refuse_unexpected(params, specs, str(config))
    if th is not None and th.reads != capability.POOLED:  # in params, not written
        specs = [spec for spec in specs if spec.group != POOLER]
    if head is None and untrained:
        specs = [spec for spec in specs if spec.group not in untrained]
        if MLM_HEAD in untrained:
            hf_config["architectures"] = ["BertModel"]
        elif NSP_HEAD in untrained:
            hf_config["architectures"] = ["BertForMaskedLM"]
    # In HF's order, which is also the order of the specs.
    tensors = tensors_from(specs, params, fixed=_fixed_tensors(config))
    # The parameters' dtype (the fixed position table has the config's).
    dtype = single_dtype(tensors[spec.hf_name] for spec in specs if spec.group != SINUSOIDAL)
    if dtype is not None:
        hf_config["dtype"] = dtype

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


def _canonical_name(name: str) -> str:
    """HF tensor name with the "bert." prefix and weight/bias LayerNorm naming."""
    if name.endswith("LayerNorm.gamma"):
        name = name[: -len("gamma")] + "weight"
    elif name.endswith("LayerNorm.beta"):
        name = name[: -len("beta")] + "bias"
    if name.split(".", 1)[0] in ("embeddings", "encoder", "pooler"):
        name = "bert." + name  # BertModel checkpoints have no prefix
    return name


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
    params = nn.meta.unbox(bert_model.BertForPreTraining(config).init(key, ids)["params"])
    return [_get(params, path) for path in paths]
