"""Text to model inputs without a model: pairs, truncation, offsets, length buckets."""

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax.text import features
from bertjax.text.tokenizer import WordPieceTokenizer
from bertjax.text.training import TokenizerSettings, train_tokenizer

PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "lives", "in", "new", "york"]
PIECES += ["##shire", "hamp", "##ton", "cafe", ",", "the", "cat", "sat"]


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory) -> WordPieceTokenizer:
    vocab = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
    vocab.write_text("\n".join(PIECES) + "\n")
    return WordPieceTokenizer.from_vocab(vocab)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    words = ["naïve", "café", "Hampton", "lives", "in", "York", "the", "cat", "sat", "日本"]
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words += ["".join(rng.choice(letters, size=rng.integers(3, 9))) for _ in range(300)]
    sentences = [" ".join(rng.choice(words, size=8)) for _ in range(2000)]
    path = tmp_path_factory.mktemp("sentencepiece") / "tokenizer.model"
    return train_tokenizer(sentences, TokenizerSettings(vocab_size=320), path)


def test_pairs_are_cut_longest_first_as_google_cuts_them(wordpiece):
    # 5 + 2 tokens, 4 slots left after [CLS] A [SEP] B [SEP] in 7: the longer text loses 3.
    with pytest.warns(features.TruncationWarning, match="limit of 7 tokens"):
        out = features.encode(wordpiece, "john lives in new york", "the cat", max_length=7)
    assert out["input_ids"].tolist() == [[2, 5, 6, 3, 15, 16, 3]]
    assert out["segment_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1]]
    assert out["input_mask"].tolist() == [[1] * 7]
    # Shorter rows are padded to the longest; nothing cut, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = features.encode(wordpiece, ["john", "the cat sat"], None, max_length=16)
    assert out["input_ids"].tolist() == [[2, 5, 3, 0, 0], [2, 15, 16, 17, 3]]
    assert out["input_mask"].tolist() == [[1, 1, 1, 0, 0], [1] * 5]


def test_bad_input_names_the_text(wordpiece):
    with pytest.raises(features.InputError, match="text 1 is empty"):
        features.encode(wordpiece, ["john", "  "], None, max_length=8)
    with pytest.raises(features.InputError, match=r"max_length=3 is invalid: must be in \[4, 8\]"):
        features.encode(wordpiece, "john", "york", max_length=3, limit=8)
    with pytest.raises(features.InputError, match="text_pairs has 1 texts but texts has 2"):
        features.encode(wordpiece, ["john", "york"], ["new"], max_length=8)


def test_wordpiece_offsets_point_at_each_token_s_characters(wordpiece):
    text = "John lives in Hampton, café"
    (ids,) = wordpiece.encode_batch([text])
    (spans,) = features.offsets(wordpiece, [text])
    assert spans.shape == (len(ids), 2) and spans.dtype == np.int32
    shown = [text[a:b] for a, b in spans]
    assert shown == ["John", "lives", "in", "Hamp", "ton", ",", "café"]
    # Offsets are of the text as given, before lowercasing and accent stripping.
    pieces = [wordpiece.id_to_piece(i) for i in ids]
    assert pieces == ["john", "lives", "in", "hamp", "##ton", ",", "cafe"]


def test_sentencepiece_offsets_are_characters_of_the_original_text(sentencepiece):
    text = "the naïve cat  sat in York, 日本 Hampton"
    (ids,) = sentencepiece.encode_batch([text])
    (spans,) = features.offsets(sentencepiece, [text])
    assert spans.shape == (len(ids), 2)
    assert np.all(spans[:, 0] <= spans[:, 1]) and np.all(np.diff(spans[:, 0]) >= 0)
    assert spans.max() <= len(text)
    for token_id, (a, b) in zip(ids, spans):
        piece = sentencepiece.id_to_piece(token_id)
        if piece.startswith("<0x"):  # a byte of a character: only its last byte spans it
            assert b - a <= 1
            continue
        # Offsets skip the space a word-initial piece stands for; the rest is the piece.
        assert text[a:b] == piece.lstrip("\u2581"), (piece, text[a:b])
    # Every non-space character is covered by some token.
    covered = np.zeros(len(text), bool)
    for a, b in spans:
        covered[a:b] = True
    assert all(covered[i] or text[i].isspace() for i in range(len(text)))


def test_length_bucket_rounds_up_and_stops_at_the_limit():
    assert features.length_bucket(9, 8, 128) == 16
    assert features.length_bucket(16, 8, 128) == 16
    assert features.length_bucket(125, 32, 100) == 100
    assert features.length_bucket(5, 0, 64) == 64


def _positions(needed: np.ndarray, widths: tuple[int, ...]) -> int:
    """Positions of items cut to the smallest of `widths` that holds each."""
    return sum(min(w for w in widths if w >= n) for n in needed)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=24),
    multiple=st.sampled_from([4, 8, 16]),
    overhead=st.sampled_from([0.0, 0.03, 0.1, 0.5]),
)
def test_the_fewest_widths_hold_every_item_within_the_overhead(lengths, multiple, overhead):
    lengths = np.asarray(lengths)
    widths = features.fewest_widths(lengths, multiple, 60, overhead)
    needed = np.minimum(60, -(-lengths // multiple) * multiple)  # each item's own multiple
    assert list(widths) == sorted(set(widths)) and set(widths) <= set(needed)
    finest = int(needed.sum())
    assert _positions(needed, widths) <= finest * (1 + overhead)
    # No set of one width fewer does it (every such set, tried; one width: it is needed).
    candidates = sorted(set(needed.tolist()))
    if len(widths) > 1:
        for fewer in itertools.combinations(candidates[:-1], len(widths) - 2):
            assert _positions(needed, (*fewer, candidates[-1])) > finest * (1 + overhead)


def _fewest_positions(needed: np.ndarray, count: int) -> int:
    """The fewest positions any `count` widths (of the items' own multiples) give."""
    candidates = sorted(set(needed.tolist()))
    return min(
        _positions(needed, (*fewer, candidates[-1]))
        for fewer in itertools.combinations(candidates[:-1], count - 1)
    )


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=24),
    overhead=st.sampled_from([0.0, 0.1]),
    program_positions=st.sampled_from([0, 8, 40, 200]),
)
def test_a_width_is_added_only_while_it_saves_a_programs_cost(lengths, overhead, program_positions):
    lengths = np.asarray(lengths)
    needed = np.minimum(60, -(-lengths // 8) * 8)
    free = features.fewest_widths(lengths, 8, 60, overhead)
    widths = features.fewest_widths(lengths, 8, 60, overhead, program_positions=program_positions)
    assert program_positions or widths == free
    assert len(widths) <= len(free) and set(widths) <= set(needed)
    # The fewest positions for that many widths, and one more width would save too little.
    assert _positions(needed, widths) == _fewest_positions(needed, len(widths))
    if len(widths) < len(free):
        saving = _positions(needed, widths) - _fewest_positions(needed, len(widths) + 1)
        assert saving < program_positions


def test_fewest_widths_weigh_items_by_their_rows():
    lengths = np.array([8, 16, 24, 32])
    assert features.fewest_widths(lengths, 8, 32, 0.0) == (8, 16, 24, 32)
    assert features.fewest_widths(lengths, 8, 32, 0.25) == (16, 32)  # 80 -> 96 positions
    # Many rows of 8: worth a width of their own.
    assert features.fewest_widths(lengths, 8, 32, 0.25, counts=[20, 1, 1, 1]) == (8, 32)
    assert features.fewest_widths(np.array([], int), 8, 32, 0.0) == (32,)
