"""Label heads on the encoder: classification (one text or a pair), regression, multi-label
classification and token classification.

    model.py    the linen heads, their losses and outputs, word-level inputs
    data.py     the tasks' files read (over bertjax.finetune.data), labels, encoding
    metrics.py  what each task reports; conlleval's entity scores
    task.py     the fine-tuning tasks (HeadObjective, scores, prediction files)
    predict.py  Model.predict
In transformers the heads are BertForSequenceClassification and BertForTokenClassification
(id2label, problem_type).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from bertjax import capability
from bertjax.capability import HeadSpec, TransformersHead
from bertjax.nn import heads
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.labels.predict import predict
from bertjax.tasks.labels.task import HeadTask

# transformers' task class (<Family>For...) and problem_type for each task.
HF_TASK_CLASSES = {
    label_heads.CLASSIFICATION: "ForSequenceClassification",
    label_heads.REGRESSION: "ForSequenceClassification",
    label_heads.MULTI_LABEL: "ForSequenceClassification",
    label_heads.TOKEN_CLASSIFICATION: "ForTokenClassification",
}
HF_PROBLEM_TYPES = {
    label_heads.CLASSIFICATION: "single_label_classification",
    label_heads.REGRESSION: "regression",
    label_heads.MULTI_LABEL: "multi_label_classification",
}


class Labels(capability.Capability):
    """Classification, regression, multi-label and token labels: a dense "classifier"."""

    tasks = label_heads.TASKS
    method = "predict"
    usage = 'predict(["a text", ...])'
    head_param = heads.CLASSIFIER
    fine_tuning = {name: HeadTask(name) for name in label_heads.TASKS}
    notebook = {"predict": predict}

    def check_head(self, head: HeadSpec) -> None:
        if head.options is not None:
            raise ValueError(f"a {head.task} head has no options; got {head.options!r}")
        label_heads.check_labels(head.task, head.labels)

    def token_level(self, head: HeadSpec) -> bool:
        return head.task == label_heads.TOKEN_CLASSIFICATION

    def init(self, config, head: HeadSpec):
        return functools.partial(
            heads.init_params, label_heads.make_model(config, head.task, head.num_outputs)
        )

    def transformers_head(self, head: HeadSpec) -> TransformersHead:
        config: dict[str, Any] = {
            "id2label": {str(i): label for i, label in enumerate(head.labels)},
            "label2id": {label: i for i, label in enumerate(head.labels)},
        }
        if head.task in HF_PROBLEM_TYPES:
            config["problem_type"] = HF_PROBLEM_TYPES[head.task]
        return TransformersHead(
            HF_TASK_CLASSES[head.task],
            heads.CLASSIFIER,
            head.num_outputs,
            reads=capability.TOKENS if self.token_level(head) else capability.POOLED,
            config=config,
        )

    def head_from_transformers(
        self, hf_config: Mapping[str, Any], task_classes: Sequence[str]
    ) -> HeadSpec | None:
        """The head of a <Family>ForSequenceClassification or <Family>ForTokenClassification
        config.json (its labels from id2label)."""
        if HF_TASK_CLASSES[label_heads.TOKEN_CLASSIFICATION] in task_classes:
            task = label_heads.TOKEN_CLASSIFICATION
        elif HF_TASK_CLASSES[label_heads.CLASSIFICATION] in task_classes:
            problem = hf_config.get("problem_type")
            tasks = {problem_type: task for task, problem_type in HF_PROBLEM_TYPES.items()}
            if problem is not None and problem not in tasks:
                raise ValueError(
                    f"problem_type={problem!r} is not supported; valid: {sorted(tasks)}"
                )
            count = len(hf_config.get("id2label") or {}) or int(hf_config.get("num_labels", 2))
            if problem:
                task = tasks[problem]
            else:  # transformers' own rule without a problem_type: one output is a regression
                task = label_heads.REGRESSION if count == 1 else label_heads.CLASSIFICATION
        else:
            return None
        id2label = hf_config.get("id2label") or {
            str(i): f"LABEL_{i}" for i in range(int(hf_config.get("num_labels", 2)))
        }
        if sorted(int(k) for k in id2label) != list(range(len(id2label))):
            raise ValueError(f"id2label keys {sorted(id2label)} are not 0..n-1")
        return HeadSpec(task, tuple(id2label[k] for k in sorted(id2label, key=int)))


CAPABILITY = Labels()
