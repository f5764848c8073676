"""What a work directory holds, whether an existing one fits a run, and `bertjax.load`.

A work directory (`--workdir`) is laid out as:

    corpus/            the built-in demo corpus, when no input was given
    data/              prepared instances and their tokenizer (unless data.dir points elsewhere)
    checkpoints/       Orbax step directories (params, opt_state, meta)
    tokenizer.model    a copy of the data's tokenizer, so the checkpoints open on their own
    metrics.jsonl      one JSON object per logged step
    tensorboard/       TensorBoard event files

Every other module takes these names from here.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from bertjax import checkpoint as checkpoint_lib
from bertjax.data.storage import TOKENIZER_FILE
from bertjax.model import ARCHITECTURE_FIELDS, BertConfig
from bertjax.tokenizer import Tokenizer

DATA_DIR = "data"
CORPUS_DIR = "corpus"
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
# The same file name as in a prepared data directory.
TOKENIZER_COPY = TOKENIZER_FILE


class IncompatibleCheckpointError(ValueError):
    """A checkpoint that does not fit the run's tokenizer or model; the message says how."""


def checkpoint_dir(path: str | os.PathLike) -> pathlib.Path:
    """The checkpoint directory of a workdir, or `path` itself when it is one already."""
    path = pathlib.Path(path)
    return path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path


def check_compatible(meta: dict, tokenizer: Tokenizer, model_config: BertConfig, what: str) -> None:
    """Fails, naming the difference, unless a checkpoint fits this run's tokenizer and model.

    Checked on the checkpoint's small meta item before any array is read, so a config
    mistake is reported as one rather than as an unreadable checkpoint.
    """
    if meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise IncompatibleCheckpointError(
            f"{what} was trained with tokenizer {meta['tokenizer_fingerprint'][:12]}, but the "
            f"run's data uses {tokenizer.fingerprint[:12]}; point config.data.dir at the data "
            "it was trained on"
        )
    source = meta["model_config"]
    # scan_layers changes how the layers are stored, so the saved arrays' shapes with it.
    for field in (*ARCHITECTURE_FIELDS, "scan_layers"):
        if source[field] != getattr(model_config, field):
            raise IncompatibleCheckpointError(
                f"{what} has a model with {field}={source[field]!r}, this run's config.model "
                f"gives {getattr(model_config, field)!r}"
            )


def load(workdir: str | os.PathLike, step: int | None = None) -> tuple[BertConfig, Any, Tokenizer]:
    """(config, params, tokenizer) of a run, from its latest (or the given) checkpoint.

    Reads the parameters only, never the optimizer state, and places them on this
    machine's first device whatever mesh they were saved from.
    """
    workdir = pathlib.Path(workdir)
    checkpoints = workdir / CHECKPOINT_DIR
    if not checkpoints.is_dir():
        raise FileNotFoundError(
            f"{workdir} has no {CHECKPOINT_DIR}/ directory: is it a bertjax work directory?"
        )
    _, params, meta = checkpoint_lib.restore_params(checkpoints, step=step)
    config = BertConfig.from_dict(meta["model_config"])
    tokenizer = Tokenizer.load(
        workdir / TOKENIZER_COPY, expected_fingerprint=meta["tokenizer_fingerprint"]
    )
    return config, params, tokenizer
