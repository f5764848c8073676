"""What the test tiers share and no test file owns: synthetic corpora and tasks, tokenizers
of every kind, random parameters, batches, model and directory factories, the GCS emulator
and its fault proxy, and how the suite's processes compile (xla_env, imported by conftest.py
before jax). Every tier imports from here; no test file imports another.

Nothing here imports torch or transformers at module level except `torch_reference`, which
only the parity and integration tiers import, so `pytest tests/unit` never pays for them.
"""
