"""The parity tests of test_qa_task.py (tests/unit/), with its helpers."""

import numpy as np
import pytest
import torch
import transformers

from bertjax import Model
from bertjax.tasks.qa import squad as qa
from bertjax.tasks.qa.answer import window_logits
from tests.helpers.qa_task import ATOL, random_export
from tests.helpers.question_answering import TOKENIZER, qa_head


def test_model_answer_and_save_hf_match_transformers(tmp_path):
    """Model.answer on a BertForQuestionAnswering directory, then save_hf: transformers'
    logits equal ours, and the answer equals the pipeline's formula computed from
    transformers' own logits (transformers 5.x here has no question-answering pipeline)."""
    model = Model.load(random_export(tmp_path / "in", seed=3))
    assert model.head == qa_head()
    model.save_hf(tmp_path / "out")
    theirs = transformers.BertForQuestionAnswering.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    context = "w1 w2 w3 w4 w5"
    question = "the w3"
    features = qa.make_features(
        [qa.QAExample("0", question, context, ())],
        TOKENIZER,
        qa.QASettings(max_seq_length=16, doc_stride=8, max_query_length=4),
        training=False,
    )
    ours = window_logits(model, features)
    with torch.no_grad():
        out = theirs(
            input_ids=torch.tensor(features.input_ids, dtype=torch.long),
            token_type_ids=torch.tensor(features.segment_ids, dtype=torch.long),
            attention_mask=torch.tensor(features.input_mask, dtype=torch.long),
        )
    mask = features.input_mask == 1
    np.testing.assert_allclose(ours[0][mask], out.start_logits.numpy()[mask], atol=ATOL)
    np.testing.assert_allclose(ours[1][mask], out.end_logits.numpy()[mask], atol=ATOL)
    # The pipeline's formula on transformers' logits: softmax over [CLS] and the context,
    # score p(start) * p(end), start <= end < start + 15.
    start, end = out.start_logits.numpy()[0], out.end_logits.numpy()[0]
    context_tokens = np.flatnonzero(features.offsets[0, :, 0] != qa.NO_OFFSET)
    keep = np.concatenate([[0], context_tokens])
    p_start = np.exp(start[keep] - start[keep].max())
    p_start /= p_start.sum()
    p_end = np.exp(end[keep] - end[keep].max())
    p_end /= p_end.sum()
    best = max(
        (p_start[i] * p_end[j], s, e)
        for i, s in enumerate(context_tokens, 1)
        for j, e in enumerate(context_tokens, 1)
        if s <= e < s + 15
    )
    got = model.answer(question, context)
    assert got["start"] == features.offsets[0, best[1], 0]
    assert got["end"] == features.offsets[0, best[2], 1]
    assert got["answer"] == context[got["start"] : got["end"]]
    assert got["score"] == pytest.approx(best[0], rel=1e-3)
    several = model.answer([question, "the w5"], context, top_k=2)
    assert len(several) == 2 and all(len(answers) == 2 for answers in several)
    first = several[0][0]
    assert (first["start"], first["end"], first["answer"]) == (
        got["start"],
        got["end"],
        got["answer"],
    )
    assert first["score"] == pytest.approx(got["score"], rel=1e-5)  # batched with another row
