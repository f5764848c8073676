"""The label tasks' metrics: which each reports, and conlleval's entity scores.

Single-label classification: accuracy, F1 of class 1 (two labels only), macro F1, Matthews
correlation. Regression: Pearson and Spearman correlations, mean squared error. Multi-label:
micro and macro F1 over labels, exact-match accuracy. Token labelling: entity-level precision,
recall and F1 under conlleval's chunking rules, and token accuracy. The statistics themselves
are bertjax.finetune.metrics'.

`scores` computes a task's whole set at once; `DEFAULT_METRIC` names the one each task keeps
its best checkpoint by.
"""

from __future__ import annotations

from collections.abc import Sequence

from bertjax.finetune.metrics import (
    accuracy,
    exact_match,
    f1_binary,
    f1_macro,
    matthews_corrcoef,
    mse,
    multi_label_f1,
    pearson,
    spearman,
)
from bertjax.tasks.labels.model import CLASSIFICATION, MULTI_LABEL, REGRESSION, TOKEN_CLASSIFICATION

# What `scores` reports per task; "f1" of a classification task only with two labels.
METRIC_NAMES = {
    CLASSIFICATION: ("accuracy", "f1", "f1_macro", "mcc"),
    REGRESSION: ("pearson", "spearman", "mse"),
    MULTI_LABEL: ("f1_micro", "f1_macro", "exact_match"),
    TOKEN_CLASSIFICATION: ("f1", "precision", "recall", "token_accuracy"),
}
DEFAULT_METRIC = {
    CLASSIFICATION: "accuracy",
    REGRESSION: "pearson",
    MULTI_LABEL: "f1_micro",
    TOKEN_CLASSIFICATION: "f1",
}


def scores(task: str, predicted, gold, num_labels: int) -> dict[str, float]:
    """The task's metrics (METRIC_NAMES) of predictions against gold labels.

    classification: label ids [n]; regression: values [n]; multi-label: 0/1 [n, labels];
    token classification: per sentence, its words' tag names.
    """
    if task == CLASSIFICATION:
        out = {
            "accuracy": accuracy(predicted, gold),
            "f1_macro": f1_macro(predicted, gold),
            "mcc": matthews_corrcoef(predicted, gold),
        }
        if num_labels == 2:
            out["f1"] = f1_binary(predicted, gold, positive=1)
        return out
    if task == REGRESSION:
        return {
            "pearson": pearson(predicted, gold),
            "spearman": spearman(predicted, gold),
            "mse": mse(predicted, gold),
        }
    if task == MULTI_LABEL:
        micro, macro = multi_label_f1(predicted, gold)
        return {"f1_micro": micro, "f1_macro": macro, "exact_match": exact_match(predicted, gold)}
    return entity_scores(predicted, gold)


# ----------------------------------------------------------------------------- entities


def _split_tag(tag: str) -> tuple[str, str]:
    """(prefix, type) of a tag: "B-PER" -> ("B", "PER"); "O" -> ("O", ""); a tag without a
    prefix, "PER", reads as ("I", "PER") (conlleval's raw mode)."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep:
        return "I", tag
    return prefix, kind


def _chunk_ends(prev: str, tag: str, prev_type: str, kind: str) -> bool:
    # conlleval.pl's endOfChunk, for the B/I/E/O prefixes.
    if (prev, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"),
                       ("E", "O")}:  # fmt: skip
        return True
    return prev != "O" and prev_type != kind


def _chunk_starts(prev: str, tag: str, prev_type: str, kind: str) -> bool:
    # conlleval.pl's startOfChunk.
    if (prev, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"),
                       ("O", "E")}:  # fmt: skip
        return True
    return tag != "O" and prev_type != kind


def entities(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """The chunks of one sentence's tags as (first, last, type) word positions, by conlleval's
    rules: a chunk starts at B-X, or at I-X after O or after another type, and ends before O,
    before B-, or before a tag of another type."""
    found = set()
    prev, prev_type, start = "O", "", None
    for position, tag in enumerate(tags):
        prefix, kind = _split_tag(tag)
        if start is not None and _chunk_ends(prev, prefix, prev_type, kind):
            found.add((start, position - 1, prev_type))
            start = None
        if _chunk_starts(prev, prefix, prev_type, kind):
            start = position
        prev, prev_type = prefix, kind
    if start is not None:
        found.add((start, len(tags) - 1, prev_type))
    return found


def entity_scores(
    predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Entity-level precision, recall and F1 (conlleval) and token accuracy over sentences.

    A predicted entity counts when its first word, last word and type all match a gold one.
    """
    found = correct = true = 0
    tokens = right = 0
    for p_tags, g_tags in zip(predicted, gold, strict=True):
        if len(p_tags) != len(g_tags):
            raise ValueError(f"a sentence has {len(p_tags)} predicted tags, {len(g_tags)} gold")
        p_chunks, g_chunks = entities(p_tags), entities(g_tags)
        found += len(p_chunks)
        true += len(g_chunks)
        correct += len(p_chunks & g_chunks)
        tokens += len(g_tags)
        right += sum(p == g for p, g in zip(p_tags, g_tags))
    precision = correct / found if found else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "token_accuracy": right / tokens if tokens else 0.0,
    }
