"""Evaluating sentence embeddings: semantic similarity (STS) and retrieval.

STS: the cosine similarity of each pair's embeddings against gold scores, as Spearman's
rank correlation (the field's headline figure) and Pearson's.

Retrieval: each query's corpus ranked by cosine similarity with exact brute-force search
(bertjax.inference.vectors.search), scored against binary relevance judgements as
sentence-transformers' InformationRetrievalEvaluator does:
  mrr@10    1 / rank of the first relevant document within the top 10 (0 if none)
  ndcg@10   sum over the top 10 of rel_i / log2(i + 1), divided by the same sum for the
            ideal ranking (every relevant document first)
  recall@k  relevant documents in the top k / relevant documents
averaged over the queries that have at least one relevant document.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from bertjax.finetune import metrics
from bertjax.inference import vectors

STS_METRICS = ("spearman", "pearson")
MRR_AT = 10
NDCG_AT = 10
RECALL_AT = (1, 5, 10)


def sts_scores(a: np.ndarray, b: np.ndarray, gold: Sequence[float]) -> dict[str, float]:
    """Spearman and Pearson of cos(a_i, b_i) against gold scores, for [n, h] a and b."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    gold = np.asarray(gold, np.float64)
    if a.shape != b.shape or a.ndim != 2 or gold.shape != (a.shape[0],):
        raise ValueError(
            f"sts_scores needs [n, h] embeddings of both sides and [n] gold scores; got "
            f"{a.shape}, {b.shape} and {gold.shape}"
        )
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = np.sum(a * b, axis=1) / np.maximum(norms, vectors.NORM_EPS)  # [n]
    return {
        "spearman": metrics.spearman(cosine, gold),
        "pearson": metrics.pearson(cosine, gold),
    }


def _relevant_sets(
    relevant: Mapping[int, Iterable[int]] | Iterable[tuple[int, int]], queries: int, corpus: int
) -> list[set[int]]:
    """Per query, the set of relevant corpus rows, from {query: rows} or (query, row) pairs."""
    pairs = (
        [(q, c) for q, rows in relevant.items() for c in rows]
        if isinstance(relevant, Mapping)
        else list(relevant)
    )
    sets: list[set[int]] = [set() for _ in range(queries)]
    for q, c in pairs:
        if not 0 <= q < queries:
            raise ValueError(f"relevance pair ({q}, {c}): query {q} is not in [0, {queries})")
        if not 0 <= c < corpus:
            raise ValueError(f"relevance pair ({q}, {c}): corpus row {c} is not in [0, {corpus})")
        sets[q].add(int(c))
    return sets


def ranking_scores(
    ranked: np.ndarray,
    relevant: Sequence[set[int]],
    recall_at: Sequence[int] = RECALL_AT,
    mrr_at: int = MRR_AT,
    ndcg_at: int = NDCG_AT,
) -> dict[str, float]:
    """MRR, nDCG and recall of rankings ([queries, k] corpus rows, best first).

    Queries without relevant documents are left out of every average.
    """
    judged = [q for q, rows in enumerate(relevant) if rows]
    if not judged:
        raise ValueError("no query has a relevant document: nothing to score")
    mrr, ndcg = [], []
    recall: dict[int, list[float]] = {k: [] for k in recall_at}
    discounts = 1.0 / np.log2(np.arange(2, max(ndcg_at, 1) + 2))  # rank i -> 1 / log2(i + 1)
    for q in judged:
        rows = relevant[q]
        hits = np.asarray([int(r) in rows for r in ranked[q]], bool)  # [k]
        first = np.flatnonzero(hits[:mrr_at])
        mrr.append(1.0 / (first[0] + 1) if first.size else 0.0)
        top = hits[:ndcg_at]
        ideal = discounts[: min(len(rows), ndcg_at)].sum()
        ndcg.append(float(discounts[: top.size][top].sum() / ideal))
        for k in recall_at:
            recall[k].append(hits[:k].sum() / len(rows))
    out = {f"mrr@{mrr_at}": float(np.mean(mrr)), f"ndcg@{ndcg_at}": float(np.mean(ndcg))}
    out.update({f"recall@{k}": float(np.mean(v)) for k, v in recall.items()})
    return out


def retrieval_scores(
    queries: np.ndarray,
    corpus: np.ndarray,
    relevant: Mapping[int, Iterable[int]] | Iterable[tuple[int, int]],
    recall_at: Sequence[int] = RECALL_AT,
    mrr_at: int = MRR_AT,
    ndcg_at: int = NDCG_AT,
) -> dict[str, float]:
    """Retrieval metrics of query embeddings [n, h] against corpus embeddings [m, h].

    `relevant`: {query row: corpus rows} or (query row, corpus row) pairs.
    """
    sets = _relevant_sets(relevant, len(queries), len(corpus))
    depth = max(mrr_at, ndcg_at, *recall_at)
    _, ranked = vectors.search(queries, corpus, top_k=depth)
    return ranking_scores(ranked, sets, recall_at, mrr_at, ndcg_at)
