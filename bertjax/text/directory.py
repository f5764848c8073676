"""The tokenizer of a transformers model directory (or of a bertjax export): which of its
files to read, and the settings tokenizer_config.json adds to a WordPiece vocab.txt."""

from __future__ import annotations

import io
import json
import os
from typing import Any

from bertjax.storage import fs
from bertjax.text.special_tokens import HF_SPECIAL_TOKENS
from bertjax.text.tokenizer import (
    HF_TOKENIZER_CONFIG_FILE,
    HF_TOKENIZER_FILE,
    SENTENCEPIECE_FILE,
    WORDPIECE_VOCAB_FILE,
    SentencePieceTokenizer,
    Tokenizer,
    WordPieceTokenizer,
    tokenizer_from_json,
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
