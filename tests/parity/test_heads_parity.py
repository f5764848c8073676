"""The parity tests of test_heads.py (tests/unit/), with its helpers."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.tasks.labels import model as label_heads


def test_multi_label_loss_is_binary_cross_entropy_over_every_label():
    logits = jnp.array([[0.0, math.log(3.0), -math.log(3.0)]])  # sigmoid: 1/2, 3/4, 1/4
    targets = jnp.array([[1.0, 1.0, 1.0]])
    sums = label_heads.multi_label_sums(logits, targets, jnp.array([1.0]))
    expected = math.log(2.0) - math.log(0.75) - math.log(0.25)
    assert float(sums.loss) == pytest.approx(expected, rel=1e-6)
    # Thresholded at 0.5: labels 0 and 1 predicted, as the targets say; label 2 missed.
    assert float(sums.correct) == 2.0 and float(sums.count) == 3.0
    # Agrees with torch's BCEWithLogitsLoss (a mean over every example and label).
    torch = pytest.importorskip("torch")
    reference = torch.nn.BCEWithLogitsLoss()(
        torch.tensor(np.asarray(logits)), torch.tensor(np.asarray(targets))
    )
    assert float(sums.loss / sums.count) == pytest.approx(float(reference), rel=1e-6)
