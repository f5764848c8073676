"""The integration tests of test_hf.py (tests/parity/), with its helpers."""

import copy
import functools
import json
import logging
import os
import pathlib
import subprocess
import sys
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import numpy as safetensors_numpy
from test_tokenizer import VARIED, training_sentences, write_wordpiece_vocab
from bertjax import hf
from bertjax import model as model_lib
from bertjax.finetune import loop as finetune_loop
from bertjax.model import BertConfig, BertForPreTraining
from bertjax.tokenizer import TokenizerSettings, WordPieceTokenizer, train_tokenizer


@pytest.mark.slow
def test_import_needs_neither_torch_nor_transformers():
    code = (
        "import sys, bertjax.hf; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
        "sorted(sys.modules)"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
