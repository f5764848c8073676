"""ELECTRA's transformers format: config translation and the tensor map, both ways.

transformers' names: "electra." + ElectraModel's tensors (an ElectraModel directory has no
prefix), then per class:

  ElectraForPreTraining             discriminator_predictions.dense, .dense_prediction [1, h]
  ElectraForMaskedLM                generator_predictions.dense [e, h], .LayerNorm [e] and
                                    generator_lm_head.bias [v] (its weight is the word table,
                                    tied, and not written)
  ElectraForSequenceClassification  classifier.dense [h, h] and classifier.out_proj
                                    [labels, h]: one head of two layers (`head_tensors`),
                                    the first kept in the encoder's tree as "pooler"
  ElectraForTokenClassification     classifier [labels, h]
  ElectraForQuestionAnswering       qa_outputs [2, h]

The encoder's layers have BERT's names and layout, so their specs are bertjax.storage.hf's, renamed;
the embeddings are BERT's at the embedding width.
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
import numpy as np

from bertjax import capability
from bertjax.capability import TransformersHead
from bertjax.encoders import family as family_lib
from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.electra import model as electra_model
from bertjax.encoders.electra.config import ARCHITECTURE_FIELDS, HF_DEFAULTS, ElectraConfig
from bertjax.storage import fs, hf
from bertjax.storage.hf import TensorSpec
from bertjax.text.tokenizer import check_vocab

logger = logging.getLogger(__name__)

MODEL_TYPE = "electra"
# transformers' ELECTRA classes: Electra<task class>, e.g. ElectraForQuestionAnswering.
CLASS_PREFIX = "Electra"
HF_PREFIX = "electra."
ENCODER = capability.ENCODER
# Parameter groups: the encoder core is in every directory; each other group is whole or
# absent (then freshly initialised and reported).
CORE = "core"
POOLER = electra_model.POOLER
MLM_HEAD = electra_model.MLM_HEAD
DISCRIMINATOR_HEAD = electra_model.DISCRIMINATOR_HEAD
PRETRAINING_HEADS = (MLM_HEAD, DISCRIMINATOR_HEAD)
TIED_DECODER = "generator_lm_head.weight"
# transformers' name of ElectraForPreTraining's replaced-token head.
HF_DISCRIMINATOR = "discriminator_predictions"
WORD_EMBEDDINGS = "electra.embeddings.word_embeddings.weight"
# Buffers older transformers versions wrote; they hold no parameter.
_BUFFERS = frozenset({"electra.embeddings.position_ids", "electra.embeddings.token_type_ids"})
# ElectraModel's top-level modules, named without the prefix in its own directories.
_MODEL_MODULES = ("embeddings", "embeddings_project", "encoder")


# ---------------------------------------------------------------------------------------------
# config.json


def config_from_hf(hf_config: Mapping[str, Any], **overrides) -> ElectraConfig:
    """An ElectraConfig from transformers' config.json; `overrides` set the fields transformers
    does not fix (dtype, attention_impl, dropout rates, ...)."""
    model_type = hf_config.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise ValueError(f"config.json: model_type={model_type!r} is not {MODEL_TYPE!r}")
    act = hf_config.get("hidden_act", "gelu")
    if act not in bert_hf._ACT_FROM_HF:
        raise ValueError(
            f"config.json: hidden_act={act!r} is not supported; "
            f"valid: {sorted(bert_hf._ACT_FROM_HF)}"
        )
    position_type = hf_config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(
            f"config.json: position_embedding_type={position_type!r} is not supported; valid: "
            "'absolute'"
        )
    if hf_config.get("is_decoder"):
        raise ValueError(
            "config.json: is_decoder=true is not supported: ELECTRA is read as an encoder"
        )

    def get(key):
        return int(hf_config.get(key, HF_DEFAULTS[key]))

    fields = dict(
        vocab_size=get("vocab_size"),
        embedding_size=get("embedding_size"),
        hidden_size=get("hidden_size"),
        num_layers=get("num_hidden_layers"),
        num_heads=get("num_attention_heads"),
        intermediate_size=get("intermediate_size"),
        max_position_embeddings=get("max_position_embeddings"),
        type_vocab_size=get("type_vocab_size"),
        hidden_dropout=float(hf_config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(hf_config.get("attention_probs_dropout_prob", 0.1)),
        layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-12)),
        initializer_range=float(hf_config.get("initializer_range", 0.02)),
        hidden_act=bert_hf._ACT_FROM_HF[act],
    )
    if hf_config.get("classifier_dropout") is not None:
        fields["classifier_dropout"] = float(hf_config["classifier_dropout"])
    valid = {f.name for f in dataclasses.fields(ElectraConfig)} - set(ARCHITECTURE_FIELDS)
    for key in overrides:
        if key not in valid:
            reason = "is fixed by the checkpoint" if key in ARCHITECTURE_FIELDS else "is unknown"
            raise ValueError(
                f"override {key}={overrides[key]!r} {reason}; overridable: {sorted(valid)}"
            )
    return ElectraConfig(**{**fields, **overrides})


def config_to_hf(config: ElectraConfig, architecture: str) -> dict[str, Any]:
    """transformers' config.json for `config` as the class `architecture`."""
    hf_config = {
        "architectures": [architecture],
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "embedding_size": config.embedding_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": bert_hf._ACT_TO_HF[config.hidden_act],
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "classifier_dropout": config.classifier_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "dtype": str(np.dtype(config.param_dtype)),
    }
    return hf_config


# ---------------------------------------------------------------------------------------------
# The tensor map


def _spec(hf_name, path, hf_shape, shape=None, transpose=False, group=CORE) -> TensorSpec:
    return TensorSpec(
        hf_name, tuple(path), tuple(hf_shape), tuple(shape or hf_shape), transpose, group
    )


def _renamed(specs: list[TensorSpec], start: str) -> list[TensorSpec]:
    """bertjax.storage.hf's BERT specs under `start`, named as ElectraModel's."""
    return [
        dataclasses.replace(s, hf_name=HF_PREFIX + s.hf_name.removeprefix("bert."), group=CORE)
        for s in specs
        if s.hf_name.startswith(start)
    ]


def encoder_specs(config: ElectraConfig) -> list[TensorSpec]:
    """ElectraModel's tensors ("electra."-prefixed), in transformers' order."""
    specs = _renamed(bert_hf.tensor_specs(config.embedding), "bert.embeddings.")
    e, h = config.embedding_size, config.hidden_size
    if e != h:
        specs += family_lib.dense_tensors(
            HF_PREFIX + "embeddings_project", (ENCODER, "embeddings_project"), e, h, CORE
        )
    return specs + _renamed(bert_hf.tensor_specs(config.bert), "bert.encoder.")


def pretraining_specs(config: ElectraConfig) -> list[TensorSpec]:
    """Every tensor of ElectraPreTraining's tree: the encoder, the pooler (no pretraining class
    has it: always fresh), the generator's and the discriminator's heads."""
    e, h, v = config.embedding_size, config.hidden_size, config.vocab_size
    mlm = (MLM_HEAD,)
    replaced = capability.REPLACED_TOKENS
    return [
        *encoder_specs(config),
        *family_lib.dense_tensors("classifier.dense", (ENCODER, POOLER), h, h, POOLER),
        *family_lib.dense_tensors(
            "generator_predictions.dense", (*mlm, "transform"), h, e, MLM_HEAD
        ),
        _spec(
            "generator_predictions.LayerNorm.weight",
            (*mlm, "layer_norm", "scale"),
            (e,),
            group=MLM_HEAD,
        ),
        _spec(
            "generator_predictions.LayerNorm.bias",
            (*mlm, "layer_norm", "bias"),
            (e,),
            group=MLM_HEAD,
        ),
        _spec("generator_lm_head.bias", (*mlm, "output_bias"), (v,), group=MLM_HEAD),
        *head_tensors(
            config, replaced.param, replaced.outputs, replaced.reads, replaced.task_class
        ),
    ]


def head_tensors(
    config: ElectraConfig, name: str, outputs: int, reads: str, task_class: str = ""
) -> tuple[TensorSpec, ...]:
    """The tensor map of an ELECTRA task head. A sequence head is transformers'
    ElectraClassificationHead, two layers: <name>.dense [h, h], kept in the encoder's tree as
    its "pooler" (every ELECTRA tree holds it there), and <name>.out_proj [outputs, h], the
    head's own parameters. A token or span head is one layer, <name> [outputs, h].
    ElectraForPreTraining's (capability.REPLACED_TOKENS) is ElectraDiscriminatorPredictions:
    discriminator_predictions.dense [h, h] and .dense_prediction [outputs, h]."""
    h = config.hidden_size
    if task_class == capability.REPLACED_TOKENS.task_class:
        return (
            *family_lib.dense_tensors(f"{HF_DISCRIMINATOR}.dense", (name, "dense"), h, h, name),
            *family_lib.dense_tensors(
                f"{HF_DISCRIMINATOR}.dense_prediction", (name, "dense_prediction"), h, outputs, name
            ),
        )
    if reads == capability.POOLED:
        return (
            *family_lib.dense_tensors(f"{name}.dense", (ENCODER, POOLER), h, h, POOLER),
            *family_lib.dense_tensors(f"{name}.out_proj", (name,), h, outputs, name),
        )
    return family_lib.dense_tensors(name, (name,), h, outputs, name)


def head_specs(config: ElectraConfig, head: TransformersHead) -> list[TensorSpec]:
    """Every tensor of a fine-tuned model's tree in its transformers class: the encoder and
    the head's (`head_tensors`). A token or span class has no <name>.dense: the pooler the
    tree holds anyway is listed under that name, so that reading makes it fresh."""
    h = config.hidden_size
    layers = head_tensors(config, head.param, head.outputs, head.reads)
    pooler = []
    if all(spec.group != POOLER for spec in layers):
        pooler = family_lib.dense_tensors(f"{head.param}.dense", (ENCODER, POOLER), h, h, POOLER)
    return [*encoder_specs(config), *pooler, *layers]


def transformers_head(head) -> TransformersHead:
    th = capability.of(head).transformers_head(head)
    if th is None:
        raise ValueError(
            f"a {head.task} model is not a transformers ELECTRA class; Model.save_hf writes it "
            "in its own format"
        )
    return th


# ---------------------------------------------------------------------------------------------
# Reading


def _canonical(tensors: Mapping[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """Tensors under their ElectraFor* names, without buffers and the tied decoder (checked)."""
    found = {}
    for name, array in tensors.items():
        if name.split(".", 1)[0] in _MODEL_MODULES:  # an ElectraModel directory: no prefix
            name = HF_PREFIX + name
        if name not in _BUFFERS:
            found[name] = np.asarray(array)
    if TIED_DECODER in found:
        decoder = found.pop(TIED_DECODER)
        words = found.get(WORD_EMBEDDINGS)
        if words is not None and not np.array_equal(decoder, words):
            raise ValueError(
                f"{source}: tensor {TIED_DECODER!r} differs from {WORD_EMBEDDINGS!r}; an untied "
                "generator decoder is not supported (bertjax ties it to the word embeddings)"
            )
    return found


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init_selected(config: ElectraConfig, paths: tuple[tuple[str, ...], ...], key: jax.Array):
    # Returning only the selected leaves lets XLA drop the rest of the init.
    params = nn.meta.unbox(electra_model.pretraining_init(config)(key))
    return [hf._get(params, path) for path in paths]


def fresh_params(config: ElectraConfig, paths: Sequence[tuple[str, ...]], seed: int = 0):
    """The parameters at `paths` as ElectraPreTraining's own init makes them (host arrays)."""
    plain = dataclasses.replace(config, scan_layers=False, remat_policy="none")
    values = _init_selected(plain, tuple(paths), jax.random.key(seed))
    return {path: np.asarray(value) for path, value in zip(paths, values)}


def read(
    directory: str | os.PathLike,
    hf_config: Mapping[str, Any],
    *,
    pretraining_heads: bool = True,
    **overrides,
):
    """Reads an ELECTRA transformers directory: (config, params, head or None, the groups the
    files did not have, freshly initialised)."""
    directory = fs.path(directory)
    config = config_from_hf(hf_config, **{"dtype": "float32", **overrides})
    head = capability.head_from_transformers(hf_config, CLASS_PREFIX)
    th = None if head is None else transformers_head(head)
    if th is None:
        specs = pretraining_specs(config)
        required = {CORE}
    else:
        specs = head_specs(config, th)
        # Every layer of the head (both of a sequence head's).
        layers = head_tensors(config, th.param, th.outputs, th.reads)
        required = {CORE} | {spec.group for spec in layers}
    tensors, source = hf.read_weights(directory)
    found = _canonical(tensors, source)
    by_name = {s.hf_name: s for s in specs}
    unexpected = sorted(set(found) - set(by_name))
    if unexpected:
        raise ValueError(
            f"{source}: unexpected tensor(s) {hf.name_list(unexpected)} for an ELECTRA with "
            f"{config.num_layers} layers"
            + ("" if th is None else f" as {CLASS_PREFIX}{th.task_class}")
        )
    dtype = np.dtype(config.param_dtype)
    flat, missing = hf.match_tensors(
        specs,
        found,
        source,
        required=required,
        unwanted=() if pretraining_heads else PRETRAINING_HEADS,
        dtype=dtype,
    )
    if missing:
        paths = [s.path for s in specs if s.group in missing]
        for path, value in fresh_params(config, paths).items():
            flat[path] = value.astype(dtype)
        # No pretraining class has the classification head's trunk: not worth a warning there.
        noted = [g for g in missing if th is not None or g != POOLER]
        if noted:
            logger.warning("%s: no tensors for %s; freshly initialised", source, ", ".join(noted))
    params = hf.unflatten_tree(flat)
    if config.scan_layers:  # back to host arrays: stack_layers stacks with jnp
        params = jax.tree.map(np.asarray, model_lib.stack_layers(params, config.num_layers))
    return config, params, head, tuple(sorted(missing))


# ---------------------------------------------------------------------------------------------
# Writing


def _plain(config: ElectraConfig, params: Any) -> dict:
    params = nn.meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    if config.scan_layers:
        params = model_lib.unstack_layers(params, config.num_layers)
    return params


def pretraining_architecture(untrained: Sequence[str]) -> str:
    """The transformers class of a head-less model whose groups `untrained` never trained:
    the discriminator (ElectraForPreTraining, ELECTRA's product), else the generator
    (ElectraForMaskedLM), else the encoder alone (ElectraModel)."""
    if DISCRIMINATOR_HEAD not in untrained:
        return "ElectraForPreTraining"
    if MLM_HEAD not in untrained:
        return "ElectraForMaskedLM"
    return "ElectraModel"


def files(
    config: ElectraConfig, params: Any, head: Any = None, untrained: Sequence[str] = ()
) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json, tensors) of a model: the class of `head`, or for a head-less one the
    class `pretraining_architecture` picks."""
    unknown = sorted(set(untrained) - {POOLER, *PRETRAINING_HEADS})
    if unknown:
        raise ValueError(
            f"untrained={unknown} is invalid: valid groups are {[POOLER, *PRETRAINING_HEADS]}"
        )
    params = _plain(config, params)
    if head is not None:
        th = transformers_head(head)
        architecture = CLASS_PREFIX + th.task_class
        specs = [*encoder_specs(config), *head_tensors(config, th.param, th.outputs, th.reads)]
        hf_config = config_to_hf(config, architecture)
        hf_config.update(th.config)
        if "id2label" not in th.config:  # transformers' num_labels: the projection's width
            hf_config["num_labels"] = th.outputs
        return hf_config, hf.tensors_from(specs, params)
    architecture = pretraining_architecture(untrained)
    if architecture == "ElectraForPreTraining" and MLM_HEAD not in untrained:
        logger.warning(
            "the masked-LM (generator) head is left out: transformers' ElectraForPreTraining "
            "holds the discriminator's head alone"
        )
    group = {"ElectraForPreTraining": DISCRIMINATOR_HEAD, "ElectraForMaskedLM": MLM_HEAD}
    groups = {CORE, group.get(architecture, CORE)}
    specs = [s for s in pretraining_specs(config) if s.group in groups]
    if architecture == "ElectraModel":  # its own names carry no prefix
        specs = [dataclasses.replace(s, hf_name=s.hf_name.removeprefix(HF_PREFIX)) for s in specs]
    return config_to_hf(config, architecture), hf.tensors_from(specs, params)


def encoder_files(config: ElectraConfig, params: Any) -> tuple[dict, dict]:
    """(config.json, tensors) of params["bert"] (any task model's tree) as ElectraModel."""
    params = _plain(config, params)
    if ENCODER not in params:
        raise ValueError(f"params hold {sorted(params)}; expected the encoder under {ENCODER!r}")
    specs = [
        dataclasses.replace(s, hf_name=s.hf_name.removeprefix(HF_PREFIX))
        for s in encoder_specs(config)
    ]
    return config_to_hf(config, "ElectraModel"), hf.tensors_from(specs, {ENCODER: params[ENCODER]})


def write(
    config: ElectraConfig,
    params: Any,
    directory: str | os.PathLike,
    *,
    tokenizer: Any = None,
    head: Any = None,
    untrained: Sequence[str] = (),
) -> None:
    """Writes a transformers directory (config.json, model.safetensors, tokenizer files)."""
    hf.require_safetensors()
    if tokenizer is not None:
        check_vocab(config, tokenizer, f"saving to {directory}")
    hf_config, tensors = files(config, params, head, untrained)
    dtype = hf.single_dtype(tensors.values())
    if dtype is not None:
        hf_config["dtype"] = dtype
    with hf.staged(fs.path(directory)) as staging:
        hf.write_json(staging / hf.CONFIG_NAME, hf_config)
        hf.safetensors_numpy.save_file(
            tensors, staging / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"}
        )
        if tokenizer is not None:
            tokenizer.save_hf(staging, model_max_length=config.max_position_embeddings)
