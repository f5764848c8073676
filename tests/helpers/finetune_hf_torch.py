"""The transformers classes of each label head, and torch's labels for a batch: the torch side
of the fine-tuning parity checks (imports torch)."""

import numpy as np
import torch
import transformers

from bertjax.capability import HeadSpec
from bertjax.tasks.labels import model as label_heads

HF_CLASSES = {
    label_heads.TOKEN_CLASSIFICATION: transformers.BertForTokenClassification,
    label_heads.CLASSIFICATION: transformers.BertForSequenceClassification,
}


def torch_labels(head: HeadSpec, labels: np.ndarray):
    if head.task == label_heads.TOKEN_CLASSIFICATION:  # transformers ignores -100
        return torch.tensor(np.where(labels == label_heads.IGNORE_LABEL, -100, labels)).long()
    if head.task == label_heads.CLASSIFICATION:
        return torch.tensor(labels).long()
    return torch.tensor(labels)
