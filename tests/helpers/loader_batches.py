"""Reading a pretraining loader's batches in the data tests: the next few, their unmasked ids,
and whether two runs of batches are the same."""

import numpy as np


def take(loader, n: int) -> list[dict]:
    """The loader's next `n` batches."""
    return [next(loader) for _ in range(n)]


def originals(batch: dict) -> np.ndarray:
    """The unmasked input ids of a batch: masked positions put back."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_lm_weights"] > 0)
    ids[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][rows, slots]
    return ids


def assert_same(batches_a: list[dict], batches_b: list[dict]) -> None:
    """The two lists hold as many batches, each with the same features and the same values."""
    assert len(batches_a) == len(batches_b)
    for a, b in zip(batches_a, batches_b):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
