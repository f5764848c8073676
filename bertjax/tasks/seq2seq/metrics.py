"""Sequence-generation metrics from the maintained libraries (the `seq2seq` extra).

corpus_bleu  sacrebleu's corpus BLEU with its default 13a tokenisation, so that figures
             compare with published ones (0-100)
rouge        Google's rouge-score: mean F1 of ROUGE-1, ROUGE-2 and ROUGE-L with the Porter
             stemmer on, as the summarisation papers report them (0-1)
"""

from __future__ import annotations

from collections.abc import Sequence

try:
    import sacrebleu
    from rouge_score import rouge_scorer
except ImportError:  # the `seq2seq` extra is not installed; the functions say so when called
    sacrebleu = None
    rouge_scorer = None

METRICS = ("bleu", "rouge1", "rouge2", "rougeL")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def _require() -> None:
    if sacrebleu is None or rouge_scorer is None:
        raise ImportError(
            "BLEU and ROUGE need the sacrebleu and rouge-score packages: "
            "pip install 'bertjax[seq2seq]'"
        )


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
    _require()
    _check(predictions, references)
    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean F1 of ROUGE-1, ROUGE-2 and ROUGE-L (stemming on) over the pairs."""
    _require()
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
