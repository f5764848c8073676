"""Published GLUE rows to put beside a suite's, each with where it was read.

Scores are percentages as published, keyed (task, metric) in bertjax.finetune.glue_tasks' names.
Only numbers read in their source are here; what a source does not say (which metric, which
MNLI set) is left out rather than guessed, and the row's note says what is missing.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PublishedRow:
    """One model's published GLUE scores."""

    model: str
    split: str  # "dev" or "test" (the GLUE server's)
    scores: dict[tuple[str, str], float]  # (task, metric) -> percent
    average: float | None  # the average as published (its definition in `note`)
    source: str
    note: str = ""


_BERT_SOURCE = (
    "Devlin et al. 2019, BERT, Table 1 (GLUE test server; F1 for QQP and MRPC, Spearman for "
    "STS-B, accuracy elsewhere)"
)
_BERT_NOTE = (
    "test-set scores: the paper gives no per-task dev rows; its average is over the nine "
    "numbers without WNLI (MNLI-m and -mm counted apart)"
)


def _bert(m, mm, qqp, qnli, sst2, cola, stsb, mrpc, rte) -> dict[tuple[str, str], float]:
    return {
        ("mnli", "matched_accuracy"): m,
        ("mnli", "mismatched_accuracy"): mm,
        ("qqp", "f1"): qqp,
        ("qnli", "accuracy"): qnli,
        ("sst2", "accuracy"): sst2,
        ("cola", "mcc"): cola,
        ("stsb", "spearman"): stsb,
        ("mrpc", "f1"): mrpc,
        ("rte", "accuracy"): rte,
    }


ROWS: tuple[PublishedRow, ...] = (
    PublishedRow(
        "BERT-base",
        "test",
        _bert(84.6, 83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4),
        79.6,
        _BERT_SOURCE,
        _BERT_NOTE,
    ),
    PublishedRow(
        "BERT-large",
        "test",
        _bert(86.7, 85.9, 72.1, 92.7, 94.9, 60.5, 86.5, 89.3, 70.1),
        82.1,
        _BERT_SOURCE,
        _BERT_NOTE,
    ),
    PublishedRow(
        "RoBERTa-base",
        "dev",
        {
            ("mnli", "matched_accuracy"): 87.6,
            ("qnli", "accuracy"): 92.8,
            ("rte", "accuracy"): 78.7,
            ("sst2", "accuracy"): 94.8,
            ("cola", "mcc"): 63.6,
        },
        None,
        "fairseq, examples/roberta/README.md, 'Results on GLUE tasks (dev set, single model, "
        "single-task finetuning)'",
        "QQP 91.9, MRPC 90.2 and STS-B 91.2 are left out: the README does not say which "
        "metric they are; its MNLI is the matched dev set (the README's own MNLI example)",
    ),
    PublishedRow(
        "ELECTRA-base",
        "dev",
        {
            ("cola", "mcc"): 67.7,
            ("sst2", "accuracy"): 95.1,
            ("mrpc", "accuracy"): 89.5,
            ("stsb", "spearman"): 91.2,
            ("qqp", "accuracy"): 91.5,
            ("mnli", "matched_accuracy"): 88.8,
            ("qnli", "accuracy"): 93.2,
            ("rte", "accuracy"): 82.7,
        },
        None,
        "google-research/electra, README.md, 'Expected Results' (medians over many seeds)",
        "MNLI is dev_matched (finetune/classification/classification_tasks.py reads it)",
    ),
    PublishedRow(
        "ModernBERT-base",
        "dev",
        {},
        88.4,
        "Warner et al. 2024, ModernBERT (arXiv 2412.13663), Table 1; the model card of "
        "answerdotai/ModernBERT-base",
        "per-task scores left out: not verified here; the average is the paper's",
    ),
    PublishedRow(
        "ModernBERT-large",
        "dev",
        {},
        90.4,
        "Warner et al. 2024, ModernBERT (arXiv 2412.13663), Table 1",
        "per-task scores left out: not verified here; the average is the paper's",
    ),
)
