"""google's n-best decoding of start and end logits into answers: the best span per example
over all its windows, only from a start token's max-context window; v2.0 compares the null
([CLS]) score with the best span's. `write_predictions` writes predictions.json,
nbest_predictions.json and null_odds.json in the official formats.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertjax.storage import fs
from bertjax.tasks.qa.squad import NO_OFFSET, QAExample, QAFeatures, QASettings

PREDICTIONS_FILE = "predictions.json"
NBEST_FILE = "nbest_predictions.json"
NULL_ODDS_FILE = "null_odds.json"


# ----------------------------------------------------------------------------- decoding


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One n-best answer: its text, character span in the context, logits and probability."""

    text: str
    start: int  # character offsets into the context; -1 for the null answer
    end: int
    start_logit: float
    end_logit: float
    probability: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """google's nbest_predictions.json entry."""
        return {
            "text": self.text,
            "probability": self.probability,
            "start_logit": self.start_logit,
            "end_logit": self.end_logit,
        }


@dataclasses.dataclass(frozen=True)
class QAPredictions:
    """Decoded answers of every example, keyed by question id."""

    predictions: dict[str, str]  # predictions.json
    nbest: dict[str, list[Candidate]]  # nbest_predictions.json
    null_odds: dict[str, float] | None  # null_odds.json (v2.0): null score - best span score


def _best_indexes(logits: np.ndarray, n: int) -> np.ndarray:
    # The n largest, highest first; ties keep the lower index first, as python's sorted does.
    return np.argsort(-logits, kind="stable")[:n]


def decode(
    examples: Sequence[QAExample],
    features: QAFeatures,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    settings: QASettings,
    *,
    version_2: bool,
) -> QAPredictions:
    """google's write_predictions: n-best spans per example over all its windows.

    A span starts and ends on context tokens, starts where its window is the start token's
    max-context one, has start <= end and at most max_answer_length tokens. Its text is the
    original context's characters. v2.0 adds the null answer (the lowest [CLS] start + end
    over the windows) and predicts "" when null score - best span score exceeds
    null_score_diff_threshold.
    """
    start_logits = np.asarray(start_logits, np.float64)  # [n, seq]
    end_logits = np.asarray(end_logits, np.float64)
    by_example: dict[int, list[int]] = collections.defaultdict(list)
    for row, k in enumerate(features.example_index):
        by_example[int(k)].append(row)
    predictions, nbest_all = {}, {}
    null_odds: dict[str, float] | None = {} if version_2 else None
    n_best = settings.n_best_size
    for k, example in enumerate(examples):
        prelim = []  # (score, start_logit, end_logit, char_start, char_end)
        null_score, null_start, null_end = math.inf, 0.0, 0.0
        for row in by_example.get(k, []):
            starts, ends = start_logits[row], end_logits[row]
            offsets, max_context = features.offsets[row], features.max_context[row]
            if version_2 and starts[0] + ends[0] < null_score:
                null_score, null_start, null_end = starts[0] + ends[0], starts[0], ends[0]
            for s in _best_indexes(starts, n_best):
                if offsets[s, 0] == NO_OFFSET or not max_context[s]:
                    continue
                for e in _best_indexes(ends, n_best):
                    if (
                        offsets[e, 0] == NO_OFFSET
                        or e < s
                        or e - s + 1 > settings.max_answer_length
                    ):
                        continue
                    prelim.append(
                        (starts[s] + ends[e], starts[s], ends[e], offsets[s, 0], offsets[e, 1])
                    )
        if version_2 and by_example.get(k):
            prelim.append((null_start + null_end, null_start, null_end, -1, -1))
        prelim.sort(key=lambda p: p[0], reverse=True)  # stable: earlier windows win ties
        seen: set[str] = set()
        nbest: list[Candidate] = []
        for _, start_logit, end_logit, char_start, char_end in prelim:
            if len(nbest) >= n_best:
                break
            text = example.context[char_start:char_end] if char_start >= 0 else ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append(Candidate(text, int(char_start), int(char_end), start_logit, end_logit))
        if version_2 and by_example.get(k):
            if "" not in seen:
                nbest.append(Candidate("", -1, -1, null_start, null_end))
            if len(nbest) == 1:  # only the null answer: google adds a placeholder span
                nbest.insert(0, Candidate("empty", -1, -1, 0.0, 0.0))
        if not nbest:
            nbest.append(Candidate("empty", -1, -1, 0.0, 0.0))
        totals = np.array([c.start_logit + c.end_logit for c in nbest])
        probabilities = np.exp(totals - totals.max())
        probabilities /= probabilities.sum()
        nbest = [
            dataclasses.replace(
                c,
                start_logit=float(c.start_logit),
                end_logit=float(c.end_logit),
                probability=float(p),
            )
            for c, p in zip(nbest, probabilities)
        ]
        nbest_all[example.id] = nbest
        if not version_2:
            predictions[example.id] = nbest[0].text
            continue
        best = next((c for c in nbest if c.text), nbest[0])
        score_diff = float(null_score - best.start_logit - best.end_logit)
        if not math.isfinite(score_diff):  # no window at all
            score_diff = 0.0
        null_odds[example.id] = score_diff
        predictions[example.id] = (
            "" if score_diff > settings.null_score_diff_threshold else best.text
        )
    return QAPredictions(predictions, nbest_all, null_odds)


def write_predictions(directory: str | os.PathLike, predictions: QAPredictions) -> list[str]:
    """Writes predictions.json, nbest_predictions.json and (v2.0) null_odds.json, the files
    the official evaluation scripts read; returns their paths."""
    directory = fs.makedirs(directory)
    contents = {
        PREDICTIONS_FILE: predictions.predictions,
        NBEST_FILE: {
            qid: [c.to_json() for c in candidates] for qid, candidates in predictions.nbest.items()
        },
    }
    if predictions.null_odds is not None:
        contents[NULL_ODDS_FILE] = predictions.null_odds
    written = []
    for name, value in contents.items():
        path = directory / name
        fs.write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")
        written.append(str(path))
    return written
