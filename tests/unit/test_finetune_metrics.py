"""Fine-tuning metrics against values worked out by hand."""

import math

import numpy as np
import pytest

from bertjax.finetune import metrics
from bertjax.tasks.labels import metrics as label_metrics
from bertjax.tasks.labels import model as label_heads

# Binary: TP at 0 and 3, FP at 1, TN at 2, FN at 4.
BINARY_PRED = [1, 1, 0, 1, 0]
BINARY_GOLD = [1, 0, 0, 1, 1]
# Three classes: class 0 right once; classes 1 and 2 each right once, wrong once both ways.
MULTI_PRED = [0, 1, 2, 2, 1]
MULTI_GOLD = [0, 1, 1, 2, 2]


def test_accuracy():
    assert metrics.accuracy(BINARY_PRED, BINARY_GOLD) == pytest.approx(3 / 5)


def test_binary_f1_is_that_of_the_positive_class():
    # P = 2/3, R = 2/3.
    assert metrics.f1_binary(BINARY_PRED, BINARY_GOLD) == pytest.approx(2 / 3)
    # Class 0: TP 1 (index 2), FP 1 (index 4), FN 1 (index 1): P = R = 1/2.
    assert metrics.f1_binary(BINARY_PRED, BINARY_GOLD, positive=0) == pytest.approx(1 / 2)
    assert metrics.f1_binary([0, 0], [0, 0]) == 0.0  # nothing to find, nothing found


def test_macro_f1_averages_the_classes_and_micro_f1_pools_them():
    # Per class F1: 1, 1/2, 1/2.
    assert metrics.f1_macro(MULTI_PRED, MULTI_GOLD) == pytest.approx(2 / 3)
    assert metrics.f1_micro(MULTI_PRED, MULTI_GOLD) == pytest.approx(3 / 5)


def test_matthews_correlation_binary_and_multi_class():
    # (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2 - 1) / sqrt(3 * 3 * 2 * 2).
    assert metrics.matthews_corrcoef(BINARY_PRED, BINARY_GOLD) == pytest.approx(1 / 6)
    # c = 3, s = 5, p = t = (1, 2, 2): (15 - 9) / sqrt((25 - 9) * (25 - 9)).
    assert metrics.matthews_corrcoef(MULTI_PRED, MULTI_GOLD) == pytest.approx(6 / 16)
    assert metrics.matthews_corrcoef([1, 1, 1], [0, 1, 1]) == 0.0  # undefined: one class
    assert metrics.matthews_corrcoef([0, 1, 0], [0, 1, 0]) == pytest.approx(1.0)
    assert metrics.matthews_corrcoef([1, 0], [0, 1]) == pytest.approx(-1.0)


def test_pearson_and_spearman():
    # x - 2 = (-1, 0, 1), y - 13/3 = (-7, -1, 8) / 3: sum xy = 5, sum x^2 = 2, sum y^2 = 114/9.
    expected = 5 / math.sqrt(2 * 114 / 9)
    assert metrics.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(expected)
    assert metrics.spearman([1, 2, 3], [2, 4, 7]) == pytest.approx(1.0)
    # Ties share ranks: x ranks (1, 2.5, 2.5, 4), y ranks (1, 3, 2, 4) -> 4.5 / sqrt(4.5 * 5).
    assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))
    assert metrics.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_average_ranks_share_ties():
    np.testing.assert_array_equal(
        metrics.average_ranks(np.array([10, 20, 10, 30, 20])), [1.5, 3.5, 1.5, 5.0, 3.5]
    )


def test_mean_squared_error():
    assert metrics.mse([1.0, 2.0, 4.0], [1.0, 0.0, 1.0]) == pytest.approx((4 + 9) / 3)


def test_multi_label_f1_and_exact_match():
    predicted = np.array([[1, 0, 1], [0, 1, 0]])
    gold = np.array([[1, 1, 0], [0, 1, 0]])
    micro, macro = metrics.multi_label_f1(predicted, gold)
    # Pooled: TP 2, FP 1, FN 1. Per label: 1, 2/3 (TP 1, FN 1), 0 (FP 1).
    assert micro == pytest.approx(4 / 6)
    assert macro == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert metrics.exact_match(predicted, gold) == pytest.approx(1 / 2)


@pytest.mark.parametrize(
    "tags, expected",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], {(0, 1, "PER"), (3, 3, "LOC")}),
        (["O", "I-PER", "I-PER"], {(1, 2, "PER")}),  # I- after O starts an entity
        (["B-PER", "I-LOC"], {(0, 0, "PER"), (1, 1, "LOC")}),  # a change of type too
        (["B-PER", "B-PER", "I-PER"], {(0, 0, "PER"), (1, 2, "PER")}),
        (["I-ORG", "I-ORG", "O"], {(0, 1, "ORG")}),  # IOB1: I- at the start
        (["B-MISC", "E-MISC", "O"], {(0, 1, "MISC")}),
        (["O", "O"], set()),
        (["B-PER"], {(0, 0, "PER")}),  # an entity that ends the sentence
    ],
)
def test_entities_follow_conllevals_chunking(tags, expected):
    assert label_metrics.entities(tags) == expected


def test_entity_scores_count_exact_matches_of_span_and_type():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-MISC"]]
    scores = label_metrics.entity_scores(predicted, gold)
    # Found 4 (PER, ORG; ORG, MISC), true 3 (PER, LOC; ORG), correct 2 (PER; ORG).
    assert scores["precision"] == pytest.approx(2 / 4)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 * (1 / 2) * (2 / 3) / (1 / 2 + 2 / 3))
    assert scores["token_accuracy"] == pytest.approx(4 / 6)


def test_a_boundary_mismatch_is_a_miss():
    scores = label_metrics.entity_scores([["B-PER", "O"]], [["B-PER", "I-PER"]])
    assert scores["precision"] == 0.0 and scores["recall"] == 0.0 and scores["f1"] == 0.0


def test_scores_report_each_tasks_metrics():
    classification = label_metrics.scores(label_heads.CLASSIFICATION, BINARY_PRED, BINARY_GOLD, 2)
    assert set(classification) == set(label_metrics.METRIC_NAMES[label_heads.CLASSIFICATION])
    assert classification["f1"] == pytest.approx(2 / 3)
    assert "f1" not in label_metrics.scores(label_heads.CLASSIFICATION, MULTI_PRED, MULTI_GOLD, 3)
    for task, predicted, gold in [
        (label_heads.REGRESSION, [1.0, 2.0, 3.0], [2.0, 4.0, 7.0]),
        (label_heads.MULTI_LABEL, np.eye(2), np.eye(2)),
        (label_heads.TOKEN_CLASSIFICATION, [["B-X"]], [["B-X"]]),
    ]:
        assert set(label_metrics.scores(task, predicted, gold, 2)) == set(
            label_metrics.METRIC_NAMES[task]
        )
        assert label_metrics.DEFAULT_METRIC[task] in label_metrics.METRIC_NAMES[task]
