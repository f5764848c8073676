"""Masking: google's counts, 80/10/10 rates, specials untouched, whole words kept whole."""

import numpy as np
import pytest

from bertjax.data.masking import MaskingSettings, RowRandom, mask_batch, num_to_predict

VOCAB = 1000
SPECIALS = (0, 1, 2, 3, 4)
PAD, CLS, SEP, MASK = 0, 2, 3, 4


def make_batch(rng, batch=512, seq=64):
    """Random "[CLS] A [SEP] B [SEP]" rows of random lengths, padded with [PAD]."""
    lengths = rng.integers(8, seq + 1, size=batch)
    ids = rng.integers(5, VOCAB, size=(batch, seq)).astype(np.int32)
    mask = np.arange(seq) < lengths[:, None]
    ids[:, 0] = CLS
    middle = lengths // 2
    ids[np.arange(batch), middle] = SEP
    ids[np.arange(batch), lengths - 1] = SEP
    ids[~mask] = PAD
    return ids, mask.astype(np.int32)


def run(ids, mask, seed=0, word_start=None, row_random=False, **settings):
    if row_random:  # the loader's per-example streams
        rng = RowRandom.from_positions(seed, stream=1, epoch=0, positions=np.arange(len(ids)))
    else:
        rng = np.random.default_rng(seed)
    return mask_batch(
        ids,
        mask,
        rng,
        MaskingSettings(**settings),
        vocab_size=VOCAB,
        special_ids=SPECIALS,
        mask_id=MASK,
        is_word_start=word_start,
    )


def test_counts_follow_google():
    settings = MaskingSettings(masked_lm_prob=0.15, max_predictions_per_seq=20)
    lengths = np.array([0, 1, 3, 10, 17, 100, 128, 200])
    expected = [min(20, max(1, int(round(n * 0.15)))) for n in lengths]
    np.testing.assert_array_equal(num_to_predict(lengths, settings), expected)


@pytest.mark.parametrize("row_random", [False, True])
def test_rates_specials_positions_and_labels(row_random):
    rng = np.random.default_rng(0)
    ids, mask = make_batch(rng, batch=4096)
    out = run(ids, mask, row_random=row_random, max_predictions_per_seq=20)
    positions, weights = out["masked_lm_positions"], out["masked_lm_weights"]
    assert positions.shape == weights.shape == (4096, 20)
    assert positions.dtype == np.int32 and weights.dtype == np.float32
    assert out["input_ids"].dtype == np.int32 and out["masked_lm_ids"].dtype == np.int32

    lengths = mask.sum(1)
    maskable = ((mask == 1) & ~np.isin(ids, SPECIALS)).sum(1)
    expected = np.minimum(np.minimum(20, np.maximum(1, np.rint(lengths * 0.15))), maskable)
    np.testing.assert_array_equal(weights.sum(1), expected)
    # Overall rate over maskable tokens: 15% of all real tokens, capped at 20 per row.
    assert weights.sum() / (lengths * 0.15).sum() == pytest.approx(1.0, abs=0.05)

    valid = weights > 0
    rows = np.broadcast_to(np.arange(4096)[:, None], positions.shape)
    for r in range(4096):
        p = positions[r][valid[r]]
        assert np.all(np.diff(p) > 0), "positions sorted and unique"
        assert np.all(valid[r][: len(p)]) and not np.any(valid[r][len(p) :]), "padding last"
    assert np.all(positions[~valid] == 0) and np.all(out["masked_lm_ids"][~valid] == 0)
    chosen_original = ids[rows[valid], positions[valid]]
    assert not np.isin(chosen_original, SPECIALS).any(), "specials and padding never chosen"
    np.testing.assert_array_equal(out["masked_lm_ids"][valid], chosen_original)

    # Only chosen positions may change.
    changed = out["input_ids"] != ids
    chosen = np.zeros_like(changed)
    chosen[rows[valid], positions[valid]] = True
    assert not np.any(changed & ~chosen)

    new = out["input_ids"][rows[valid], positions[valid]]
    n = len(new)
    frac_mask = np.mean(new == MASK)
    frac_same = np.mean(new == chosen_original)
    # A random replacement equals the original 1 time in ~995: count it as "random".
    frac_random = 1.0 - frac_mask - frac_same
    assert abs(frac_mask - 0.8) < 0.02, n
    assert abs(frac_same - 0.1) < 0.02 and abs(frac_random - 0.1) < 0.02, n
    assert not np.isin(new[new != MASK], SPECIALS).any(), "random tokens are never special"


def test_deterministic_for_a_seed_and_different_across_seeds():
    ids, mask = make_batch(np.random.default_rng(1), batch=64)
    a, b, c = run(ids, mask, seed=5), run(ids, mask, seed=5), run(ids, mask, seed=6)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])


def test_cap_and_short_sequences():
    ids, mask = make_batch(np.random.default_rng(2), batch=256, seq=128)
    out = run(ids, mask, max_predictions_per_seq=5)
    assert out["masked_lm_positions"].shape == (256, 5)
    assert out["masked_lm_weights"].sum(1).max() == 5
    # More prediction slots than tokens: padding fills the rest.
    tiny_ids = np.array([[CLS, 7, 8, SEP]], dtype=np.int32)
    out = run(tiny_ids, np.ones_like(tiny_ids), max_predictions_per_seq=10, masked_lm_prob=1.0)
    np.testing.assert_array_equal(out["masked_lm_positions"][0], [1, 2] + [0] * 8)
    np.testing.assert_array_equal(out["masked_lm_weights"][0], [1, 1] + [0] * 8)


def test_whole_word_masking_keeps_words_whole():
    rng = np.random.default_rng(3)
    word_start = rng.random(VOCAB) < 0.5
    word_start[list(SPECIALS)] = True
    ids, mask = make_batch(rng, batch=1024, seq=64)
    out = run(ids, mask, word_start=word_start, whole_word_masking=True, max_predictions_per_seq=12)
    weights = out["masked_lm_weights"]
    k = np.minimum(12, np.maximum(1, np.rint(mask.sum(1) * 0.15)))
    assert np.all(weights.sum(1) <= k)
    total_words_partially_taken = 0
    for r in range(len(ids)):
        candidate = (mask[r] == 1) & ~np.isin(ids[r], SPECIALS)
        words, current = [], None
        for position in range(ids.shape[1]):
            if not candidate[position]:
                current = None
                continue
            if current is None or word_start[ids[r, position]]:
                current = []
                words.append(current)
            current.append(position)
        chosen = set(out["masked_lm_positions"][r][weights[r] > 0].tolist())
        count = len(chosen)
        for word in words:
            taken = [p in chosen for p in word]
            total_words_partially_taken += any(taken) and not all(taken)
            # Google's greedy skip: any word left out could not have fitted at the end.
            if not any(taken):
                assert count + len(word) > k[r], (r, word, count, k[r])
    assert total_words_partially_taken == 0
    # With half the pieces continuing a word, multi-piece words do get chosen.
    assert (weights.sum(1) >= 2).mean() > 0.5
    np.testing.assert_array_equal(
        out["masked_lm_ids"][weights > 0],
        ids[np.nonzero(weights > 0)[0], out["masked_lm_positions"][weights > 0]],
    )


def test_whole_word_masking_needs_word_starts_and_settings_validate():
    ids, mask = make_batch(np.random.default_rng(4), batch=2)
    with pytest.raises(ValueError, match="is_word_start"):
        run(ids, mask, whole_word_masking=True)
    with pytest.raises(ValueError, match="masked_lm_prob"):
        MaskingSettings(masked_lm_prob=0.0)
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        MaskingSettings(max_predictions_per_seq=0)


def test_row_random_streams_are_uniform_and_independent_of_the_batch_split():
    rows = RowRandom.from_positions(seed=3, stream=1, epoch=0, positions=np.arange(2000))
    values = rows.random((2000, 64))
    assert 0.0 <= values.min() and values.max() < 1.0
    assert abs(values.mean() - 0.5) < 0.005
    assert abs(np.corrcoef(values[:, 0], values[:, 1])[0, 1]) < 0.05
    integers = rows.integers(5, 9, size=(2000, 64))
    np.testing.assert_array_equal(np.unique(integers), [5, 6, 7, 8])

    ids = np.random.default_rng(0).integers(10, 100, size=(8, 32)).astype(np.int32)
    mask = np.ones_like(ids)
    settings = MaskingSettings(max_predictions_per_seq=6)
    kwargs = dict(vocab_size=100, special_ids=(0, 1, 2, 3, 4), mask_id=4)

    def masked(positions):
        rng = RowRandom.from_positions(seed=1, stream=1, epoch=2, positions=positions)
        return mask_batch(ids[positions], mask[positions], rng, settings, **kwargs)

    whole = masked(np.arange(8))
    halves = [masked(np.arange(4)), masked(np.arange(4, 8))]
    for name, value in whole.items():
        np.testing.assert_array_equal(np.concatenate([h[name] for h in halves]), value)


@pytest.mark.parametrize("rate", [0.15, 0.3, 0.5])
def test_masked_share_follows_the_configured_rate(rate):
    # ModernBERT's 30% among others: with room for every prediction, round(n * rate) of each
    # row's n real tokens are chosen, and 80/10/10 holds inside the chosen ones.
    rng = np.random.default_rng(3)
    ids, mask = make_batch(rng, batch=2048, seq=64)
    out = run(ids, mask, seed=4, row_random=True, masked_lm_prob=rate, max_predictions_per_seq=64)
    weights = out["masked_lm_weights"]
    lengths = mask.sum(1)
    maskable = ((mask == 1) & ~np.isin(ids, SPECIALS)).sum(1)
    expected = np.minimum(np.maximum(1, np.rint(lengths * rate)), maskable)
    np.testing.assert_array_equal(weights.sum(1), expected)
    assert weights.sum() / lengths.sum() == pytest.approx(rate, abs=0.01)

    valid = weights > 0
    rows = np.broadcast_to(np.arange(len(ids))[:, None], weights.shape)
    positions = out["masked_lm_positions"]
    new = out["input_ids"][rows[valid], positions[valid]]
    original = out["masked_lm_ids"][valid]
    frac_mask = np.mean(new == MASK)
    frac_same = np.mean(new == original)
    assert abs(frac_mask - 0.8) < 0.015 and abs(frac_same - 0.1) < 0.015
    assert abs(1.0 - frac_mask - frac_same - 0.1) < 0.015
    # The tokens left outside the chosen ones are the input's.
    changed = out["input_ids"] != ids
    assert changed.sum() <= valid.sum()
