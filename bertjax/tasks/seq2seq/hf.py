"""transformers' EncoderDecoderModel in and out: a BertModel encoder and a BertLMHeadModel
decoder (is_decoder, add_cross_attention), as bertjax.tasks.seq2seq.model builds them.

The BERT tensors themselves map as bertjax.storage.hf maps them; this module adds the decoder's
prefixes, its cross-attention and the EncoderDecoderConfig.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import numpy as np

from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.bert.config import ARCHITECTURE_FIELDS
from bertjax.storage import fs, hf
from bertjax.tasks.seq2seq import model as seq2seq_lib
from bertjax.text.tokenizer import Tokenizer, check_vocab

ENCODER_DECODER_ARCHITECTURE = "EncoderDecoderModel"
GENERATION_CONFIG_NAME = "generation_config.json"
_DECODER_TIED_WEIGHT = "decoder." + bert_hf.TIED_DECODER_WEIGHT
_DECODER_TIED_BIAS = "decoder." + bert_hf.TIED_DECODER_BIAS


def seq2seq_specs(config: seq2seq_lib.Seq2SeqConfig) -> list[hf.TensorSpec]:
    """Every tensor of transformers' EncoderDecoderModel for `config` and its bertjax path.

    The encoder's are BertModel's ("encoder.*", pooler included); the decoder's are
    BertLMHeadModel's ("decoder.bert.*" without a pooler, each layer's "crossattention",
    "decoder.cls.predictions.*"). The tied decoder weight and bias are not listed.
    """
    specs = []
    for spec in bert_hf.tensor_specs(config.bert):
        if spec.group in (hf.CORE, hf.SINUSOIDAL, hf.POOLER):
            specs.append(dataclasses.replace(spec, hf_name="encoder." + spec.hf_name[5:]))
    for spec in bert_hf.tensor_specs(config.bert):
        if spec.group in (hf.CORE, hf.SINUSOIDAL):
            rest = spec.path[1:]
            if rest[0] == "encoder":  # ("encoder", "layer_i", ...) -> ("layer_i", ...)
                rest = rest[1:]
            decoder_spec = dataclasses.replace(
                spec, hf_name="decoder." + spec.hf_name, path=("decoder", *rest)
            )
            specs.append(decoder_spec)
            if len(rest) > 1 and rest[1] == "attention":
                specs.append(
                    dataclasses.replace(
                        decoder_spec,
                        hf_name=decoder_spec.hf_name.replace(".attention.", ".crossattention."),
                        path=("decoder", rest[0], "cross_attention", *rest[2:]),
                    )
                )
        elif spec.group == hf.MLM_HEAD:
            specs.append(
                dataclasses.replace(
                    spec, hf_name="decoder." + spec.hf_name, path=("decoder", *spec.path)
                )
            )
    return specs


def seq2seq_config_to_hf(config: seq2seq_lib.Seq2SeqConfig) -> dict[str, Any]:
    """transformers' EncoderDecoderConfig dict (config.json) for `config`."""
    special = {
        "decoder_start_token_id": config.decoder_start_id,
        "eos_token_id": config.eos_id,
        "pad_token_id": seq2seq_lib.PAD_ID,
    }
    encoder = {**bert_hf.config_to_hf(config.bert), "architectures": ["BertModel"]}
    decoder = {
        **bert_hf.config_to_hf(config.bert),
        "architectures": ["BertLMHeadModel"],
        "is_decoder": True,
        "add_cross_attention": True,
        **special,
    }
    return {
        "architectures": [ENCODER_DECODER_ARCHITECTURE],
        "model_type": "encoder-decoder",
        "is_encoder_decoder": True,
        "encoder": encoder,
        "decoder": decoder,
        "dtype": encoder["dtype"],
        **special,
    }


def seq2seq_config_from_hf(
    hf_config: Mapping[str, Any], init: str = seq2seq_lib.BERT2BERT, **overrides
) -> seq2seq_lib.Seq2SeqConfig:
    """A Seq2SeqConfig from an EncoderDecoderConfig dict with BERT on both sides.

    `overrides` set non-architecture BertConfig fields, as for `bert_hf.config_from_hf`.
    """
    if hf_config.get("model_type") != "encoder-decoder":
        raise ValueError(
            f"config.json: model_type={hf_config.get('model_type')!r} is not an encoder-decoder; "
            "valid: 'encoder-decoder'"
        )
    for side in ("encoder", "decoder"):
        if not isinstance(hf_config.get(side), Mapping):
            raise ValueError(f"config.json: missing the {side!r} config")
    encoder = bert_hf.config_from_hf(hf_config["encoder"], **overrides)
    decoder = bert_hf.config_from_hf(hf_config["decoder"], **overrides)
    different = [
        name for name in ARCHITECTURE_FIELDS if getattr(encoder, name) != getattr(decoder, name)
    ]
    if different:
        raise ValueError(
            f"config.json: encoder and decoder differ in {different}; bertjax's encoder-decoder "
            "needs one BERT architecture for both"
        )
    if not hf_config["decoder"].get("add_cross_attention", False):
        raise ValueError("config.json: the decoder has add_cross_attention=false; it must be true")
    special = {}
    for key in ("decoder_start_token_id", "eos_token_id"):
        value = hf_config.get(key, hf_config["decoder"].get(key))
        if value is None:
            raise ValueError(f"config.json: missing {key!r} (at the top level or the decoder's)")
        special[key] = int(value)
    return seq2seq_lib.Seq2SeqConfig(
        encoder,
        decoder_start_id=special["decoder_start_token_id"],
        eos_id=special["eos_token_id"],
        init=init,
    )


def save_seq2seq(
    config: seq2seq_lib.Seq2SeqConfig,
    params: Mapping,
    path: str | os.PathLike,
    tokenizer: Tokenizer | None = None,
) -> None:
    """Writes a directory that transformers.EncoderDecoderModel.from_pretrained loads:
    config.json, generation_config.json, model.safetensors and, given one, the tokenizer.

    `params` is the stored tree of bertjax.tasks.seq2seq.model (boxed or not); a bertshare model is
    written with the shared weights copied into the decoder.
    """
    hf.require_safetensors()
    if tokenizer is not None:
        check_vocab(config.bert, tokenizer, f"saving to {path}")
    params = nn.meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    params = seq2seq_lib.full_params(config, params)
    specs = seq2seq_specs(config)
    hf.refuse_unexpected(params, specs)
    table = model_lib.sinusoidal_table(config.bert.max_position_embeddings, config.bert.hidden_size)
    fixed = {hf.SINUSOIDAL: table.astype(np.dtype(config.bert.param_dtype))}
    tensors = hf.tensors_from(specs, params, fixed=fixed)
    hf_config = seq2seq_config_to_hf(config)
    generation = {
        key: hf_config[key] for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id")
    }
    with hf.staged(fs.path(path)) as staging:
        hf.write_json(staging / hf.CONFIG_NAME, hf_config)
        hf.write_json(staging / GENERATION_CONFIG_NAME, generation)
        hf.safetensors_numpy.save_file(
            tensors, staging / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"}
        )
        if tokenizer is not None:
            tokenizer.save_hf(staging, model_max_length=config.bert.max_position_embeddings)


def load_seq2seq(path: str | os.PathLike, **overrides) -> tuple[seq2seq_lib.Seq2SeqConfig, dict]:
    """Reads a transformers EncoderDecoderModel directory (BERT on both sides) into a
    Seq2SeqConfig (init bert2bert) and bertjax.tasks.seq2seq.model's params tree (numpy arrays)."""
    directory = fs.path(path)
    config_path = directory / hf.CONFIG_NAME
    if fs.kind(config_path) != "file":
        raise FileNotFoundError(
            f"{config_path}: missing; a transformers EncoderDecoderModel directory needs it"
        )
    config = seq2seq_config_from_hf(hf.read_config(config_path), **overrides)
    tensors, source = hf.read_weights(directory)
    tensors = dict(tensors)
    word_name = "decoder." + bert_hf.WORD_EMBEDDINGS
    bias_name = "decoder." + bert_hf.PREDICTION_BIAS
    for tied, twin in ((_DECODER_TIED_WEIGHT, word_name), (_DECODER_TIED_BIAS, bias_name)):
        if tied in tensors:
            copy = np.asarray(tensors.pop(tied))
            tensors.setdefault(twin, copy)
            if not np.array_equal(np.asarray(tensors[twin]), copy):
                raise ValueError(
                    f"{source}: tensor {tied!r} differs from {twin!r}; bertjax ties them"
                )
    specs = seq2seq_specs(config)
    unexpected = sorted(set(tensors) - {spec.hf_name for spec in specs})
    if unexpected:
        raise ValueError(f"{source}: unexpected tensor(s) {hf.name_list(unexpected)}")
    # Every tensor is required; config_from_hf gives learned positions, so none is fixed.
    flat, _ = hf.match_tensors(
        specs,
        {name: np.asarray(array) for name, array in tensors.items()},
        source,
        required={spec.group for spec in specs},
        unwanted=(),
        dtype=np.dtype(config.bert.param_dtype),
    )
    return config, hf.unflatten_tree(flat)
