"""prepare spread over two processes (jax.distributed on CPU): the same bytes as one process."""

import re

import pytest

from bertjax.data import prepare, read_manifest
from tests.helpers.prepare_distributed import (
    corpus,  # noqa: F401 (fixtures)
    files_of,
    prepare_in_processes,
    single_process,
)


@pytest.mark.slow
def test_two_processes_write_the_single_process_bytes(corpus, tmp_path):
    manifest = single_process(corpus, tmp_path / "one")
    assert manifest["num_chunks"] >= 4  # both processes get several chunks
    outputs = prepare_in_processes([str(corpus)], str(tmp_path / "two"), 2)
    share = re.search(r"Process 1: prepared (\d+) of (\d+) chunks", outputs[1])
    assert share and int(share.group(1)) == manifest["num_chunks"] // 2  # odd chunk indices
    assert "x 2 process(es)" in outputs[0]
    # Every file (tokenizer, shards of both splits, manifest) byte for byte; no records left.
    assert files_of(tmp_path / "two") == files_of(tmp_path / "one")
    assert not (tmp_path / "two" / ".parts").exists()


@pytest.mark.slow
def test_two_processes_prepare_into_gcs(gcs, corpus, tmp_path):
    manifest = single_process(corpus, tmp_path / "one")
    out = f"{gcs.bucket()}/data"
    prepare_in_processes([str(corpus)], out, 2)
    gcs.fs.invalidate_cache()
    remote = {p[len(out) - 5 + 1 :]: gcs.fs.cat_file(p) for p in gcs.fs.find(out[5:])}
    assert remote == files_of(tmp_path / "one")
    assert read_manifest(out) == manifest


def test_process_count_without_a_distributed_job_is_refused(corpus, tmp_path):
    with pytest.raises(ValueError, match=r"process_count=2 but jax.distributed runs 1"):
        prepare([str(corpus)], tmp_path / "out", process_index=1, process_count=2)
    with pytest.raises(ValueError, match=r"process_index=2 is invalid for process_count=2"):
        prepare([str(corpus)], tmp_path / "out", process_index=2, process_count=2)
    assert not (tmp_path / "out").exists()
