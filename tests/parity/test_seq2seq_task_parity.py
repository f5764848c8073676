"""The parity tests of test_seq2seq_task.py (tests/unit/), with its helpers."""

import json
import pathlib
import flax.linen as nn
import jax
import numpy as np
import pytest
import sacrebleu
import torch
import transformers
import bertjax
from bertjax import hf, rundir
from bertjax.finetune import loop
from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.model import BertConfig, BertForPreTraining
from bertjax.settings import ConfigError
from bertjax.tasks.seq2seq import hf as seq2seq_hf
from bertjax.tasks.seq2seq import model as s2s
from bertjax.tasks.seq2seq import task as s2s_task
from bertjax.tokenizer import WordPieceTokenizer
from configs import finetune as finetune_config
from test_seq2seq_task import (  # noqa: F401 (fixtures are used by name)
    EOS,
    START,
    exported,
)


def test_model_save_hf_writes_an_encoder_decoder(exported, tmp_path):
    model = bertjax.Model.load(exported)
    model.save_hf(tmp_path / "again")
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert written["model_type"] == "encoder-decoder"
    assert (written["decoder_start_token_id"], written["eos_token_id"]) == (START, EOS)
    first = transformers.EncoderDecoderModel.from_pretrained(exported).state_dict()
    second = transformers.EncoderDecoderModel.from_pretrained(tmp_path / "again").state_dict()
    for name, tensor in first.items():
        np.testing.assert_array_equal(second[name].numpy(), tensor.numpy(), err_msg=name)
