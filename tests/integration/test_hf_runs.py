"""The integration tests of test_hf.py (tests/parity/), with its helpers."""

import os
import pathlib
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_import_needs_neither_torch_nor_transformers():
    code = (
        "import sys, bertjax.hf; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
        "sorted(sys.modules)"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
