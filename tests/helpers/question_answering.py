"""Question answering's small BERT, tokenizer, random parameters, logits and synthetic
examples."""

import dataclasses

import jax
import numpy as np

from bertjax.capability import HeadSpec
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad as qa
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.params import random_init

ATOL = 1e-4


WORDS = [f"w{i}" for i in range(40)] + ["q1", "q2", "after", "the", "cat", "paris", "."]


TOKENIZER = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])


CONFIG = dataclasses.replace(
    SMALL_BERT, vocab_size=len(WORDS) + 5, num_heads=4, intermediate_size=48
)


def qa_head() -> HeadSpec:
    return HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS)


def random_params(seed: int):
    """Every parameter random (biases and LayerNorm scales too, which a zero init would hide)."""
    model = qa_model.QuestionAnswering(CONFIG)
    return random_init(lambda: qa_model.init_params(model, jax.random.key(0)), seed)


IDS = np.array([[2, 17, 45, 3, 20, 30, 9, 3, 0, 0], [2, 40, 3, 11, 12, 3, 0, 0, 0, 0]], np.int32)


SEGMENTS = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]], np.int32)


MASK = (IDS > 0).astype(np.int32)


def our_logits(params):
    start, end = jax.jit(qa_model.QuestionAnswering(CONFIG).apply)(
        {"params": params}, IDS, SEGMENTS, MASK
    )
    return np.asarray(start)[MASK == 1], np.asarray(end)[MASK == 1]


def synthetic_examples(rng, count, vocabulary=30, length=12, impossible=0.3):
    """'the wX' over 12 distinct random words: the answer is where wX stands; a share of the
    questions ask for a word not in the context and have no answer (SQuAD v2.0 style)."""
    examples = []
    for k in range(count):
        words = [f"w{i}" for i in rng.choice(vocabulary, length, replace=False)]
        context = " ".join(words)
        if rng.random() < impossible:
            absent = sorted(set(f"w{i}" for i in range(vocabulary)) - set(words))
            question = f"the {rng.choice(absent)}"
            examples.append(qa.QAExample(str(k), question, context, (), is_impossible=True))
            continue
        pick = int(rng.integers(0, length))
        start = len(" ".join(words[:pick])) + (1 if pick else 0)
        answer = qa.Answer(words[pick], start)
        examples.append(qa.QAExample(str(k), f"the {words[pick]}", context, (answer,)))
    return examples
