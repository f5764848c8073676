"""The integration tests of test_hf.py (tests/parity/), with its helpers."""

import os
import pathlib
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_import_needs_neither_torch_nor_transformers_nor_the_seq2seq_metrics():
    # torch and transformers only for an exchange with them; rouge-score (and the nltk it
    # imports, seconds of every process's start) only when a seq2seq evaluation scores.
    code = (
        "import sys, bertjax, bertjax.storage.hf; "
        "heavy = {'torch', 'transformers', 'rouge_score', 'nltk', 'sacrebleu'}; "
        "assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
