"""Evaluation statistics that tasks share, as pure numpy functions of predictions and gold.

Single labels: accuracy, F1 of one class (binary), macro and micro F1, Matthews correlation
(the multi-class form, R_K). Numbers: Pearson and Spearman correlations, mean squared error.
Label sets: micro and macro F1 over labels, exact-match accuracy.

Which of them a task reports is the task's (its `metrics`); every metric is "higher is better"
except those in LOWER_IS_BETTER.
"""

from __future__ import annotations

import numpy as np

LOWER_IS_BETTER = frozenset({"mse"})


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
