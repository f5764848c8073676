"""A small corpus with structure a tiny BERT can learn within a few hundred steps.

Each document has a topic; its sentences are drawn from that topic's words in a fixed
grammar, so masked words are predictable from their neighbours and a "random next" segment
(from another document, so usually another topic) is distinguishable from the true one.
"""

import pathlib

import numpy as np

_DETERMINERS = ["the", "a", "every", "this"]
_VERBS = ["sees", "likes", "finds", "makes", "takes", "keeps"]


def write_corpus(path: pathlib.Path, num_documents: int = 200, sentences_per_document: int = 12,
                 num_topics: int = 8, seed: int = 0) -> pathlib.Path:
    """Writes google-research/bert's format (a sentence per line, blank line between documents)."""
    rng = np.random.default_rng(seed)
    topic_nouns = [[_pseudo_word(rng) for _ in range(12)] for _ in range(num_topics)]
    topic_adjectives = [[_pseudo_word(rng) for _ in range(6)] for _ in range(num_topics)]
    lines = []
    for doc in range(num_documents):
        topic = doc % num_topics
        nouns, adjectives = topic_nouns[topic], topic_adjectives[topic]
        for _ in range(sentences_per_document):
            lines.append(" ".join([
                rng.choice(_DETERMINERS), rng.choice(adjectives), rng.choice(nouns),
                rng.choice(_VERBS), rng.choice(_DETERMINERS), rng.choice(nouns) + "."]))
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pseudo_word(rng: np.random.Generator) -> str:
    """A pronounceable made-up word: varied enough for a few hundred sentencepiece pieces."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    return "".join(rng.choice(list(consonants)) + rng.choice(list(vowels))
                   for _ in range(int(rng.integers(2, 4))))
