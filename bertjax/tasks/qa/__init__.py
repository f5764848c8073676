"""Extractive question answering (SQuAD v1.1 and v2.0).

    squad.py    reading SQuAD files, token offsets, google's windows
    model.py    the head and its loss (QuestionAnswering, qa_sums, QAObjective)
    decode.py   n-best decoding, the official prediction files
    metrics.py  the official SQuAD v1.1 / v2.0 scorer
    task.py     the fine-tuning task (config.task=question_answering, config.qa)
    answer.py   Model.answer, as transformers' question-answering pipeline answers
In transformers the model is <Family>ForQuestionAnswering (BERT's: qa_outputs [2, hidden], no
pooler).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from bertjax import capability
from bertjax.capability import HeadSpec, TransformersHead
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa.answer import answer
from bertjax.tasks.qa.task import QuestionAnsweringTask

# transformers' task class: <Family>ForQuestionAnswering.
HF_TASK_CLASS = "ForQuestionAnswering"


class QuestionAnswering(capability.Capability):
    """Start and end logits over the tokens: a dense "qa_outputs" [hidden, 2]."""

    tasks = (qa_model.TASK,)
    method = "answer"
    usage = 'answer("Who wrote it?", "the context ...")'
    head_param = qa_model.HEAD_NAME
    fine_tuning = {qa_model.TASK: QuestionAnsweringTask()}
    notebook = {"answer": answer}

    def check_head(self, head: HeadSpec) -> None:
        if head.labels != qa_model.HEAD_LABELS or head.options is not None:
            raise ValueError(
                f"a {qa_model.TASK} head has the labels {qa_model.HEAD_LABELS} and no options; got "
                f"{head.labels!r}"
            )

    def init(self, config, head: HeadSpec):
        return functools.partial(qa_model.init_params, qa_model.QuestionAnswering(config))

    def transformers_head(self, head: HeadSpec) -> TransformersHead:
        return TransformersHead(HF_TASK_CLASS, qa_model.HEAD_NAME, 2, reads=capability.TOKENS)

    def head_from_transformers(
        self, hf_config: Mapping[str, Any], task_classes: Sequence[str]
    ) -> HeadSpec | None:
        if HF_TASK_CLASS in task_classes:
            return HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS)
        return None


CAPABILITY = QuestionAnswering()
