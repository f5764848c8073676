"""A small corpus with structure a tiny BERT can learn within a few hundred steps.

Each document has a topic and is a random sequence of that topic's few fixed sentences, so
a masked word is predictable from its neighbours, and a "random next" segment (from another
document, usually of another topic) is distinguishable from the true continuation.
"""

import pathlib

import numpy as np


def write_corpus(
    path: pathlib.Path,
    num_documents: int = 200,
    sentences_per_document: int = 12,
    num_topics: int = 8,
    sentences_per_topic: int = 6,
    seed: int = 0,
) -> pathlib.Path:
    """Writes google-research/bert's format (a sentence per line, blank line between documents)."""
    rng = np.random.default_rng(seed)
    topics = []
    for _ in range(num_topics):
        words = [_pseudo_word(rng) for _ in range(10)]
        topics.append(
            [
                " ".join(rng.choice(words, size=int(rng.integers(5, 9)))) + "."
                for _ in range(sentences_per_topic)
            ]
        )
    lines = []
    for doc in range(num_documents):
        sentences = topics[doc % num_topics]
        lines += [
            sentences[i] for i in rng.integers(0, len(sentences), size=sentences_per_document)
        ]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pseudo_word(rng: np.random.Generator) -> str:
    """A pronounceable made-up word: varied enough for a few hundred sentencepiece pieces."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    return "".join(
        rng.choice(list(consonants)) + rng.choice(list(vowels))
        for _ in range(int(rng.integers(2, 4)))
    )
