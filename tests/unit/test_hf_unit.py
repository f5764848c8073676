"""The unit tests of test_hf.py (tests/parity/), with the helpers both share."""

import json

import jax
import numpy as np
import pytest

from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert import model as model_lib
from bertjax.encoders.bert.config import BertConfig
from bertjax.storage import hf
from bertjax.text.directory import load_tokenizer
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.hf import (
    _random_params,
    _read_dir,
    sentencepiece,  # noqa: F401 (fixtures)
)
from tests.helpers.tokenizer import VARIED, write_wordpiece_vocab


def test_save_from_stacked_layers_writes_the_same_tensors(tmp_path):
    config = BertConfig.preset(
        "tiny", vocab_size=97, max_position_embeddings=24, hidden_act="gelu_tanh"
    )
    params = _random_params(config, seed=5)
    bert_hf.save(config, params, tmp_path / "flat")
    scanned = BertConfig.from_dict({**config.to_dict(), "scan_layers": True})
    bert_hf.save(scanned, model_lib.stack_layers(params, config.num_layers), tmp_path / "stacked")
    flat, stacked = _read_dir(tmp_path / "flat"), _read_dir(tmp_path / "stacked")
    assert flat.keys() == stacked.keys()
    for name in flat:
        np.testing.assert_array_equal(flat[name], stacked[name], err_msg=name)
    written = json.loads((tmp_path / "flat" / hf.CONFIG_NAME).read_text())
    assert written["hidden_act"] == "gelu_pytorch_tanh"
    assert written["architectures"] == ["BertForPreTraining"]


def test_save_refuses_wrong_params(tmp_path):
    config = BertConfig.preset("tiny", vocab_size=97, max_position_embeddings=24)
    params = _random_params(config, seed=9)
    wrong = jax.tree.map(lambda x: x, params)
    wrong["nsp_head"]["kernel"] = np.zeros((config.hidden_size, 3), np.float32)
    with pytest.raises(ValueError, match=r"'nsp_head/kernel' has shape"):
        bert_hf.save(config, wrong, tmp_path / "a")
    wrong = jax.tree.map(lambda x: x, params)
    del wrong["bert"]["pooler"]["bias"]
    with pytest.raises(ValueError, match=r"missing parameter 'bert/pooler/bias'"):
        bert_hf.save(config, wrong, tmp_path / "b")
    # Boxed params straight from init are accepted too.
    bert_hf.save(config, {"params": _random_params(config, seed=9, boxed=True)}, tmp_path / "c")
    bert_hf.save(config, params, tmp_path / "d")
    boxed, plain = _read_dir(tmp_path / "c"), _read_dir(tmp_path / "d")
    assert boxed.keys() == plain.keys()
    for name in boxed:
        np.testing.assert_array_equal(boxed[name], plain[name], err_msg=name)


def test_save_refuses_a_tokenizer_larger_than_the_vocabulary(tmp_path, sentencepiece):
    config = BertConfig.preset("tiny", vocab_size=97, max_position_embeddings=24)
    with pytest.raises(ValueError, match="400 pieces but the model's vocabulary has 97 rows"):
        bert_hf.save(config, _random_params(config, seed=11), tmp_path, tokenizer=sentencepiece)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written


def test_saving_another_kind_of_tokenizer_removes_the_stale_file(tmp_path, sentencepiece):
    sentencepiece.save_hf(tmp_path)
    write_wordpiece_vocab(tmp_path / "source" / "vocab.txt", VARIED * 5, lowercase=True)
    wordpiece = WordPieceTokenizer.from_vocab(tmp_path / "source" / "vocab.txt")
    wordpiece.save_hf(tmp_path)
    assert not (tmp_path / "tokenizer.model").exists()
    assert load_tokenizer(tmp_path).fingerprint == wordpiece.fingerprint
    sentencepiece.save_hf(tmp_path)
    assert not (tmp_path / "vocab.txt").exists()
    assert load_tokenizer(tmp_path).fingerprint == sentencepiece.fingerprint
