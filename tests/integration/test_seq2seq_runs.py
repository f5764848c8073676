"""The integration tests of test_seq2seq.py (tests/unit/), with its helpers."""

import dataclasses

import numpy as np
import pytest
import torch

from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq import hf as seq2seq_hf
from tests.helpers.seq2seq import CONFIG, EOS, SEARCHES, half_trained, reversal_batch, trainer  # noqa: F401
from tests.helpers.seq2seq_torch import hf_model  # noqa: F401


@pytest.mark.slow
@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: "-".join(map(str, s.values())))
def test_generate_matches_transformers(search, half_trained, tmp_path):
    directory = tmp_path / "model"
    seq2seq_hf.save_seq2seq(CONFIG, half_trained, directory)
    model = hf_model(directory)
    batch, _ = reversal_batch(np.random.default_rng(11), 6)
    ids, mask = batch["input_ids"], batch["input_mask"]
    settings = decoding.GenerationSettings(max_new_tokens=9, **search)
    ours = decoding.strip(
        decoding.generate(CONFIG, half_trained, ids, mask, settings=settings), EOS
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            max_new_tokens=9,
            do_sample=False,
            **search,
        ).numpy()
    theirs = []
    for row in out[:, 1:].tolist():  # drop the decoder start
        theirs.append(row[: row.index(EOS)] if EOS in row else row)
    assert ours == theirs
    assert len({len(row) for row in ours}) > 1  # the rows end at different steps


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 4])
def test_cached_generation_equals_uncached(num_beams, half_trained):
    batch, _ = reversal_batch(np.random.default_rng(12), 5)
    settings = decoding.GenerationSettings(max_new_tokens=9, num_beams=num_beams)
    args = (CONFIG, half_trained, batch["input_ids"], batch["input_mask"])
    cached = decoding.generate(*args, settings=settings)
    uncached = decoding.generate(*args, settings=dataclasses.replace(settings, use_cache=False))
    np.testing.assert_array_equal(cached.tokens, uncached.tokens)
    np.testing.assert_allclose(cached.scores, uncached.scores, rtol=1e-4)
