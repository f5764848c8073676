"""Baselines that give eval accuracies their meaning: what a model that learned nothing scores.

Masked LM: a model that has learned only how often each piece occurs predicts the same piece
at every masked position, whatever the context; its accuracy is the share of that piece among
the targets. Early in training BERT sits on this "unigram plateau", so an eval MLM accuracy
means something only next to it. Next-sentence (or sentence-order) prediction: always
answering the commoner label scores that label's share, which is not 0.5 when a corpus has
many one-sentence chunks (their B is always a random one).

Both count from the loader's own batches, so the masking, and which examples an evaluation of
``max_batches`` batches sees, are exactly the evaluation's.
"""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple

import numpy as np

from bertjax.data.loader import make_loader
from bertjax.data.masking import MaskingSettings


class UnigramBaseline(NamedTuple):
    """The commonest masked-LM target of a split and the accuracy of always predicting it."""

    accuracy: float  # share of the targets equal to token_id
    token_id: int  # the commonest target (the lowest id among equally common ones)
    piece: str  # its tokenizer piece, e.g. "▁the"
    num_targets: int  # masked-LM targets counted


def _eval_batches(data_dir, split, batch_size, masking, seed, max_batches):
    """(tokenizer, the batches an evaluation reads): in order, unshuffled, whole batches only."""
    loader = make_loader(
        data_dir,
        split=split,
        batch_size=batch_size,
        seed=seed,
        masking=masking,
        shuffle=False,
        num_epochs=1,
        process_index=0,
        process_count=1,
    )
    return loader.tokenizer, itertools.islice(loader, max_batches or None)


def unigram_baseline(
    data_dir: str | os.PathLike,
    split: str = "eval",
    *,
    batch_size: int,
    masking: MaskingSettings | None = None,
    seed: int = 0,
    max_batches: int = 0,
) -> UnigramBaseline:
    """The unigram baseline of a prepared directory's split, under the loader's masking.

    Pass what the evaluation uses: its global ``batch_size`` (the loader drops an incomplete
    last batch), the run's ``masking`` and ``seed``, and ``max_batches`` (0: the whole split).
    The batches are read in order, unshuffled, as the evaluation reads them.
    """
    tokenizer, batches = _eval_batches(data_dir, split, batch_size, masking, seed, max_batches)
    counts = np.zeros(tokenizer.vocab_size, dtype=np.float64)
    for batch in batches:
        weights = batch["masked_lm_weights"].ravel()
        counts += np.bincount(
            batch["masked_lm_ids"].ravel(), weights=weights, minlength=len(counts)
        )
    total = counts.sum()
    if total == 0:
        raise ValueError(f"split {split!r} of {str(data_dir)!r} has no masked-LM targets.")
    token_id = int(np.argmax(counts))
    return UnigramBaseline(
        accuracy=float(counts[token_id] / total),
        token_id=token_id,
        piece=tokenizer.id_to_piece(token_id),
        num_targets=int(total),
    )


def sentence_pair_baseline(
    data_dir: str | os.PathLike,
    split: str = "eval",
    *,
    batch_size: int,
    max_batches: int = 0,
) -> float:
    """The NSP (or SOP) accuracy of always answering the split's commoner label.

    ``batch_size`` and ``max_batches`` as for unigram_baseline: the evaluation's.
    """
    _, batches = _eval_batches(data_dir, split, batch_size, None, 0, max_batches)
    # Whole batches only: the loader refuses a split smaller than one, so this is never empty.
    labels = np.concatenate([batch["next_sentence_labels"] for batch in batches])
    share = float(np.mean(labels))
    return max(share, 1.0 - share)
