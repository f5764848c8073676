"""Sequence-generation metrics from the maintained libraries (the `seq2seq` extra).

corpus_bleu  sacrebleu's corpus BLEU with its default 13a tokenisation, so that figures
             compare with published ones (0-100)
rouge        Google's rouge-score: mean F1 of ROUGE-1, ROUGE-2 and ROUGE-L with the Porter
             stemmer on, as the summarisation papers report them (0-1)
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

METRICS = ("bleu", "rouge1", "rouge2", "rougeL")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def _libraries():
    """(sacrebleu, rouge_score.rouge_scorer), imported when first scored rather than with
    bertjax: rouge-score imports nltk, which costs seconds in every process that opens a
    model or starts a run, and only a seq2seq evaluation needs it."""
    try:
        return (
            importlib.import_module("sacrebleu"),
            importlib.import_module("rouge_score.rouge_scorer"),
        )
    except ImportError as error:  # the `seq2seq` extra is not installed
        raise ImportError(
            "BLEU and ROUGE need the sacrebleu and rouge-score packages: "
            "pip install 'bertjax[seq2seq]'"
        ) from error


def _check(predictions: Sequence[str], references: Sequence[str]) -> None:
    if len(predictions) != len(references):
        raise ValueError(
            f"{len(predictions)} predictions but {len(references)} references: need one "
            "reference per prediction"
        )
    if not predictions:
        raise ValueError("no predictions to score")


def corpus_bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (0-100) of detokenised predictions against one reference each."""
    sacrebleu, _ = _libraries()
    _check(predictions, references)
    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean F1 of ROUGE-1, ROUGE-2 and ROUGE-L (stemming on) over the pairs."""
    _, rouge_scorer = _libraries()
    _check(predictions, references)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for prediction, reference in zip(predictions, references):
        scores = scorer.score(reference, prediction)  # (target, prediction)
        for name in ROUGE_TYPES:
            totals[name] += scores[name].fmeasure
    return {name: total / len(predictions) for name, total in totals.items()}


def score(metric: str, predictions: Sequence[str], references: Sequence[str]) -> float:
    """One metric by name (METRICS): bleu, rouge1, rouge2 or rougeL."""
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is invalid: must be one of {METRICS}")
    if metric == "bleu":
        return corpus_bleu(predictions, references)
    return rouge(predictions, references)[metric]
