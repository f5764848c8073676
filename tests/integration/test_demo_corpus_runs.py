"""The demo corpus built twice: the same bytes (tests/unit/test_corpus.py checks the session's
build, its reuse and the documents it starts with; each build parses the standard library)."""

import os

import pytest

from bertjax.data.demo_corpus import demo_corpus_path


@pytest.mark.slow
def test_demo_corpus_builds_the_same_bytes_in_another_cache(tmp_path, demo_corpus):
    path = demo_corpus_path(tmp_path / "cache")
    assert path.name == demo_corpus.name and path.parent != demo_corpus.parent
    assert path.read_bytes() == demo_corpus.read_bytes()
    assert not [p for p in os.listdir(tmp_path / "cache") if p.endswith(".tmp")]
    mtime = path.stat().st_mtime_ns
    assert demo_corpus_path(tmp_path / "cache") == path  # reused, not rebuilt
    assert path.stat().st_mtime_ns == mtime
