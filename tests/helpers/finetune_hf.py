"""A small BERT with every label head, random parameters, our logits and the batches of the
fine-tuning step-parity checks against transformers."""

import dataclasses

import jax
import numpy as np

from bertjax.capability import HeadSpec
from bertjax.nn import heads
from bertjax.tasks.labels import model as label_heads
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.params import random_init

ATOL = 1e-4


# Every dimension distinct, so that a swapped axis shows.
CONFIG = dataclasses.replace(
    SMALL_BERT, vocab_size=99, num_heads=4, intermediate_size=48, max_position_embeddings=40
)


IDS = np.array([[2, 17, 45, 3, 60, 3, 0, 0], [2, 80, 9, 31, 3, 0, 0, 0]], np.int32)


SEGMENTS = np.array([[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], np.int32)


MASK = (IDS > 0).astype(np.int32)


HEADS = {
    "classification": HeadSpec(label_heads.CLASSIFICATION, ("neg", "neutral", "pos")),
    "regression": HeadSpec(label_heads.REGRESSION, ("similarity",)),
    "multi_label": HeadSpec(label_heads.MULTI_LABEL, ("plot", "acting")),
    "token_classification": HeadSpec(
        label_heads.TOKEN_CLASSIFICATION, ("B-LOC", "B-PER", "I-PER", "O")
    ),
}


def random_params(head: HeadSpec, seed: int):
    """Every parameter random (biases and LayerNorm scales too, which a zero init would hide)."""
    model = label_heads.make_model(CONFIG, head.task, head.num_outputs)
    return random_init(lambda: heads.init_params(model, jax.random.key(0)), seed)


def our_logits(head: HeadSpec, params) -> np.ndarray:
    model = label_heads.make_model(CONFIG, head.task, head.num_outputs)
    return np.asarray(jax.jit(model.apply)({"params": params}, IDS, SEGMENTS, MASK))


# ----------------------------------------------------------------------------- training parity
# Fine-tuning steps against transformers' classes trained by a plain torch loop: the same
# weights (every parameter random, head included, so google's truncated-normal and
# transformers' normal head initialisations do not enter), the same batches, dropout off, and
# google's optimizer on both sides (AdamW with BERT's decay mask: not on biases and LayerNorm;
# eps 1e-6, weight decay 0.01, clipping at global norm 1.0, linear warmup then linear decay).
# Both sides reduce the loss the same way: the mean over examples (regression: MSE; multi-label:
# the mean over example x label, as BCEWithLogitsLoss; token labels: the mean over labelled
# tokens, as CrossEntropyLoss with ignore_index).
#
# Tolerances: float32 on both sides, with XLA's and torch's summation orders. Over 20 steps at
# a learning rate of 1e-3 (50x google's, so that any difference in the update shows) the
# parameters measured differ by at most 7e-6 and the losses by 2e-6 relative; 1e-4 leaves
# room for other CPUs' kernels while a wrong decay mask, epsilon, clipping, schedule or loss
# reduction each moves parameters by about 1e-3 (one step of the learning rate) or more.
PARITY_STEPS, PARITY_BATCH, PARITY_SEQ, PARITY_LR = 20, 8, 16, 1e-3


def parity_batches(head: HeadSpec, pairs: bool, seed: int = 0) -> list[dict]:
    """Batches of random ids with lengths 4..16; pairs put the second half in segment 1."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(PARITY_STEPS):
        ids = np.zeros((PARITY_BATCH, PARITY_SEQ), np.int32)
        segments = np.zeros_like(ids)
        for row, length in enumerate(rng.integers(4, PARITY_SEQ + 1, PARITY_BATCH)):
            ids[row, :length] = rng.integers(5, CONFIG.vocab_size, length)
            ids[row, 0], ids[row, length - 1] = 2, 3  # [CLS] ... [SEP]
            if pairs:
                ids[row, length // 2 - 1] = 3
                segments[row, length // 2 : length] = 1
        mask = (ids > 0).astype(np.int32)
        batch = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
        batch["weights"] = np.ones(PARITY_BATCH, np.float32)
        if head.task == label_heads.REGRESSION:
            batch["labels"] = rng.uniform(0, 5, PARITY_BATCH).astype(np.float32)
        elif head.task == label_heads.CLASSIFICATION:
            batch["labels"] = rng.integers(0, head.num_outputs, PARITY_BATCH).astype(np.int32)
        elif head.task == label_heads.MULTI_LABEL:
            shape = (PARITY_BATCH, head.num_outputs)
            batch["labels"] = rng.integers(0, 2, shape).astype(np.float32)
        else:
            labels = rng.integers(0, head.num_outputs, ids.shape).astype(np.int32)
            labels[(mask == 0) | (ids == 2) | (ids == 3)] = label_heads.IGNORE_LABEL
            batch["labels"] = labels
        batches.append(batch)
    return batches
