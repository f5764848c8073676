"""Pretraining data on gs:// (the emulator): inputs, prepared output, the streaming loader,
the demo corpus, and the one-line errors of a missing bucket or object."""

import gzip
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertjax.data import MaskingSettings, demo_corpus_path, make_loader, prepare, read_manifest
from bertjax.data import demo_corpus as demo_corpus_lib
from bertjax.data.corpus import InputReport, ReadSettings, expand_paths, read_documents
from bertjax.data.loader import REMOTE_READ_AHEAD
from bertjax.data.mixture import Source, make_mixture_loader
from bertjax.data.storage import RemoteTokens
from bertjax.pretrain.data import ensure_sources
from bertjax.pretrain.settings import PretrainSettings
from bertjax.storage import fs
from configs import tiny
from tests.helpers.corpora import write_random_corpus
from tests.helpers.loader_batches import assert_same, take

SEQ_LEN = 48
BATCH = 8


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> pathlib.Path:
    """A directory of three inputs, one of each format: text, gzipped text, JSON Lines."""
    root = tmp_path_factory.mktemp("gcs_corpus") / "corpus"
    root.mkdir()
    write_random_corpus(root / "a.txt", 120, seed=1)
    plain = write_random_corpus(root / "b.tmp", 80, seed=2)
    (root / "b.txt.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    rng = np.random.default_rng(3)
    with open(root / "c.jsonl", "w") as f:
        for d in range(60):
            words = [f"w{int(x)}" for x in rng.integers(0, 300, size=40)]
            text = ". ".join(" ".join(words[i : i + 8]) for i in range(0, 40, 8)) + "."
            f.write(json.dumps({"text": f"Doc {d}. {text}"}) + "\n")
    return root


def upload(gcs, local: pathlib.Path, remote: str) -> None:
    """Copies a local directory tree to gs:// (what `gcloud storage cp -r` would do)."""
    for file in sorted(local.rglob("*")):
        if file.is_file():
            gcs.fs.pipe_file(
                f"{remote[len('gs://') :]}/{file.relative_to(local).as_posix()}", file.read_bytes()
            )
    gcs.fs.invalidate_cache()


def prepare_kwargs():
    return dict(
        max_seq_length=SEQ_LEN,
        vocab_size=300,
        workers=1,
        eval_fraction=0.1,
        seed=5,
        chunk_mb=0.01,
        verbose=False,
    )


@pytest.fixture(scope="module")
def local_data(corpus_dir) -> pathlib.Path:
    out = corpus_dir.parent / "prepared"
    prepare([str(corpus_dir)], out, **prepare_kwargs())
    return out


@pytest.fixture(scope="module")
def remote_data(gcs, local_data) -> str:
    """A gs:// copy of the locally prepared directory."""
    remote = f"{gcs.bucket()}/prepared"
    upload(gcs, local_data, remote)
    return remote


def test_expand_paths_finds_gcs_files_globs_and_directories(gcs, corpus_dir):
    bucket = gcs.bucket()
    upload(gcs, corpus_dir, f"{bucket}/in")
    gcs.fs.pipe_file(f"{bucket[5:]}/in/.hidden/skip.txt", b"never read\n")
    names = [f.name for f in expand_paths([f"{bucket}/in"])]
    assert names == ["a.txt", "b.txt.gz", "c.jsonl"]
    assert [f.name for f in expand_paths([f"{bucket}/in/*.txt*"])] == ["a.txt", "b.txt.gz"]
    assert [str(f) for f in expand_paths([f"{bucket}/in/c.jsonl"])] == [f"{bucket}/in/c.jsonl"]
    # The same documents as from the local copy, every format decoded the same way.
    local, remote = InputReport(), InputReport()
    assert list(read_documents([f"{bucket}/in"], remote)) == list(
        read_documents([str(corpus_dir)], local)
    )
    assert remote.files == local.files == 3 and remote.bytes == local.bytes


def test_shipped_formats_read_from_gcs_as_from_disk(gcs, tmp_path):
    """Parquet, zstd and gzip JSON Lines on gs:// (globs and a directory), a nested text field:
    the documents of their local JSON Lines."""
    records = [
        {"id": i, "meta": {"body": f"Document {i}. Words {i * 3} and more."}} for i in range(300)
    ]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    (tmp_path / "all.jsonl").write_bytes(data)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    (shipped / "b.json.gz").write_bytes(gzip.compress(data))
    table = pa.table({"id": [r["id"] for r in records], "meta": [r["meta"] for r in records]})
    pq.write_table(table, shipped / "c.parquet", row_group_size=100)
    bucket = gcs.bucket()
    upload(gcs, shipped, f"{bucket}/shipped")
    settings = ReadSettings(text_field="meta.body", id_field="id")

    def documents(paths):
        report = InputReport()
        return list(read_documents(paths, report, settings=settings)), report

    expected, _ = documents([str(tmp_path / "all.jsonl")])
    for name in ("a.jsonl.zst", "b.json.gz", "c.parquet"):
        assert documents([f"{bucket}/shipped/{name[0]}.*"])[0] == expected, name
    remote, report = documents([f"{bucket}/shipped"])
    assert remote == expected * 3 and report.problems == {}
    local_report = documents([str(shipped)])[1]
    assert report.bytes == local_report.bytes and report.documents == 900


def test_prepare_from_and_to_gcs_writes_the_local_bytes(gcs, corpus_dir, local_data):
    bucket = gcs.bucket()
    upload(gcs, corpus_dir, f"{bucket}/in")
    out = f"{bucket}/data"
    manifest = prepare([f"{bucket}/in/*"], out, **prepare_kwargs())
    local_manifest = read_manifest(local_data)
    assert manifest["num_chunks"] > 2  # several shards, so their order is checked too
    assert manifest["splits"] == local_manifest["splits"]
    assert manifest["tokenizer_fingerprint"] == local_manifest["tokenizer_fingerprint"]
    # Every file the local prepare wrote, byte for byte, except the manifest, which names
    # the inputs by their paths.
    local_files = sorted(
        p.relative_to(local_data).as_posix() for p in local_data.rglob("*") if p.is_file()
    )
    gcs.fs.invalidate_cache()
    remote_files = sorted(p[len(out) - 5 + 1 :] for p in gcs.fs.find(out[5:]))
    assert remote_files == local_files
    for name in local_files:
        if name != "manifest.json":
            assert gcs.fs.cat_file(f"{out[5:]}/{name}") == (local_data / name).read_bytes(), name
    assert read_manifest(out) == manifest


def loaders(local_data, remote_data, **kwargs):
    kwargs = dict(batch_size=BATCH, seed=11, masking=MaskingSettings(), **kwargs)
    return make_loader(local_data, **kwargs), make_loader(remote_data, **kwargs)


def test_gcs_loader_streams_the_local_batches_and_resumes(local_data, remote_data):
    local, remote = loaders(local_data, remote_data)
    assert local.remote_tokens is None and remote.remote_tokens is not None
    steps = local.batches_per_epoch + 3  # across an epoch boundary
    expected = take(local, steps)
    assert_same(take(remote, steps), expected)

    # Resume at step k: a fresh gs:// loader given the position continues exactly.
    k = 5
    local_again, _ = loaders(local_data, remote_data)
    take(local_again, k)
    state = json.loads(json.dumps(local_again.get_state()))
    _, resumed = loaders(local_data, remote_data)
    resumed.set_state(state)
    assert_same(take(resumed, steps - k), expected[k:])


def test_gcs_mixture_streams_the_local_batches(local_data, remote_data):
    """A mixture of prepared sources on gs:// (read by byte ranges), or of one on disk and one
    on gs://, gives the batches of the same sources on disk."""

    def mixture(first, second):
        sources = [(Source("a", ("a",), 0.7), first), (Source("b", ("b",), 0.3), second)]
        return make_mixture_loader(
            sources, batch_size=BATCH, seed=4, process_index=0, process_count=1, log=print
        )

    local, remote = mixture(local_data, local_data), mixture(remote_data, remote_data)
    assert local.remote_tokens is None and remote.remote_tokens is not None
    expected = take(local, 6)
    assert_same(take(remote, 6), expected)
    assert remote.remote_tokens.bytes_read > 0  # by byte ranges, nothing downloaded whole
    # Source a from disk, source b from gs://: only b's rows are fetched.
    mixed = mixture(local_data, remote_data)
    assert_same(take(mixed, 6), expected)
    assert 0 < mixed.remote_tokens.bytes_read < remote.remote_tokens.bytes_read
    assert len(mixed.remote_tokens.paths) == len(remote.remote_tokens.paths) // 2


def test_mixture_of_a_local_and_a_gcs_source_trains_from_both(gcs, corpus_dir, tmp_path):
    """data.sources naming a local corpus and one on gs://: the tokenizer is trained on both,
    each is prepared (into the run's directory) and the mixture draws from both."""
    bucket = gcs.bucket()
    upload(gcs, corpus_dir, f"{bucket}/in")
    config = tiny.get_config()
    config.data.update(
        sources=f"near={corpus_dir / 'a.txt'}:0.5,far={bucket}/in/c.jsonl:0.5",
        vocab_size=300,
        max_seq_length=SEQ_LEN,
        max_predictions_per_seq=8,
        eval_fraction=0.1,
        dupe_factor=1,
    )
    settings = PretrainSettings.from_config(config)
    prepared, tokenizer = ensure_sources(settings.data, tmp_path / "run", eval_batch_size=4, seed=0)
    assert [p.source.name for p in prepared] == ["near", "far"]
    # Digits appear in the far source's words ("w123") alone: a tokenizer of the near one
    # would spell them in byte-fallback pieces.
    pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode("w123 w45 w6")]
    assert not any(piece.startswith("<0x") for piece in pieces), pieces
    loader = make_mixture_loader(
        [(p.source, p.dir) for p in prepared],
        batch_size=BATCH,
        seed=0,
        process_index=0,
        process_count=1,
        log=print,
    )
    take(loader, 4)
    assert loader.shares() == {"near": 0.5, "far": 0.5}


@pytest.mark.parametrize("gap", [0, RemoteTokens.MERGE_GAP_BYTES])
def test_gcs_loader_holds_a_bounded_number_of_bytes(local_data, remote_data, monkeypatch, gap):
    """It reads the instances of the batches it makes (plus a bounded read-ahead and the gaps
    it merges over), not the token files: the bytes in flight at once stay under what the
    read-ahead threads' batches can hold; without merging, after a few batches it has read
    a small part of the files."""
    monkeypatch.setattr(RemoteTokens, "MERGE_GAP_BYTES", gap)
    _, remote = loaders(local_data, remote_data)
    manifest = read_manifest(local_data)
    token_bytes = sum(
        f.stat().st_size for f in (pathlib.Path(local_data) / "train").glob("*.tokens.npy")
    )
    itemsize = np.dtype(manifest["token_dtype"]).itemsize
    # The most one batch reads: its instances, and the gaps between them it reads over.
    batch_bytes = BATCH * SEQ_LEN * itemsize + (BATCH - 1) * gap
    take(remote, 3)
    tokens = remote.remote_tokens
    # Made so far: the 3 taken plus at most the prefetch buffer (2 per thread) and one per thread.
    made_at_most = 3 + 3 * REMOTE_READ_AHEAD
    assert 0 < tokens.bytes_read <= made_at_most * batch_bytes
    assert 0 < tokens.peak_bytes <= REMOTE_READ_AHEAD * batch_bytes
    if gap == 0:
        assert tokens.bytes_read < token_bytes / 3
    remote.close()  # waits for the batches being made: nothing is left in flight
    assert tokens.held_bytes == 0


def test_gcs_eval_pass_reads_each_token_once(local_data, remote_data):
    """Unshuffled, one pass over the split reads the split's bytes once: touching runs of a
    batch merge into one range, and nothing is read twice or beyond the instances."""
    local, remote = loaders(
        local_data, remote_data, split="eval", shuffle=False, num_epochs=1, worker_count=0
    )
    assert_same(list(remote), list(local))
    manifest = read_manifest(local_data)
    used = local.batches_per_epoch * BATCH
    lengths = np.concatenate(
        [
            np.load(pathlib.Path(local_data) / "eval" / f"{s['name']}.index.npy")[:, 1]
            for s in manifest["splits"]["eval"]["shards"]
        ]
    )
    itemsize = np.dtype(manifest["token_dtype"]).itemsize
    assert remote.remote_tokens.bytes_read == int(lengths[:used].sum()) * itemsize


def test_demo_corpus_into_gcs(gcs, demo_corpus, monkeypatch):
    # The documents are the session's local build, replayed: building them again parses the
    # whole standard library (about 9 s), and test_corpus.py checks that a build is
    # deterministic. What is checked here is the write into GCS and the reuse from there.
    text = demo_corpus.read_text(encoding="utf-8")
    replayed = [document.split("\n") for document in text.rstrip("\n").split("\n\n")]
    monkeypatch.setattr(demo_corpus_lib, "demo_documents", lambda: iter(replayed))
    cache = f"{gcs.bucket()}/run/corpus"
    path = demo_corpus_path(cache)
    assert str(path).startswith(cache)
    assert fs.read_bytes(path) == pathlib.Path(demo_corpus).read_bytes()
    updated = gcs.fs.info(str(path)[5:])["updated"]
    assert demo_corpus_path(cache) == path  # reused, not written again
    assert gcs.fs.info(str(path)[5:])["updated"] == updated


def test_missing_bucket_and_object_are_one_line_errors(gcs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fs.StorageError, match=r"gs://no-such-bucket-x1 does not exist"):
        expand_paths(["gs://no-such-bucket-x1/corpus/*.txt"])
    with pytest.raises(fs.StorageError, match=r"gs://no-such-bucket-x1 does not exist"):
        read_manifest("gs://no-such-bucket-x1/data")
    bucket = gcs.bucket()
    with pytest.raises(FileNotFoundError, match=rf"input path '{bucket}/none.txt' does not"):
        expand_paths([f"{bucket}/none.txt"])
    with pytest.raises(FileNotFoundError, match=rf"Prepared data directory '{bucket}/data' does"):
        read_manifest(f"{bucket}/data")
    with pytest.raises(fs.StorageError, match="no-such-bucket-x1"):
        prepare(["gs://no-such-bucket-x1/in.txt"], "gs://no-such-bucket-x1/out")
    assert not list(tmp_path.iterdir())  # nothing local under a mangled name ("gs:")


def test_gcs_prepare_with_a_missing_shard_names_it(gcs, local_data):
    remote = f"{gcs.bucket()}/prepared"
    upload(gcs, local_data, remote)
    shard = read_manifest(local_data)["splits"]["train"]["shards"][1]["name"]
    gcs.fs.rm(f"{remote[5:]}/train/{shard}.tokens.npy")
    gcs.fs.invalidate_cache()
    with pytest.raises(FileNotFoundError, match=rf"{shard}.tokens.npy"):
        make_loader(remote, batch_size=BATCH)
