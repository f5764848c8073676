"""Extractive question answering (SQuAD v1.1 and v2.0).

    squad.py   reading SQuAD files, google's windows, the head and its loss, n-best decoding
               and the official scorer
    task.py    the fine-tuning task (config.task=question_answering, config.qa)
    answer.py  Model.answer, as transformers' question-answering pipeline answers
In transformers the model is BertForQuestionAnswering (qa_outputs [2, hidden], no pooler).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from bertjax import capability
from bertjax.capability import HeadSpec, TransformersHead
from bertjax.tasks.qa import squad
from bertjax.tasks.qa.answer import answer
from bertjax.tasks.qa.task import QuestionAnsweringTask

HF_ARCHITECTURE = "BertForQuestionAnswering"


class QuestionAnswering(capability.Capability):
    """Start and end logits over the tokens: a dense "qa_outputs" [hidden, 2]."""

    tasks = (squad.TASK,)
    method = "answer"
    usage = 'answer("Who wrote it?", "the context ...")'
    head_param = squad.HEAD_NAME
    fine_tuning = {squad.TASK: QuestionAnsweringTask()}
    notebook = {"answer": answer}

    def check_head(self, head: HeadSpec) -> None:
        if head.labels != squad.HEAD_LABELS or head.options is not None:
            raise ValueError(
                f"a {squad.TASK} head has the labels {squad.HEAD_LABELS} and no options; got "
                f"{head.labels!r}"
            )

    def init(self, config, head: HeadSpec):
        return functools.partial(squad.init_params, squad.QuestionAnswering(config))

    def transformers_head(self, head: HeadSpec) -> TransformersHead:
        return TransformersHead(HF_ARCHITECTURE, squad.HEAD_NAME, 2, pooler=False)

    def head_from_transformers(self, hf_config: Mapping[str, Any]) -> HeadSpec | None:
        if HF_ARCHITECTURE in (hf_config.get("architectures") or []):
            return HeadSpec(squad.TASK, squad.HEAD_LABELS)
        return None


CAPABILITY = QuestionAnswering()
