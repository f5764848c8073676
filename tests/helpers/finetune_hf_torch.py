"""The transformers classes of each label head, and torch's labels for a batch: the torch side
of the fine-tuning parity checks (imports torch)."""

import pathlib

import numpy as np
import torch
import transformers

from bertjax.capability import HeadSpec
from bertjax.tasks.labels import model as label_heads
from tests.helpers.finetune_hf import ATOL

# The warmup of the torch side's schedule, and of bertjax's optimizer settings beside it.
TORCH_WARMUP_STEPS = 2

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


def torch_adamw(reference: torch.nn.Module, steps: int, learning_rate: float, no_decay=("bias",)):
    """(optimizer, schedule) of transformers' fine-tuning recipe for `reference`, as bertjax's
    fine-tuning optimizer: AdamW, eps 1e-6, weight decay 0.01 except on parameters whose
    names hold a `no_decay` word (biases and norms), linear warmup over 2 steps then linear
    decay to 0 at `steps`."""
    named = list(reference.named_parameters())
    exempt = [p for n, p in named if any(word in n for word in no_decay)]
    decay = [p for n, p in named if not any(word in n for word in no_decay)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": exempt, "weight_decay": 0.0}],
        lr=learning_rate,
        eps=1e-6,
    )
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, TORCH_WARMUP_STEPS, steps)
    return optimizer, schedule


def assert_predicts_as_transformers(
    export: pathlib.Path, predictions: list[dict], texts: list[str], pairs=None
) -> transformers.BertForSequenceClassification:
    """`predictions` (Model.predict on `texts`, and `pairs`) have the labels and scores that
    transformers' BertForSequenceClassification opened from the directory `export` gives them
    (to ATOL); returns that model."""
    reference = transformers.BertForSequenceClassification.from_pretrained(
        export, attn_implementation="eager"
    ).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    inputs = tokenizer(texts, pairs, padding=True, return_tensors="pt")  # pairs may be None
    with torch.no_grad():
        probabilities = torch.softmax(reference(**inputs).logits, dim=-1).numpy()
    assert [p["label"] for p in predictions] == [
        reference.config.id2label[k] for k in probabilities.argmax(axis=-1)
    ]
    np.testing.assert_allclose(
        [p["score"] for p in predictions], probabilities.max(axis=-1), atol=ATOL
    )
    return reference
