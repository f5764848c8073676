"""prepare: end to end, worker-count independence, eval split by document, manifest, storage."""

import importlib
import json
import re

import numpy as np
import pytest

from bertjax.data import read_manifest
from bertjax.data.storage import SplitReader, shard_paths, token_dtype
from bertjax.tokenizer import Tokenizer

# bertjax.data.prepare the attribute is the function; the module is reached by its name.
prepare_lib = importlib.import_module("bertjax.data.prepare")
NUM_DOCUMENTS = 240


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


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepare")
    corpus = write_corpus(root / "corpus.txt")
    kwargs = dict(
        max_seq_length=64, max_predictions_per_seq=10, eval_fraction=0.2, seed=7, chunk_mb=0.02
    )
    one = prepare_lib.prepare([str(corpus)], root / "one", vocab_size=400, workers=1, **kwargs)
    two = prepare_lib.prepare(
        [str(corpus)],
        root / "two",
        tokenizer_path=root / "one" / "tokenizer.model",
        workers=2,
        **kwargs,
    )
    return root, corpus, one, two


def shard_files(directory):
    return sorted(p.relative_to(directory) for p in directory.glob("*/shard-*.npy"))


def test_worker_count_does_not_change_the_shards(prepared):
    root, _, one, two = prepared
    assert one["num_chunks"] > 2, "the test corpus must span several chunks"
    files = shard_files(root / "one")
    assert files and files == shard_files(root / "two")
    for name in files:
        assert (root / "one" / name).read_bytes() == (root / "two" / name).read_bytes(), name
    assert one["splits"] == two["splits"]
    tokenizers = [(root / run / "tokenizer.model").read_bytes() for run in ("one", "two")]
    assert tokenizers[0] == tokenizers[1]


def test_manifest_contents(prepared):
    root, corpus, one, _ = prepared
    manifest = read_manifest(root / "one")
    assert manifest == json.loads(json.dumps(one))
    assert not list(root.glob("one/**/*.tmp"))
    tokenizer = Tokenizer.load(root / "one" / "tokenizer.model")
    assert manifest["tokenizer_fingerprint"] == tokenizer.fingerprint
    assert manifest["vocab_size"] == tokenizer.vocab_size == 400
    assert manifest["max_seq_length"] == 64 and manifest["max_predictions_per_seq"] == 10
    assert manifest["format_version"] == 1 and manifest["token_dtype"] == "uint16"
    assert manifest["input_report"]["documents"] == NUM_DOCUMENTS
    assert manifest["settings"]["eval_fraction"] == 0.2 and manifest["settings"]["seed"] == 7
    splits = manifest["splits"]
    assert splits["train"]["num_documents"] + splits["eval"]["num_documents"] == NUM_DOCUMENTS
    for split in ("train", "eval"):
        shards = splits[split]["shards"]
        assert splits[split]["num_instances"] == sum(s["num_instances"] for s in shards) > 0
        assert all(s["max_length"] <= 64 for s in shards)


def test_uint16_storage_and_layout(prepared):
    root, _, one, _ = prepared
    shard = one["splits"]["train"]["shards"][0]
    tokens_path, index_path = shard_paths(root / "one", "train", shard["name"])
    tokens = np.load(tokens_path, mmap_mode="r")
    assert tokens.dtype == np.uint16 and len(tokens) == shard["num_tokens"]
    index = np.load(index_path)
    assert index.shape == (shard["num_instances"], 4)
    start, length, b_start, label = index[0]
    instance = np.asarray(tokens[start : start + length])
    assert instance[0] == Tokenizer.cls_id and instance[-1] == Tokenizer.sep_id
    assert instance[b_start - 1] == Tokenizer.sep_id and label in (0, 1)
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.int32


def document_tags(data_dir, manifest, split, tokenizer):
    reader = SplitReader(data_dir, split, manifest["splits"][split]["shards"])
    features = reader.gather(np.arange(len(reader)), manifest["max_seq_length"])
    tags = set()
    for ids, mask in zip(features["input_ids"], features["input_mask"]):
        text = tokenizer.decode(ids[mask == 1])
        tags.update(int(t) for t in re.findall(r"(?<![0-9])q(\d+)q", text))
    return tags


def test_eval_split_is_disjoint_by_document(prepared):
    root, _, one, _ = prepared
    tokenizer = Tokenizer.load(root / "one" / "tokenizer.model")
    train = document_tags(root / "one", one, "train", tokenizer)
    evaluation = document_tags(root / "one", one, "eval", tokenizer)
    assert len(train) > 50 and len(evaluation) > 10
    assert not train & evaluation
    expected_eval = {d for d in range(NUM_DOCUMENTS) if prepare_lib.is_eval_document(d, 7, 0.2)}
    assert evaluation <= expected_eval and not train & expected_eval


def test_bad_path_fails_before_touching_the_output(tmp_path, prepared):
    root, _, _, _ = prepared
    with pytest.raises(FileNotFoundError, match="no_such_corpus"):
        prepare_lib.prepare([str(tmp_path / "no_such_corpus.txt")], root / "one", workers=1)
    assert (root / "one" / "manifest.json").is_file()
    with pytest.raises(FileNotFoundError, match="run `python -m bertjax.data.prepare"):
        read_manifest(tmp_path / "never_prepared")
    with pytest.raises(ValueError, match="eval_fraction"):
        prepare_lib.prepare([str(tmp_path)], tmp_path / "out", eval_fraction=1.5)


def test_failed_prepare_leaves_no_manifest(tmp_path, prepared):
    root, corpus, _, _ = prepared
    out = tmp_path / "out"
    tokenizer = root / "one" / "tokenizer.model"
    prepare_lib.main(
        [
            "--input",
            str(corpus),
            "--output",
            str(out),
            "--tokenizer",
            str(tokenizer),
            "--workers",
            "1",
            "--max_seq_length",
            "32",
            "--task",
            "sop",
            "--dupe_factor",
            "2",
        ]
    )
    manifest = read_manifest(out)
    assert manifest["max_seq_length"] == 32 and manifest["settings"]["task"] == "sop"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="no text"):
        prepare_lib.prepare([str(empty)], out, tokenizer_path=tokenizer, workers=1)
    with pytest.raises(FileNotFoundError, match="did not finish"):
        read_manifest(out)
