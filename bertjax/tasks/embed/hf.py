"""sentence-transformers directories in and out: an embedding model in the ecosystem's format.

`save` writes what `sentence_transformers.SentenceTransformer(path)` loads as is:

  modules.json                      the pipeline: Transformer -> Pooling (-> Normalize)
  config.json, model.safetensors    a transformers BertModel or ModernBertModel (the encoder)
  tokenizer.json and the rest       the tokenizer (bertjax.text.tokenizer.Tokenizer.save_hf)
  sentence_bert_config.json         max_seq_length
  1_Pooling/config.json             the pooling mode
  2_Normalize/                      present when the vectors are normalised
  config_sentence_transformers.json cosine similarity

`load` reads such a directory back (written here or by sentence-transformers, its
Transformer module at the root or in a subfolder such as 0_Transformer) into its encoder
family's config, the bi-encoder's parameters ({"bert": ...}), the tokenizer and the
EmbeddingSpec (pooling, normalisation, max_seq_length). The pooling config is read in both
the classic layout (pooling_mode_mean_tokens: true, ...) and the newer one (pooling_mode:
"mean"); the classic one is written, which every sentence-transformers release reads.

The directory may be local or `gs://` (bertjax.storage.fs). On GCS, whose directories are only name
prefixes, an empty 2_Normalize/ leaves no object: modules.json alone says the vectors are
normalised, which is what `load` reads.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from bertjax import encoders
from bertjax.capability import ENCODER
from bertjax.storage import fs, hf
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.text.directory import load_tokenizer
from bertjax.text.tokenizer import HF_TOKENIZER_CONFIG_FILE, Tokenizer, check_vocab

MODULES_FILE = "modules.json"
SBERT_CONFIG_FILE = "sentence_bert_config.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
# The module types as sentence-transformers has always accepted them in modules.json.
TRANSFORMER_TYPE = "sentence_transformers.models.Transformer"
POOLING_TYPE = "sentence_transformers.models.Pooling"
NORMALIZE_TYPE = "sentence_transformers.models.Normalize"
# The classic pooling config's flag per mode (sentence-transformers' Pooling module).
_POOLING_FLAGS = {
    embedding.CLS: "pooling_mode_cls_token",
    embedding.MAX: "pooling_mode_max_tokens",
    embedding.MEAN: "pooling_mode_mean_tokens",
}
_OTHER_POOLING_FLAGS = (
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


class SentenceModel(NamedTuple):
    """What `load` reads: enough for a notebook Model of an embedding head."""

    config: Any  # an encoder family's config
    params: dict  # {"bert": the encoder's tree}, numpy
    tokenizer: Tokenizer
    spec: EmbeddingSpec


def _write_json(path: pathlib.Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def save(
    directory: str | os.PathLike,
    config: Any,
    params: Mapping,
    tokenizer: Tokenizer,
    spec: EmbeddingSpec,
) -> None:
    """Writes a sentence-transformers directory of this encoder, tokenizer and spec.

    `config` is any encoder family's; `params` holds "bert" (a BiEncoder's tree, boxed or
    not, a fine-tuned model's, or a pretraining model's); only the encoder is written, as the
    family's transformers <prefix>Model (BertModel with its pooler, ModernBertModel).
    """
    hf.require_safetensors()
    spec.check(config)
    check_vocab(config, tokenizer, f"saving to {directory}")
    hf_config, tensors = encoders.family_of(config).encoder_files(config, params)

    out = fs.path(directory)
    # Written whole beside the directory, then moved in (uploaded, on GCS): a failure
    # part-way leaves a previous export as it was.
    with hf.staged(out) as staging:
        _write(staging, hf_config, tensors, tokenizer, spec, config.hidden_size)
    if not spec.normalize:  # a previous export's Normalize module, no longer listed
        for stale in (out / NORMALIZE_DIR).glob("*"):
            with fs.errors(stale, "delete"):
                stale.unlink()
        if not fs.is_remote(out):
            shutil.rmtree(out / NORMALIZE_DIR, ignore_errors=True)


def _write(
    out: pathlib.Path,
    hf_config: dict[str, Any],
    tensors: dict[str, np.ndarray],
    tokenizer: Tokenizer,
    spec: EmbeddingSpec,
    hidden_size: int,
) -> None:
    """Writes the directory's files into a new local directory."""
    _write_json(out / hf.CONFIG_NAME, hf_config)
    hf.safetensors_numpy.save_file(tensors, out / hf.SAFE_WEIGHTS_NAME, metadata={"format": "pt"})
    tokenizer.save_hf(out, model_max_length=spec.max_seq_length)
    _write_json(out / SBERT_CONFIG_FILE, {"max_seq_length": spec.max_seq_length})

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_TYPE},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": POOLING_TYPE},
    ]
    pooling = {"word_embedding_dimension": hidden_size}
    pooling.update({flag: mode == spec.pooling for mode, flag in _POOLING_FLAGS.items()})
    pooling.update({flag: False for flag in _OTHER_POOLING_FLAGS})
    pooling["include_prompt"] = True
    (out / POOLING_DIR).mkdir(exist_ok=True)
    _write_json(out / POOLING_DIR / hf.CONFIG_NAME, pooling)
    if spec.normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": NORMALIZE_TYPE})
        (out / NORMALIZE_DIR).mkdir(exist_ok=True)
    _write_json(out / MODULES_FILE, modules)
    _write_json(
        out / ST_CONFIG_FILE,
        {"similarity_fn_name": "cosine", "prompts": {}, "default_prompt_name": None},
    )


def is_sentence_transformers_dir(path: str | os.PathLike) -> bool:
    """Whether path is a sentence-transformers directory (it has modules.json)."""
    return fs.kind(fs.path(path) / MODULES_FILE) == "file"


def _kind(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1]


def _pooling_mode(config: Mapping[str, Any], source: fs.AnyPath) -> str:
    """The one pooling mode of a Pooling module's config, classic or newer layout."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        flags = {**_POOLING_FLAGS, **{f: f for f in _OTHER_POOLING_FLAGS}}
        modes = [mode for mode, flag in flags.items() if config.get(flag)] or [embedding.MEAN]
    if len(modes) != 1 or modes[0] not in embedding.POOLINGS:
        raise ValueError(
            f"{source}: pooling {modes} is not supported; bertjax pools with exactly one of "
            f"{embedding.POOLINGS}"
        )
    return modes[0]


def _read_json(path: fs.AnyPath) -> Any:
    return json.loads(fs.read_text(path))


def load(path: str | os.PathLike, **overrides) -> SentenceModel:
    """Reads a sentence-transformers directory: Transformer (BERT or ModernBERT), Pooling,
    optional Normalize.

    `overrides` set non-architecture config fields (dtype, ...), as
    bertjax.encoders.read_transformers. Other modules (Dense, LayerNorm, ...) are refused by
    name.
    """
    root = fs.path(path)
    modules_file = root / MODULES_FILE
    if fs.kind(modules_file) != "file":
        raise FileNotFoundError(f"{root}: no {MODULES_FILE}; not a sentence-transformers directory")
    modules = sorted(_read_json(modules_file), key=lambda m: int(m.get("idx", 0)))
    kinds = [_kind(m["type"]) for m in modules]
    supported = ["Transformer", "Pooling", "Normalize"]
    if kinds not in (supported[:2], supported):
        raise ValueError(
            f"{modules_file}: modules {kinds} are not supported; bertjax reads Transformer, "
            "Pooling and an optional Normalize, in that order"
        )
    transformer_dir = root / modules[0].get("path", "")
    pooling_dir = root / modules[1].get("path", "")

    sbert_file = transformer_dir / SBERT_CONFIG_FILE
    sbert_config = _read_json(sbert_file) if sbert_file.is_file() else {}
    tokenizer = load_tokenizer(transformer_dir)
    if sbert_config.get("do_lower_case") and not getattr(tokenizer, "lowercase", False):
        raise ValueError(
            f"{sbert_file}: do_lower_case=true over a tokenizer that keeps case is not "
            "supported; lowercase the texts before embedding them"
        )
    hf_logger = logging.getLogger(hf.__name__)
    level = hf_logger.level
    hf_logger.setLevel(logging.ERROR)  # the pretraining heads it lacks are not wanted here
    try:
        # The encoder family of config.json's model_type reads it (BertModel, ModernBertModel).
        config, params, _, _ = encoders.read_transformers(transformer_dir, **overrides)
    finally:
        hf_logger.setLevel(level)

    pooling_config = _read_json(pooling_dir / hf.CONFIG_NAME)
    width = pooling_config.get(
        "embedding_dimension", pooling_config.get("word_embedding_dimension")
    )
    if width is not None and int(width) != config.hidden_size:
        raise ValueError(
            f"{pooling_dir / hf.CONFIG_NAME}: embedding dimension {width} differs from the "
            f"model's hidden_size={config.hidden_size}"
        )
    max_seq_length = sbert_config.get("max_seq_length")
    if max_seq_length is None:
        # Newer sentence-transformers keep it in the tokenizer's model_max_length, capped
        # at the model's positions when loading.
        tokenizer_file = transformer_dir / HF_TOKENIZER_CONFIG_FILE
        tokenizer_config = _read_json(tokenizer_file) if tokenizer_file.is_file() else {}
        max_seq_length = tokenizer_config.get("model_max_length", config.max_position_embeddings)
    max_seq_length = int(min(max_seq_length, config.max_position_embeddings))
    spec = EmbeddingSpec(
        pooling=_pooling_mode(pooling_config, pooling_dir / hf.CONFIG_NAME),
        normalize=len(modules) == 3,
        max_seq_length=max_seq_length,
    )
    return SentenceModel(config, {ENCODER: params[ENCODER]}, tokenizer, spec)
