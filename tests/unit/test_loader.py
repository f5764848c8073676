"""Loader: determinism, resume, per-process shards, epochs, worker threads, checks on the data."""

import json

import numpy as np
import pytest

from bertjax.data import MaskingSettings, make_loader, prepare
from tests.helpers.corpora import write_random_corpus
from tests.helpers.loader_batches import assert_same, originals, take

NUM_DOCUMENTS = 200


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    corpus = write_random_corpus(root / "corpus.txt", NUM_DOCUMENTS, seed=1, vocabulary=600)
    prepare(
        [str(corpus)],
        root / "data",
        max_seq_length=48,
        vocab_size=350,
        workers=1,
        eval_fraction=0.15,
        seed=3,
        chunk_mb=0.03,
        verbose=False,
    )
    return root / "data"


def test_batch_features(data_dir):
    loader = make_loader(data_dir, batch_size=8, process_index=0, process_count=1)
    batch = next(loader)
    expected = {
        "input_ids": ((8, 48), np.int32),
        "input_mask": ((8, 48), np.int32),
        "segment_ids": ((8, 48), np.int32),
        "masked_lm_positions": ((8, 20), np.int32),
        "masked_lm_ids": ((8, 20), np.int32),
        "masked_lm_weights": ((8, 20), np.float32),
        "next_sentence_labels": ((8,), np.int32),
    }
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expected
    ids, mask, segments = originals(batch), batch["input_mask"], batch["segment_ids"]
    lengths = mask.sum(1)
    assert np.all(ids[:, 0] == loader.tokenizer.cls_id)
    assert np.all(ids[np.arange(8), lengths - 1] == loader.tokenizer.sep_id)
    assert np.all(ids[mask == 0] == 0) and np.all(segments[mask == 0] == 0)
    # Segment 1 starts right after the first [SEP].
    first_sep = np.argmax(ids == loader.tokenizer.sep_id, axis=1)
    np.testing.assert_array_equal(np.argmax(segments, axis=1), first_sep + 1)
    assert np.all(batch["masked_lm_weights"].sum(1) >= 1)
    assert loader.max_seq_length == 48 and loader.max_predictions_per_seq == 20


def test_deterministic_and_seeded(data_dir):
    a = take(make_loader(data_dir, batch_size=8, seed=1, process_count=1, process_index=0), 3)
    b = take(make_loader(data_dir, batch_size=8, seed=1, process_count=1, process_index=0), 3)
    c = take(make_loader(data_dir, batch_size=8, seed=2, process_count=1, process_index=0), 3)
    assert_same(a, b)
    assert not np.array_equal(originals(a[0]), originals(c[0]))


def test_resume_from_state_continues_exactly(data_dir):
    kwargs = dict(batch_size=128, seed=5, process_count=1, process_index=0)
    loader = make_loader(data_dir, **kwargs)
    assert loader.batches_per_epoch < 10, "the ten batches must cross an epoch boundary"
    batches = take(loader, 4)
    state = json.loads(json.dumps(loader.get_state()))
    batches += take(loader, 6)
    fresh = make_loader(data_dir, **kwargs)
    fresh.set_state(state)
    assert_same(take(fresh, 6), batches[4:])
    with pytest.raises(ValueError, match="seed"):
        make_loader(data_dir, **{**kwargs, "seed": 6}).set_state(state)


def test_processes_read_disjoint_shares_that_cover_the_epoch(data_dir):
    single = make_loader(data_dir, batch_size=16, num_epochs=1, process_count=1, process_index=0)
    shares = [
        make_loader(data_dir, batch_size=8, num_epochs=1, process_count=2, process_index=p)
        for p in range(2)
    ]
    whole = [originals(b) for b in single]
    parts = [[originals(b) for b in loader] for loader in shares]
    assert len(whole) == len(parts[0]) == len(parts[1]) == single.batches_per_epoch > 2
    seen = []
    for g, batch in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([parts[0][g], parts[1][g]]), batch)
        seen.extend(map(bytes, batch))
    assert len(set(seen)) == len(seen) == single.batches_per_epoch * 16


def test_masking_does_not_depend_on_the_process_split(data_dir):
    single = make_loader(data_dir, batch_size=16, num_epochs=1, process_count=1, process_index=0)
    shares = [
        make_loader(data_dir, batch_size=8, num_epochs=1, process_count=2, process_index=p)
        for p in range(2)
    ]
    for whole, first, second in zip(single, *shares):
        for name, value in whole.items():
            np.testing.assert_array_equal(
                np.concatenate([first[name], second[name]]), value, err_msg=name
            )


def test_new_order_each_epoch(data_dir):
    loader = make_loader(data_dir, batch_size=32, num_epochs=2, process_count=1, process_index=0)
    epochs = [[originals(next(loader)) for _ in range(loader.batches_per_epoch)] for _ in range(2)]
    assert not np.array_equal(epochs[0][0], epochs[1][0])
    for epoch in epochs:
        rows = [bytes(r) for batch in epoch for r in batch]
        assert len(set(rows)) == len(rows), "no example twice within an epoch"
    with pytest.raises(StopIteration):
        next(loader)


def test_worker_threads_do_not_change_batches(data_dir):
    kwargs = dict(batch_size=16, seed=9, process_count=1, process_index=0)
    a = take(make_loader(data_dir, worker_count=0, **kwargs), 8)
    threaded = make_loader(data_dir, worker_count=3, **kwargs)
    assert_same(take(threaded, 8), a)
    state = {**threaded.get_state(), "epoch": 0, "batch_in_epoch": 2}
    threaded.set_state(state)
    assert_same(take(threaded, 3), a[2:5])


def test_eval_loader_is_identical_across_passes(data_dir):
    one_pass = dict(split="eval", shuffle=False, num_epochs=1, process_count=1, process_index=0)
    loader = make_loader(data_dir, batch_size=8, **one_pass)
    first, second = list(loader), list(loader)
    assert len(first) == loader.num_examples // 8 == len(loader) > 0
    assert_same(first, second)
    assert_same(first, list(make_loader(data_dir, batch_size=8, **one_pass)))


def test_whole_word_masking_through_the_loader(data_dir):
    masking = MaskingSettings(whole_word_masking=True, max_predictions_per_seq=8)
    loader = make_loader(data_dir, batch_size=64, process_count=1, process_index=0, masking=masking)
    batch = next(loader)
    starts = loader.tokenizer.is_word_start
    ids = originals(batch)
    chosen = np.zeros(ids.shape, bool)
    rows, slots = np.nonzero(batch["masked_lm_weights"] > 0)
    chosen[rows, batch["masked_lm_positions"][rows, slots]] = True
    # A chosen piece that continues a word (follows a non-special piece without a word-start
    # marker) has its preceding piece chosen too.
    special = np.isin(ids, loader.tokenizer.special_ids)
    continuing = chosen[:, 1:] & ~starts[ids[:, 1:]] & ~special[:, :-1]
    assert continuing.any()
    assert np.all(chosen[:, :-1][continuing])


def test_checks_on_the_prepared_directory(data_dir, tmp_path):
    with pytest.raises(ValueError, match=r"max_seq_length=48.*max_seq_length=128"):
        make_loader(data_dir, batch_size=8, expected_max_seq_length=128)
    with pytest.raises(ValueError, match=r"fingerprint [0-9a-f]{64}.*fingerprint deadbeef"):
        make_loader(data_dir, batch_size=8, expected_tokenizer_fingerprint="deadbeef")
    with pytest.raises(FileNotFoundError, match=r"nowhere.*bertjax.data.prepare"):
        make_loader(tmp_path / "nowhere", batch_size=8)
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        make_loader(tmp_path, batch_size=8)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        make_loader(data_dir, split="eval", batch_size=100000, process_count=1, process_index=0)
    with pytest.raises(ValueError, match="process_index=2"):
        make_loader(data_dir, batch_size=8, process_index=2, process_count=2)
