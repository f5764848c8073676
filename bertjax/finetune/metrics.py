"""Evaluation metrics of fine-tuning tasks, as pure numpy functions of predictions and gold.

Single-label classification: accuracy, F1 of one class (binary), macro and micro F1, Matthews
correlation (the multi-class form, R_K). Regression: Pearson and Spearman correlations, mean
squared error. Multi-label: micro and macro F1 over labels, exact-match accuracy. Token
labelling: entity-level precision, recall and F1 under conlleval's chunking rules, and token
accuracy.

`scores` computes a task's whole set at once; every value there is "higher is better" except
`mse`, and `DEFAULT_METRIC` names the one each task keeps its best checkpoint by.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertjax.heads import CLASSIFICATION, MULTI_LABEL, REGRESSION, TOKEN_CLASSIFICATION

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
LOWER_IS_BETTER = frozenset({"mse"})


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


def accuracy(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Fraction of predictions equal to the gold labels."""
    predicted, gold = np.asarray(predicted), np.asarray(gold)
    return float(np.mean(predicted == gold)) if gold.size else 0.0


def _f1(tp: float, fp: float, fn: float) -> float:
    # 2TP / (2TP + FP + FN) equals 2PR / (P + R); 0 when there is nothing to find or found.
    denominator = 2 * tp + fp + fn
    return float(2 * tp / denominator) if denominator else 0.0


def f1_binary(predicted: np.ndarray, gold: np.ndarray, positive: int = 1) -> float:
    """F1 of the `positive` class (GLUE's MRPC and QQP: class 1)."""
    predicted, gold = np.asarray(predicted), np.asarray(gold)
    tp = np.sum((predicted == positive) & (gold == positive))
    fp = np.sum((predicted == positive) & (gold != positive))
    fn = np.sum((predicted != positive) & (gold == positive))
    return _f1(tp, fp, fn)


def f1_macro(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Mean of per-class F1 over the classes that occur in the gold labels or predictions."""
    predicted, gold = np.asarray(predicted), np.asarray(gold)
    classes = np.union1d(predicted, gold)
    if not classes.size:
        return 0.0
    return float(np.mean([f1_binary(predicted, gold, c) for c in classes]))


def f1_micro(predicted: np.ndarray, gold: np.ndarray) -> float:
    """F1 of all classes pooled; with one label per example it equals accuracy."""
    return accuracy(predicted, gold)


def matthews_corrcoef(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Matthews correlation coefficient (Gorodkin's R_K for several classes); 0 if undefined.

    (c * s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2)), with c the correct
    predictions, s the examples, p_k and t_k the times class k was predicted and is true.
    """
    predicted, gold = np.asarray(predicted), np.asarray(gold)
    classes, index = np.unique(np.concatenate([predicted, gold]), return_inverse=True)
    p_index, t_index = index[: predicted.size], index[predicted.size :]
    p = np.bincount(p_index, minlength=classes.size).astype(np.float64)
    t = np.bincount(t_index, minlength=classes.size).astype(np.float64)
    c = float(np.sum(p_index == t_index))
    s = float(predicted.size)
    denominator = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - p @ t) / denominator) if denominator else 0.0


def pearson(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Pearson's correlation; 0 when either side is constant."""
    x = np.asarray(predicted, np.float64) - np.mean(predicted)
    y = np.asarray(gold, np.float64) - np.mean(gold)
    denominator = np.sqrt((x @ x) * (y @ y))
    return float((x @ y) / denominator) if denominator else 0.0


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing the mean of their ranks (as Spearman's rho needs)."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Runs of equal values: each gets the mean of the positions it spans.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], values.size]
    mean_rank = (starts + ends + 1) / 2.0  # mean of the 1-based ranks start+1 .. end
    ranks = np.empty(values.size, np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's of the average ranks."""
    return pearson(average_ranks(predicted), average_ranks(gold))


def mse(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Mean squared error."""
    diff = np.asarray(predicted, np.float64) - np.asarray(gold, np.float64)
    return float(np.mean(diff * diff)) if diff.size else 0.0


def multi_label_f1(predicted: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    """(micro, macro) F1 of 0/1 [examples, labels] matrices.

    Micro pools every (example, label) decision; macro averages per-label F1 over the labels
    that occur in the gold labels or the predictions.
    """
    predicted, gold = np.asarray(predicted).astype(bool), np.asarray(gold).astype(bool)
    tp = np.sum(predicted & gold, axis=0)  # [labels]
    fp = np.sum(predicted & ~gold, axis=0)
    fn = np.sum(~predicted & gold, axis=0)
    micro = _f1(tp.sum(), fp.sum(), fn.sum())
    seen = (tp + fp + fn) > 0
    macro = (
        float(np.mean([_f1(*c) for c in zip(tp[seen], fp[seen], fn[seen])])) if seen.any() else 0.0
    )
    return micro, macro


def exact_match(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Fraction of examples whose whole label set is right (multi-label subset accuracy)."""
    predicted, gold = np.asarray(predicted).astype(bool), np.asarray(gold).astype(bool)
    return float(np.mean(np.all(predicted == gold, axis=1))) if gold.size else 0.0


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
