"""The parity tests of test_finetune_hf.py (tests/unit/), with the torch helpers they share
with tests/integration/test_finetune_hf_runs.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import bertjax
from bertjax.encoders.bert import hf as bert_hf
from bertjax.tasks import labels as labels_capability
from bertjax.tasks.labels import model as label_heads
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.finetune_hf import (
    ATOL,
    CONFIG,
    HEADS,
    IDS,
    MASK,
    SEGMENTS,
    our_logits,
    random_params,
)
from tests.helpers.finetune_hf_torch import HF_CLASSES, assert_predicts_as_transformers
from tests.helpers.transformers_config import transformers_bert


def torch_logits(model) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(IDS, dtype=torch.long),
            token_type_ids=torch.tensor(SEGMENTS, dtype=torch.long),
            attention_mask=torch.tensor(MASK, dtype=torch.long),
        )
    return out.logits.numpy()


@pytest.mark.parametrize("name", list(HEADS))
def test_exported_heads_load_in_transformers_with_equal_logits(tmp_path, name):
    head = HEADS[name]
    params = random_params(head, seed=1)
    bert_hf.save(CONFIG, params, tmp_path, head=head)
    cls = HF_CLASSES.get(head.task, transformers.BertForSequenceClassification)
    model, info = cls.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"]
    config = model.config
    assert config.id2label == dict(enumerate(head.labels))
    assert config.label2id == {label: i for i, label in enumerate(head.labels)}
    if head.task != label_heads.TOKEN_CLASSIFICATION:
        assert config.problem_type == labels_capability.HF_PROBLEM_TYPES[head.task]
    model.eval()
    ours, theirs = our_logits(head, params), torch_logits(model)
    if head.token_level:  # padding positions compute garbage on both sides: compare the rest
        ours, theirs = ours[MASK == 1], theirs[MASK == 1]
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["classification", "token_classification", "regression"])
def test_transformers_heads_import_with_equal_logits(tmp_path, name):
    head = HEADS[name]
    cls = HF_CLASSES.get(head.task, transformers.BertForSequenceClassification)
    hf_config = transformers_bert(
        CONFIG, id2label=dict(enumerate(head.labels)), attn_implementation="eager"
    )
    if head.task == label_heads.REGRESSION:
        hf_config.problem_type = None  # one label and no problem_type: transformers' regression
    torch.manual_seed(0)
    model = cls(hf_config).eval()
    with torch.no_grad():  # every parameter random, so that a swapped bias or scale shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(tmp_path)

    config, params, report = bert_hf.load_with_report(tmp_path)
    assert report.head == head
    assert set(params) == {"bert", "classifier"}
    if head.token_level:  # BertForTokenClassification has no pooler: bertjax starts one
        assert report.initialized == ("bert/pooler/kernel", "bert/pooler/bias")
    else:
        assert report.initialized == ()
    ours, theirs = our_logits(head, jax.tree.map(jnp.asarray, params)), torch_logits(model)
    if head.token_level:
        ours, theirs = ours[MASK == 1], theirs[MASK == 1]
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


def test_an_exported_classifier_predicts_as_transformers_does(tmp_path):
    words = [f"w{i}" for i in range(99 - 5)]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(vocab)
    head = HEADS["classification"]
    bert_hf.save(CONFIG, random_params(head, seed=4), tmp_path / "export", tokenizer, head=head)

    model = bertjax.Model.load(tmp_path / "export")
    texts, pairs = ["w1 w2 w3", "w40 w7"], ["w5 w6", "w8 w9 w10 w11"]
    predictions = model.predict(texts, pairs)
    assert_predicts_as_transformers(tmp_path / "export", predictions, texts, pairs)
