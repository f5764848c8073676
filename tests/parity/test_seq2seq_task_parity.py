"""The parity tests of test_seq2seq_task.py (tests/unit/), with its helpers."""

import json

import numpy as np
import transformers

import bertjax
from tests.helpers.seq2seq_task import EOS, START, exported  # noqa: F401


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
