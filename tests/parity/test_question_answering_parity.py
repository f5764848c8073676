"""The parity tests of test_question_answering.py (tests/unit/), with its helpers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from bertjax.encoders.bert import hf as bert_hf
from tests.helpers.question_answering import (
    ATOL,
    CONFIG,
    IDS,
    MASK,
    SEGMENTS,
    our_logits,
    qa_head,
    random_params,
)
from tests.helpers.transformers_config import transformers_bert


def torch_logits(model):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(IDS, dtype=torch.long),
            token_type_ids=torch.tensor(SEGMENTS, dtype=torch.long),
            attention_mask=torch.tensor(MASK, dtype=torch.long),
        )
    return out.start_logits.numpy()[MASK == 1], out.end_logits.numpy()[MASK == 1]


def test_export_loads_in_transformers_with_equal_logits(tmp_path):
    params = random_params(seed=1)
    bert_hf.save(CONFIG, params, tmp_path, head=qa_head())
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "BertForQuestionAnswering"
    ]
    model, info = transformers.BertForQuestionAnswering.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"]
    for ours, theirs in zip(our_logits(params), torch_logits(model.eval())):
        np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


def test_transformers_model_imports_with_equal_logits(tmp_path):
    hf_config = transformers_bert(CONFIG, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertForQuestionAnswering(hf_config).eval()
    with torch.no_grad():  # every parameter random, so that a swapped bias or scale shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(tmp_path)
    config, params, report = bert_hf.load_with_report(tmp_path)
    assert report.head == qa_head()
    assert report.initialized == ("bert/pooler/kernel", "bert/pooler/bias")  # HF has none
    assert set(params) == {"bert", "qa_outputs"} and config == CONFIG
    for ours, theirs in zip(our_logits(jax.tree.map(jnp.asarray, params)), torch_logits(model)):
        np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)
    # And back out: the re-exported weights are the same tensors.
    bert_hf.save(config, params, tmp_path / "again", head=qa_head())
    again = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "again").eval()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], tensor, rtol=0, atol=0)
