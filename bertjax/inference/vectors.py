"""Vectors: cosine similarity and exact nearest-neighbour search, blocked and jitted.

Any model's embeddings (`Model.embed`, a trained embedding model's) meet here: `similarity`
of two sets, `search` of a corpus for the top-k rows per query.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# Below this norm a vector is not scaled up (torch.nn.functional.normalize's eps, which
# sentence-transformers' Normalize module uses).
NORM_EPS = 1e-12


def l2_normalize(vectors: jax.Array) -> jax.Array:
    """Each row scaled to unit length (rows shorter than NORM_EPS are divided by it)."""
    norm = jnp.linalg.norm(vectors, axis=-1, keepdims=True)  # [..., 1]
    return vectors / jnp.maximum(norm, NORM_EPS)


def _check_pair(a: np.ndarray, b: np.ndarray, what: str, names: tuple[str, str]) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{what} needs [n, h] {names[0]} and [m, h] {names[1]} of the same width; got "
            f"{a.shape} and {b.shape}"
        )


def similarity(a: np.ndarray | jax.Array, b: np.ndarray | jax.Array) -> np.ndarray:
    """Cosine similarity of every row of a [n, h] with every row of b [m, h]: [n, m]."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    _check_pair(a, b, "similarity", ("a", "b"))
    a = l2_normalize(jnp.asarray(a))
    b = l2_normalize(jnp.asarray(b))
    return np.asarray(jnp.einsum("nh,mh->nm", a, b, precision=jax.lax.Precision.HIGHEST))


@functools.partial(jax.jit, static_argnames=("top_k", "block"))
def _search_block(queries, corpus, corpus_size, *, top_k: int, block: int):
    """Top-k cosine scores and corpus rows for a block of queries, over corpus blocks.

    queries [q, h] and corpus [blocks * block, h] are unit rows; rows from corpus_size on pad
    the corpus and are never returned. Each corpus block's top-k merges with the running
    top-k, so memory is [q, block], whatever the corpus size.
    """
    blocks = corpus.shape[0] // block
    chunks = corpus.reshape(blocks, block, corpus.shape[1])  # [blocks, block, h]
    first = jnp.full((queries.shape[0], top_k), -jnp.inf, jnp.float32)  # [q, k]

    def merge(carry, xs):
        best_scores, best_rows = carry
        chunk, offset = xs
        scores = jnp.einsum(
            "qh,ch->qc", queries, chunk, precision=jax.lax.Precision.HIGHEST
        )  # [q, block]
        rows = offset + jnp.arange(block)  # [block]
        scores = jnp.where(rows < corpus_size, scores, -jnp.inf)
        k = min(top_k, block)
        chunk_scores, chunk_index = jax.lax.top_k(scores, k)  # [q, k]
        scores = jnp.concatenate([best_scores, chunk_scores], axis=1)  # [q, 2k]
        candidates = jnp.concatenate([best_rows, rows[chunk_index]], axis=1)  # [q, 2k]
        kept, where = jax.lax.top_k(scores, top_k)  # [q, k]
        return (kept, jnp.take_along_axis(candidates, where, axis=1)), None

    rows0 = jnp.zeros((queries.shape[0], top_k), jnp.int32)
    offsets = jnp.arange(blocks, dtype=jnp.int32) * block
    (scores, rows), _ = jax.lax.scan(merge, (first, rows0), (chunks, offsets))
    return scores, rows


def search(
    queries: np.ndarray | jax.Array,
    corpus: np.ndarray | jax.Array,
    top_k: int = 10,
    *,
    query_batch: int = 256,
    corpus_block: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact nearest neighbours by cosine similarity: (scores [n, k], corpus rows [n, k]).

    Best first; k = min(top_k, corpus size). Brute force over the whole corpus, in blocks of
    `corpus_block` rows per batch of `query_batch` queries, so any corpus fits in memory.
    """
    queries = np.asarray(queries, np.float32)
    corpus = np.asarray(corpus, np.float32)
    _check_pair(queries, corpus, "search", ("queries", "corpus"))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r} is invalid: must be an int >= 1")
    count = corpus.shape[0]
    if count == 0:
        raise ValueError("search needs a corpus of at least one vector")
    k = min(top_k, count)
    block = min(corpus_block, 1 << max(count - 1, 0).bit_length())
    padded = -(-count // block) * block
    units = l2_normalize(jnp.asarray(np.pad(corpus, ((0, padded - count), (0, 0)))))
    scores = np.zeros((queries.shape[0], k), np.float32)
    rows = np.zeros((queries.shape[0], k), np.int64)
    for start in range(0, queries.shape[0], query_batch):
        part = queries[start : start + query_batch]
        size = len(part)
        part = np.pad(part, ((0, query_batch - size), (0, 0)))  # one compile for every batch
        s, r = _search_block(l2_normalize(jnp.asarray(part)), units, count, top_k=k, block=block)
        scores[start : start + size] = np.asarray(s)[:size]
        rows[start : start + size] = np.asarray(r)[:size]
    return scores, rows
