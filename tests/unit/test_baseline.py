"""Unigram baseline: the commonest target's share, counted over the evaluation's own batches."""

import numpy as np
import pytest

from bertjax.data import MaskingSettings, make_loader, prepare
from bertjax.data.baseline import sentence_pair_baseline, unigram_baseline
from bertjax.data.storage import SplitReader, read_manifest
from bertjax.text.tokenizer import Tokenizer

SEQ_LEN = 48
EVAL_BATCH = 8


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A corpus where every other word is "ee": its piece "e" is clearly the commonest."""
    root = tmp_path_factory.mktemp("baseline")
    rng = np.random.default_rng(0)
    letters = np.array(list("bcdfgklmnprstvz"))
    words = ["".join(rng.choice(letters, size=rng.integers(3, 7))) for _ in range(60)]
    lines = []
    for _ in range(120):
        for _ in range(rng.integers(3, 8)):
            sentence = [
                w for word in rng.choice(words, size=rng.integers(4, 10)) for w in ("ee", word)
            ]
            lines.append(" ".join(sentence) + ".")
        lines.append("")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    prepare(
        [str(corpus)],
        root / "data",
        max_seq_length=SEQ_LEN,
        vocab_size=330,
        workers=1,
        eval_fraction=0.3,
        seed=5,
        verbose=False,
    )
    return root / "data"


def count_targets(data_dir, masking, seed, max_batches=0):
    """Target counts over the evaluation's batches, read straight from the loader."""
    loader = make_loader(
        data_dir,
        split="eval",
        batch_size=EVAL_BATCH,
        seed=seed,
        masking=masking,
        shuffle=False,
        num_epochs=1,
        process_index=0,
        process_count=1,
    )
    counts: dict[int, float] = {}
    for index, batch in enumerate(loader):
        if max_batches and index >= max_batches:
            break
        for token, weight in zip(
            batch["masked_lm_ids"].ravel(), batch["masked_lm_weights"].ravel()
        ):
            counts[int(token)] = counts.get(int(token), 0.0) + float(weight)
    return counts


@pytest.mark.parametrize(
    "masking, seed, max_batches",
    [
        (MaskingSettings(), 0, 0),
        (MaskingSettings(), 0, 3),
        (MaskingSettings(masked_lm_prob=0.3, max_predictions_per_seq=16), 7, 0),
        (MaskingSettings(whole_word_masking=True), 1, 0),
    ],
)
def test_baseline_counts_the_targets_the_evaluation_scores(data_dir, masking, seed, max_batches):
    counts = count_targets(data_dir, masking, seed, max_batches)
    top = max(counts, key=lambda token: (counts[token], -token))
    baseline = unigram_baseline(
        data_dir, batch_size=EVAL_BATCH, masking=masking, seed=seed, max_batches=max_batches
    )
    assert baseline.num_targets == sum(counts.values())
    assert baseline.token_id == top
    assert baseline.accuracy == pytest.approx(counts[top] / sum(counts.values()), rel=1e-12)


def test_max_batches_and_masking_change_what_is_counted(data_dir):
    whole = unigram_baseline(data_dir, batch_size=EVAL_BATCH)
    first = unigram_baseline(data_dir, batch_size=EVAL_BATCH, max_batches=2)
    denser = unigram_baseline(
        data_dir,
        batch_size=EVAL_BATCH,
        masking=MaskingSettings(masked_lm_prob=0.3, max_predictions_per_seq=SEQ_LEN),
    )
    assert first.num_targets < whole.num_targets < denser.num_targets
    # Whole batches only, as the evaluation reads them: the incomplete last one is dropped.
    eval_examples = read_manifest(data_dir)["splits"]["eval"]["num_instances"]
    one_batch = unigram_baseline(data_dir, batch_size=eval_examples // 2 + 1)
    assert one_batch.num_targets < whole.num_targets


def test_the_baseline_is_the_commonest_piece_share_of_the_text(data_dir):
    baseline = unigram_baseline(data_dir, batch_size=EVAL_BATCH)
    tokenizer = Tokenizer.load(data_dir / "tokenizer.model")
    assert baseline.piece == tokenizer.id_to_piece(baseline.token_id)
    # Masking picks positions uniformly among the real non-special tokens, so the baseline
    # estimates the commonest piece's share of them in the split ("e" twice in every other
    # word).
    manifest = read_manifest(data_dir)
    reader = SplitReader(data_dir, "eval", manifest["splits"]["eval"]["shards"])
    tokens = np.concatenate([np.asarray(t) for t in reader.tokens])
    tokens = tokens[~np.isin(tokens, list(tokenizer.special_ids))]
    shares = np.bincount(tokens, minlength=tokenizer.vocab_size) / len(tokens)
    assert np.sort(shares)[-1] > np.sort(shares)[-2] + 0.1  # one commonest piece, clearly
    assert baseline.token_id == int(np.argmax(shares))
    # An estimate from the masked positions the evaluation draws: within four standard errors.
    error = np.sqrt(shares.max() * (1 - shares.max()) / baseline.num_targets)
    assert abs(baseline.accuracy - shares.max()) < 4 * error


@pytest.mark.parametrize("max_batches", [0, 3])
def test_sentence_pair_baseline_is_the_commoner_label_share(data_dir, max_batches):
    manifest = read_manifest(data_dir)
    reader = SplitReader(data_dir, "eval", manifest["splits"]["eval"]["shards"])
    read = (len(reader) // EVAL_BATCH if not max_batches else max_batches) * EVAL_BATCH
    labels = reader.label[:read]  # the evaluation reads the split in order, whole batches
    assert 0 < labels.mean() < 1
    expected = max(labels.mean(), 1 - labels.mean())
    baseline = sentence_pair_baseline(data_dir, batch_size=EVAL_BATCH, max_batches=max_batches)
    assert baseline == pytest.approx(expected, rel=1e-12)


def test_a_split_that_is_not_there_is_named(data_dir):
    with pytest.raises(ValueError, match="split='dev'.*eval.*train"):
        unigram_baseline(data_dir, "dev", batch_size=EVAL_BATCH)
    with pytest.raises(ValueError, match="split='dev'.*eval.*train"):
        sentence_pair_baseline(data_dir, "dev", batch_size=EVAL_BATCH)
