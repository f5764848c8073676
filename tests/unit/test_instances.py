"""Pretraining instances: layout, segments, truncation, NSP/SOP labels and provenance."""

import random

import numpy as np
import pytest

from bertjax.data.instances import (
    Instances,
    InstanceSettings,
    _removals,
    create_instances,
)

CLS, SEP = 2, 3
DOC_STRIDE = 100_000  # document d uses token ids in [d * DOC_STRIDE + 10, (d + 1) * DOC_STRIDE)


def make_documents(num_docs, sentences_per_doc, min_len, max_len, seed=0):
    """Documents whose tokens name their document and position: id = d * stride + 10 + pos."""
    rng = np.random.default_rng(seed)
    documents = []
    for d in range(num_docs):
        count = (
            sentences_per_doc
            if isinstance(sentences_per_doc, int)
            else int(rng.integers(*sentences_per_doc))
        )
        lengths = rng.integers(min_len, max_len + 1, size=count)
        ids = np.arange(lengths.sum(), dtype=np.int32) + d * DOC_STRIDE + 10
        documents.append(np.split(ids, np.cumsum(lengths)[:-1]))
    return documents


def split_instance(instances: Instances, i: int):
    tokens = instances.instance(i)
    b_start = int(instances.segment_b_start[i])
    return tokens, tokens[1 : b_start - 1], tokens[b_start:-1]


def check_layout(instances: Instances, max_seq_length: int):
    for i in range(instances.num_instances):
        tokens, a, b = split_instance(instances, i)
        assert tokens[0] == CLS
        assert np.count_nonzero(tokens == SEP) == 2
        assert tokens[-1] == SEP and tokens[instances.segment_b_start[i] - 1] == SEP
        assert len(tokens) <= max_seq_length
        assert len(a) >= 1 and len(b) >= 1
        assert not np.isin(a, [CLS, SEP]).any() and not np.isin(b, [CLS, SEP]).any()
        # Truncation keeps each segment a contiguous run of one document.
        for seg in (a, b):
            assert np.all(np.diff(seg) == 1)
            assert len(set((seg // DOC_STRIDE).tolist())) == 1


def test_two_document_toy_exact_layout_and_is_next_continuation():
    documents = [
        [
            np.array([10, 11, 12], np.int32),
            np.array([13, 14], np.int32),
            np.array([15], np.int32),
            np.array([16, 17, 18, 19], np.int32),
        ],
        [
            np.array([100010, 100011], np.int32),
            np.array([100012, 100013, 100014], np.int32),
            np.array([100015, 100016], np.int32),
        ],
    ]
    settings = InstanceSettings(max_seq_length=64, short_seq_prob=0.0, dupe_factor=20)
    instances = create_instances(documents, settings, np.random.default_rng(7), CLS, SEP)
    check_layout(instances, 64)
    flat = [np.concatenate(d) for d in documents]
    sentence_starts = [set(np.cumsum([0] + [len(s) for s in d])[:-1].tolist()) for d in documents]
    labels = instances.next_sentence_labels
    assert set(labels.tolist()) == {0, 1}
    for i in range(instances.num_instances):
        tokens, a, b = split_instance(instances, i)
        doc_a, doc_b = int(a[0] // DOC_STRIDE), int(b[0] // DOC_STRIDE)
        pos_a = int(a[0] % DOC_STRIDE) - 10
        assert pos_a in sentence_starts[doc_a]  # no truncation needed: A starts a sentence
        np.testing.assert_array_equal(instances.segment_ids(i)[: len(a) + 2], 0)
        np.testing.assert_array_equal(instances.segment_ids(i)[len(a) + 2 :], 1)
        if labels[i] == 0:
            # "Is next": B is exactly the text after A, up to the end of the chunk (here the doc).
            assert doc_b == doc_a
            np.testing.assert_array_equal(
                np.concatenate([a, b]), flat[doc_a][pos_a : pos_a + len(a) + len(b)]
            )
            assert pos_a + len(a) + len(b) == len(flat[doc_a])
        else:
            assert doc_b != doc_a
            assert int(b[0] % DOC_STRIDE) - 10 in sentence_starts[doc_b]


def test_truncation_to_max_seq_length_keeps_both_segments():
    documents = make_documents(30, (2, 12), 1, 30, seed=3)
    for max_seq_length in (5, 8, 16, 33):
        settings = InstanceSettings(max_seq_length=max_seq_length, dupe_factor=2)
        instances = create_instances(documents, settings, np.random.default_rng(1), CLS, SEP)
        assert instances.num_instances > 0
        check_layout(instances, max_seq_length)
        lengths = np.diff(instances.offsets)
        assert lengths.max() == max_seq_length  # long sentences are cut down to exactly the limit


def google_truncate(len_a, len_b, max_num_tokens, rng):
    """google-research/bert's truncate_seq_pair on index lists, for comparison."""
    a, b = list(range(len_a)), list(range(len_b))
    while len(a) + len(b) > max_num_tokens:
        trunc = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()
    return a, b


def test_removal_counts_match_google_truncate_seq_pair():
    rng = random.Random(0)
    for len_a in range(1, 25):
        for len_b in range(1, 25):
            for max_num_tokens in range(2, 30):
                a, b = google_truncate(len_a, len_b, max_num_tokens, rng)
                assert _removals(len_a, len_b, max_num_tokens) == (len_a - len(a), len_b - len(b))


def test_front_back_removals_have_googles_distribution():
    # One 40-token sentence per document: A = 40 tokens, random B from another document, so
    # A loses len - target tokens; google removes each from the front with probability 0.5.
    documents = [[np.arange(40, dtype=np.int32) + d * DOC_STRIDE + 10] for d in range(400)]
    settings = InstanceSettings(max_seq_length=23, short_seq_prob=0.0, dupe_factor=5)
    instances = create_instances(documents, settings, np.random.default_rng(0), CLS, SEP)
    fronts = []
    for i in range(instances.num_instances):
        _, a, b = split_instance(instances, i)
        assert len(a) == 10 and len(b) == 10  # 80 tokens cut to 20: 30 from each side
        fronts.append(int(a[0] % DOC_STRIDE) - 10)
    fronts = np.array(fronts)
    assert fronts.min() >= 0 and fronts.max() <= 30
    assert abs(fronts.mean() - 15) < 0.3  # Binomial(30, 0.5): mean 15, sd 2.7
    assert abs(fronts.std() - np.sqrt(7.5)) < 0.3


def test_nsp_label_rate_and_no_random_next_from_same_document():
    # short_seq_prob=0: a short per-document target (google's semantics) makes one-sentence
    # chunks, which are always random-next, and that would lift the rate above 0.5 by design.
    documents = make_documents(200, 300, 2, 6, seed=1)
    settings = InstanceSettings(max_seq_length=32, short_seq_prob=0.0, dupe_factor=2)
    instances = create_instances(documents, settings, np.random.default_rng(5), CLS, SEP)
    n = instances.num_instances
    assert n >= 20_000
    labels = instances.next_sentence_labels
    assert abs(labels.mean() - 0.5) < 0.02
    first_a = instances.tokens[instances.offsets[:-1] + 1]
    first_b = instances.tokens[instances.offsets[:-1] + instances.segment_b_start]
    last_a = instances.tokens[instances.offsets[:-1] + instances.segment_b_start - 2]
    same_doc = first_a // DOC_STRIDE == first_b // DOC_STRIDE
    assert not same_doc[labels == 1].any()
    assert same_doc[labels == 0].all()
    # Is-next B continues A (a truncated A's back or B's front may leave a gap, never overlap).
    gap = first_b[labels == 0] - last_a[labels == 0]
    assert (gap >= 1).all() and np.mean(gap == 1) > 0.3
    lengths = np.diff(instances.offsets)
    assert lengths.max() <= 32
    # Shuffled at the end: instances do not come out in document order.
    assert np.mean(np.diff(first_a // DOC_STRIDE) < 0) > 0.3
    # The dupe_factor passes use fresh randomness: instances are not repeated.
    rows = {tuple(instances.instance(i).tolist()) for i in range(n)}
    assert len(rows) > 0.9 * n


def test_sop_labels_and_swap():
    documents = make_documents(300, 60, 2, 6, seed=2)
    settings = InstanceSettings(max_seq_length=32, short_seq_prob=0.0, task="sop")
    instances = create_instances(documents, settings, np.random.default_rng(3), CLS, SEP)
    assert instances.num_instances > 1000
    check_layout(instances, 32)
    labels = instances.next_sentence_labels
    assert abs(labels.mean() - 0.5) < 0.05
    for i in range(instances.num_instances):
        _, a, b = split_instance(instances, i)
        assert a[0] // DOC_STRIDE == b[0] // DOC_STRIDE  # always one document
        # Truncation may cut A's back or B's front, leaving a gap, never a change of order.
        if labels[i] == 0:
            assert b[0] > a[-1]  # in order
        else:
            assert a[0] > b[-1]  # swapped: A is the continuation of B


def test_single_document_pool_never_pairs_a_random_b_from_itself():
    documents = make_documents(1, 200, 1, 5, seed=4)
    settings = InstanceSettings(max_seq_length=16, dupe_factor=3)
    instances = create_instances(documents, settings, np.random.default_rng(0), CLS, SEP)
    assert instances.num_instances > 50
    check_layout(instances, 16)
    assert (instances.next_sentence_labels == 0).all()
    # A one-sentence document cannot make any pair at all.
    lone = [[np.array([10, 11, 12], np.int32)]]
    assert create_instances(lone, settings, np.random.default_rng(0), CLS, SEP).num_instances == 0


def test_deterministic_for_a_seed_and_different_across_seeds():
    documents = make_documents(50, (1, 20), 1, 12, seed=5)
    settings = InstanceSettings(max_seq_length=24, dupe_factor=2)
    first = create_instances(documents, settings, np.random.default_rng(11), CLS, SEP)
    again = create_instances(documents, settings, np.random.default_rng(11), CLS, SEP)
    other = create_instances(documents, settings, np.random.default_rng(12), CLS, SEP)
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)
    assert first.tokens.dtype == np.int32 and first.offsets.dtype == np.int64
    assert first.segment_b_start.dtype == np.int32 and first.next_sentence_labels.dtype == np.int32
    assert len(first.tokens) != len(other.tokens) or not np.array_equal(first.tokens, other.tokens)


def test_short_sequences_and_empty_inputs():
    documents = make_documents(40, 100, 2, 6, seed=6)
    long_settings = InstanceSettings(max_seq_length=64, short_seq_prob=0.0)
    short_settings = InstanceSettings(max_seq_length=64, short_seq_prob=1.0)
    long = create_instances(documents, long_settings, np.random.default_rng(0), CLS, SEP)
    short = create_instances(documents, short_settings, np.random.default_rng(0), CLS, SEP)
    assert np.diff(short.offsets).mean() < 0.7 * np.diff(long.offsets).mean()
    assert np.median(np.diff(long.offsets)) >= 60
    # Empty sentences and documents are ignored; nothing at all gives zero instances.
    padded = [[np.zeros(0, np.int32)] + d + [np.zeros(0, np.int32)] for d in documents[:5]] + [[]]
    some = create_instances(
        padded, InstanceSettings(max_seq_length=16), np.random.default_rng(0), CLS, SEP
    )
    check_layout(some, 16)
    empty = create_instances([[], []], InstanceSettings(), np.random.default_rng(0), CLS, SEP)
    assert empty.num_instances == 0 and empty.offsets.tolist() == [0]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_seq_length": 4}, "max_seq_length"),
        ({"short_seq_prob": 1.5}, "short_seq_prob"),
        ({"dupe_factor": 0}, "dupe_factor"),
        ({"task": "mlm"}, "task"),
    ],
)
def test_settings_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        InstanceSettings(**kwargs)
