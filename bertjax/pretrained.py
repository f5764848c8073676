"""Open a training run's checkpoint anywhere: `bertjax.load(workdir)` in a notebook.

A work directory holds checkpoints/ (Orbax, one directory per step) and a copy of the
tokenizer under the same file name as in a prepared data directory.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from bertjax import checkpoint as checkpoint_lib
from bertjax.data.storage import TOKENIZER_FILE
from bertjax.model import BertConfig
from bertjax.tokenizer import Tokenizer

# The layout of a work directory, shared with the trainer that writes it.
CHECKPOINT_DIR = "checkpoints"


def load(workdir: str | os.PathLike, step: int | None = None) -> tuple[BertConfig, Any, Tokenizer]:
    """(config, params, tokenizer) of a run, from its latest (or the given) checkpoint.

    Reads the parameters only, never the optimizer state, and places them on this
    machine's first device whatever mesh they were saved from.
    """
    workdir = pathlib.Path(workdir)
    checkpoint_dir = workdir / CHECKPOINT_DIR
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(
            f"{workdir} has no {CHECKPOINT_DIR}/ directory: is it a bertjax work directory?"
        )
    _, params, meta = checkpoint_lib.restore_params(checkpoint_dir, step=step)
    config = BertConfig.from_dict(meta["model_config"])
    tokenizer = Tokenizer.load(
        workdir / TOKENIZER_FILE, expected_fingerprint=meta["tokenizer_fingerprint"]
    )
    return config, params, tokenizer
