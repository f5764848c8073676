"""prepare: end to end, worker-count independence, eval split by document, manifest, storage."""

import importlib
import json
import re

import numpy as np
import pytest

from bertjax.data import read_manifest
from bertjax.data.corpus import InputReport, read_documents
from bertjax.data.instances import InstanceSettings, create_instances, tokenize_documents
from bertjax.data.storage import SplitReader, shard_paths, token_dtype
from bertjax.text.tokenizer import Tokenizer
from tests.helpers.prepare import NUM_DOCUMENTS, write_corpus

# bertjax.data.prepare the attribute is the function; the module is reached by its name.
prepare_lib = importlib.import_module("bertjax.data.prepare")


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


# ----------------------------------------------------------------------------- eval NSP pairs


def nsp_pairs(data_dir, manifest, split, tokenizer, corpus):
    """(label, document of A, document of B) of each instance of a split; a document is the
    index of the one corpus document whose text holds the segment's decoded text."""
    documents = corpus.read_text().strip().split("\n\n")
    text = "\n".join(" ".join(document.split("\n")) for document in documents)
    starts = np.cumsum([0] + [len(d) + 1 for d in documents])

    def source(segment):
        position = text.find(tokenizer.decode(segment, skip_special=True).strip())
        assert position >= 0
        return int(np.searchsorted(starts, position, side="right")) - 1

    reader = SplitReader(data_dir, split, manifest["splits"][split]["shards"])
    features = reader.gather(np.arange(len(reader)), manifest["max_seq_length"])
    pairs = []
    for ids, segments, mask, label in zip(
        features["input_ids"],
        features["segment_ids"],
        features["input_mask"],
        features["next_sentence_labels"],
    ):
        a, b = ids[(mask == 1) & (segments == 0)], ids[segments == 1]
        pairs.append((int(label), source(a), source(b)))
    return pairs


def test_eval_random_next_segments_come_from_the_whole_eval_split(tmp_path, prepared):
    """Chunks of about ten documents hold one eval document or none: drawing random next
    segments within a chunk left eval with a label-1 rate of 0.44 against train's 0.83."""
    root, _, _, _ = prepared
    num_documents = 1000
    corpus = write_corpus(tmp_path / "corpus.txt", num_documents=num_documents)
    manifest = prepare_lib.prepare(
        [str(corpus)],
        tmp_path / "out",
        tokenizer_path=root / "one" / "tokenizer.model",
        workers=1,
        max_seq_length=64,
        max_predictions_per_seq=10,
        eval_fraction=0.05,
        dupe_factor=5,
        seed=7,
        chunk_mb=0.004,
        verbose=False,
    )
    assert manifest["num_chunks"] > 80 and manifest["splits"]["eval"]["num_documents"] < 60
    tokenizer = Tokenizer.load(root / "one" / "tokenizer.model")
    labels = {
        split: SplitReader(tmp_path / "out", split, manifest["splits"][split]["shards"]).label
        for split in ("train", "eval")
    }
    rates = {split: labels[split].mean() for split in labels}
    noise = np.sqrt(sum(rates[s] * (1 - rates[s]) / len(labels[s]) for s in labels))
    assert len(labels["eval"]) > 800 and abs(rates["eval"] - rates["train"]) < 3 * noise, rates
    eval_documents = {d for d in range(num_documents) if prepare_lib.is_eval_document(d, 7, 0.05)}
    for label, a_document, b_document in nsp_pairs(
        tmp_path / "out", manifest, "eval", tokenizer, corpus
    ):
        assert a_document in eval_documents and b_document in eval_documents
        assert (a_document != b_document) == (label == 1)


def test_eval_split_does_not_depend_on_the_chunk_size(tmp_path, prepared):
    root, corpus, one, _ = prepared
    whole = prepare_lib.prepare(
        [str(corpus)],
        tmp_path / "whole",
        tokenizer_path=root / "one" / "tokenizer.model",
        workers=1,
        max_seq_length=64,
        max_predictions_per_seq=10,
        eval_fraction=0.2,
        seed=7,
        chunk_mb=4.0,
        verbose=False,
    )
    assert whole["num_chunks"] == 1 < one["num_chunks"]
    assert whole["splits"]["eval"] == one["splits"]["eval"]
    for path in (root / "one" / "eval").iterdir():
        assert path.read_bytes() == (tmp_path / "whole" / "eval" / path.name).read_bytes()


def test_train_instances_are_made_per_chunk_from_the_chunks_own_documents(tmp_path, prepared):
    """Train shard k holds the instances of chunk k's train documents, drawn with seed (seed, k)."""
    root, corpus, one, _ = prepared
    tokenizer = Tokenizer.load(root / "one" / "tokenizer.model")
    settings = InstanceSettings(max_seq_length=64)
    chunks = prepare_lib._chunks(read_documents([corpus], InputReport()), 20_000, 7, 0.2)
    shards = {s["name"]: s for s in one["splits"]["train"]["shards"]}
    for index, parts, _ in chunks:
        rng = np.random.default_rng([7, index, 0])
        expected = create_instances(
            tokenize_documents(parts["train"], tokenizer), settings, rng, 2, 3
        )
        tokens_path, index_path = shard_paths(root / "one", "train", f"shard-{index:05d}")
        assert shards[f"shard-{index:05d}"]["num_instances"] == expected.num_instances
        assert np.array_equal(np.load(tokens_path), expected.tokens)
        layout = np.load(index_path)
        assert np.array_equal(layout[:, 3], expected.next_sentence_labels)
        assert np.array_equal(layout[:, 2], expected.segment_b_start)


# ----------------------------------------------------------------------------- bad input


def test_binary_files_are_skipped_and_the_text_is_prepared(tmp_path, prepared):
    """Random bytes and an image beside the corpus: at a small vocabulary, prepare used to fail
    in sentencepiece; now they are skipped and named, and the text is prepared."""
    _, corpus, _, _ = prepared
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "corpus.txt").write_bytes(corpus.read_bytes())
    rng = np.random.default_rng(1)
    (inputs / "noise.bin").write_bytes(rng.bytes(200_000))
    (inputs / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + rng.bytes(50_000))
    manifest = prepare_lib.prepare(
        [str(inputs)], tmp_path / "out", vocab_size=400, workers=1, seed=7, verbose=False
    )
    report = manifest["input_report"]
    assert report["documents"] == NUM_DOCUMENTS and report["binary_files"] == 2
    assert report["places"]["binary_files"] == [
        f"{inputs / 'noise.bin'} (not UTF-8 text: 44% of the first 65536 bytes do not decode)",
        f"{inputs / 'photo.png'} (a PNG image)",
    ]
    tokenizer = Tokenizer.load(tmp_path / "out" / "tokenizer.model")
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    assert not [p for p in pieces if "\ufffd" in p]


def test_vocabulary_too_large_for_the_corpus_says_the_largest_that_works(tmp_path):
    corpus = write_corpus(tmp_path / "small.txt", num_documents=12)
    with pytest.raises(ValueError) as failure:
        prepare_lib.prepare([str(corpus)], tmp_path / "out", vocab_size=8000, workers=1)
    message = str(failure.value)
    match = re.fullmatch(
        rf"vocab_size=8000 is too large for the corpus {re.escape(str(corpus))}: its text "
        r"yields at most (\d+) pieces; use vocab_size <= (\d+), or more text\.",
        message,
    )
    assert match and match.group(1) == match.group(2), message
    largest = int(match.group(1))
    manifest = prepare_lib.prepare(
        [str(corpus)], tmp_path / "out", vocab_size=largest, workers=1, verbose=False
    )
    assert manifest["vocab_size"] == largest


def test_vocabulary_too_small_for_the_characters_says_the_smallest_that_works(tmp_path):
    rng = np.random.default_rng(0)
    characters = np.array([chr(0x4E00 + i) for i in range(600)])
    lines = ["".join(rng.choice(characters, size=30)) + "。" for _ in range(300)]
    corpus = tmp_path / "cjk.txt"
    corpus.write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as failure:
        prepare_lib.prepare([str(corpus)], tmp_path / "out", vocab_size=320, workers=1)
    match = re.fullmatch(
        rf"vocab_size=320 is too small for the corpus {re.escape(str(corpus))}: covering its "
        r"characters takes (\d+) pieces; use vocab_size >= (\d+)\.",
        str(failure.value),
    )
    assert match and match.group(1) == match.group(2), str(failure.value)
    smallest = int(match.group(1))
    manifest = prepare_lib.prepare(
        [str(corpus)], tmp_path / "out", vocab_size=smallest, workers=1, verbose=False
    )
    assert manifest["vocab_size"] == smallest
