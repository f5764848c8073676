"""The official SQuAD v1.1 / v2.0 scoring: EM and F1 after answer normalisation, max over gold
answers; v2.0 HasAns/NoAns splits and the best null-odds threshold.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence

from bertjax.tasks.qa.squad import QAExample

# ----------------------------------------------------------------------------- scoring

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised texts are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, *, version_2: bool = False) -> float:
    """Token F1 of the normalised texts. v2.0's script scores two empty texts 1 (v1.1's 0)."""
    predicted = normalize_answer(prediction).split()
    golden = normalize_answer(gold).split()
    if version_2 and (not predicted or not golden):
        return float(predicted == golden)
    common = collections.Counter(predicted) & collections.Counter(golden)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(predicted)
    recall = same / len(golden)
    return 2 * precision * recall / (precision + recall)


def evaluate(
    examples: Sequence[QAExample],
    predictions: Mapping[str, str],
    *,
    version_2: bool,
    null_odds: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """The official evaluation scripts' numbers (percentages).

    v1.1: exact_match and f1, max over the gold answers, a missing prediction scoring 0.
    v2.0: exact, f1, total, HasAns_* and NoAns_* splits; with null_odds, also best_exact,
    best_exact_thresh, best_f1 and best_f1_thresh (the null-odds threshold that scores best
    on this set). A question with no gold answer has the gold answer "".
    """
    if not version_2:
        em = f1 = 0.0
        for example in examples:
            if example.id not in predictions:
                continue
            golds = [a.text for a in example.answers]
            prediction = predictions[example.id]
            em += max(exact_match(prediction, g) for g in golds)
            f1 += max(f1_score(prediction, g) for g in golds)
        total = max(len(examples), 1)
        return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}

    has_answer = {}
    exact_raw, f1_raw = {}, {}
    for example in examples:
        golds = [a.text for a in example.answers if normalize_answer(a.text)] or [""]
        has_answer[example.id] = bool(example.answers) and not example.is_impossible
        prediction = predictions.get(example.id)
        if prediction is None:
            continue
        exact_raw[example.id] = max(exact_match(prediction, g) for g in golds)
        f1_raw[example.id] = max(f1_score(prediction, g, version_2=True) for g in golds)
    odds = dict(null_odds or {})

    def thresholded(raw):
        return {
            qid: float(not has_answer[qid]) if odds.get(qid, 0.0) > na_prob_thresh else score
            for qid, score in raw.items()
        }

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    result = _split(exact, f1, list(exact))
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid in exact if has_answer[qid] == wanted]
        if qids:
            result.update({f"{name}_{k}": v for k, v in _split(exact, f1, qids).items()})
    if null_odds is not None:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            best, threshold = _best_threshold(predictions, raw, odds, has_answer)
            result[f"best_{name}"] = best
            result[f"best_{name}_thresh"] = threshold
    return result


def _split(exact: Mapping[str, float], f1: Mapping[str, float], qids: list[str]) -> dict:
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / max(total, 1),
        "f1": 100.0 * sum(f1[q] for q in qids) / max(total, 1),
        "total": total,
    }


def _best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    odds: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """The official v2.0 find_best_thresh: sweep the null-odds threshold upwards from
    "everything is unanswerable", answering one more question at each step."""
    score = best = sum(1 for qid in scores if not has_answer[qid])
    threshold = 0.0
    for qid in sorted(odds, key=lambda q: odds[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        else:
            score += -1 if predictions[qid] else 0
        if score > best:
            best, threshold = score, odds[qid]
    return 100.0 * best / max(len(scores), 1), float(threshold)
