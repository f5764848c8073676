"""benchmarks.infer's own parts that need no model: the transformers side's batching and
its question-answering span decoding (the pipeline's formula), and the --methods flag."""

import numpy as np
import pytest

from benchmarks import infer


def test_batches_keep_input_order_or_go_shortest_first():
    lengths = [5, 1, 4, 2, 3]
    assert [list(r) for r in infer.batch_rows(lengths, 2, sort=False)] == [[0, 1], [2, 3], [4]]
    assert [list(r) for r in infer.batch_rows(lengths, 2, sort=True)] == [[1, 3], [4, 2], [0]]


def test_best_span_is_the_pipelines_over_the_context_only():
    # [CLS] q q [SEP] c c c c [SEP]: the question's logits are the highest and never win.
    context = np.array([0, 0, 0, 0, 1, 1, 1, 1, 0], bool)
    start = np.array([9.0, 9, 9, 0, 0, 3, 0, 0, 0])
    end = np.array([9.0, 9, 9, 0, 0, 0, 0, 3, 0])
    score, s, e = infer._best_span(start, end, context)
    assert (s, e) == (5, 7)
    kept = np.where(context | (np.arange(9) == 0), 1.0, 0.0)
    p_start = np.exp(start) * kept / (np.exp(start) * kept).sum()
    p_end = np.exp(end) * kept / (np.exp(end) * kept).sum()
    assert score == pytest.approx(p_start[5] * p_end[7])


def test_best_span_ends_after_it_starts_and_within_the_answer_length():
    n = infer.MAX_ANSWER_LEN + 10
    context = np.ones(n, bool)
    context[0] = False
    start, end = np.zeros(n), np.zeros(n)
    start[n - 2], end[1] = 5.0, 5.0  # the best of each alone would end before it starts
    end[n - 1] = 4.0
    _, s, e = infer._best_span(start, end, context)
    assert s <= e < s + infer.MAX_ANSWER_LEN and (s, e) == (n - 2, n - 1)


def test_whole_words_widen_within_the_context():
    word_start = np.array([True, True, False, True, False])  # ids 1 and 3 begin words
    ids = [0, 1, 2, 2, 3, 4, 0]
    context = np.array([0, 1, 1, 1, 1, 1, 0], bool)
    assert infer._whole_words(ids, context, 2, 2, word_start) == (1, 3)
    assert infer._whole_words(ids, context, 4, 4, word_start) == (4, 5)


def test_unknown_methods_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        infer.main(["--methods", "embed,nope"])
    assert "--methods='embed,nope': choose from" in capsys.readouterr().err
