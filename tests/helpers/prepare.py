"""Shared by the tests of prepare in every tier (moved from test_prepare.py)."""

import pathlib

import numpy as np

NUM_DOCUMENTS = 240


ROOT = pathlib.Path(__file__).resolve().parents[2]


def write_corpus(path, num_documents=NUM_DOCUMENTS, seed=0):
    """Google's format; every sentence carries its document's tag "q<index>q"."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(800)]
    lines = []
    for d in range(num_documents):
        for _ in range(rng.integers(2, 10)):
            body = " ".join(rng.choice(words, size=rng.integers(4, 20)))
            lines.append(f"q{d}q {body}.")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path
