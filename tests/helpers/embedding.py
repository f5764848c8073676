"""The embedding models' tests' small BERT and ModernBERT configs, texts, pair batches, random
parameters, a WordPiece vocabulary and synthetic pairs and STS scores."""

import dataclasses

import jax
import numpy as np
import pytest

import bertjax
from bertjax.encoders.bert.config import BertConfig
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed.task import head_for
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers import finetune_hf, modernbert
from tests.helpers.params import random_init

TOL = 1e-5


CONFIG = dataclasses.replace(finetune_hf.CONFIG, hidden_dropout=0.0, attention_dropout=0.0)


# A ModernBERT encoder of the same width (helpers/modernbert's small one): a global layer, two
# local ones (windows of 8 tokens), a global one; transformers' RoPE bases, wordpiece's special
# ids.
MODERN = dataclasses.replace(
    modernbert.SMALL,
    max_position_embeddings=40,
    global_rope_theta=160_000.0,
    local_rope_theta=10_000.0,
    cls_token_id=2,
    sep_token_id=3,
)


# One layer where gradients are compared: several gradient programs compile per test.
SHALLOW = BertConfig(**{**CONFIG.to_dict(), "num_layers": 1})


def embed_texts(config, params, tokenizer, spec, texts, batch_size=32, mesh=None) -> np.ndarray:
    """Texts embedded as `spec` says, by a notebook Model of an embedding head (the one path
    every notebook method takes)."""
    head = head_for(spec)
    model = bertjax.Model(config, params, tokenizer, head=head, batch_size=batch_size, mesh=mesh)
    return model.embed(texts)


def random_params(seed: int, config: BertConfig = CONFIG):
    """Every encoder parameter random (biases and LayerNorm too, which zero init would hide)."""
    model = embedding.BiEncoder(config)
    return random_init(lambda: embedding.init_params(model, jax.random.key(0)), seed)


def pair_batch(seed: int, rows: int = 16, texts: int = 3, seq: int = 10, padded_rows: int = 1):
    """Random [rows, texts, seq] inputs of random lengths; the last rows only pad."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, seq + 1, (rows, texts))
    mask = (np.arange(seq) < lengths[..., None]).astype(np.int32)  # [b, t, s]
    ids = rng.integers(5, CONFIG.vocab_size, (rows, texts, seq)).astype(np.int32) * mask
    weights = np.ones(rows, np.float32)
    weights[rows - padded_rows :] = 0.0
    return {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": np.zeros_like(ids),
        "weights": weights,
        "scores": rng.uniform(0, 5, rows).astype(np.float32),
    }


def max_difference(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    words = [f"w{i}" for i in range(CONFIG.vocab_size - 5)]
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    return WordPieceTokenizer.from_vocab(vocab)


TEXTS = [
    "w1 w2 w3",
    "",  # [CLS] [SEP] only
    "w40 w7",
    " ".join(f"w{i % 90}" for i in range(60)),  # longer than max_seq_length: cut
    "w5 w5 w5 w5 w9",
]


def _synthetic_sentence(rng, concepts, fillers: int = 2) -> str:
    """Each concept c written as one of its two synonyms (w{2c}, w{2c+1}), plus filler
    words (w60 on), shuffled: only training can tell that synonyms mean the same."""
    words = [f"w{2 * c + rng.integers(2)}" for c in concepts]
    words += [f"w{60 + rng.integers(34)}" for _ in range(fillers)]
    return " ".join(rng.permutation(words))


def synthetic_pairs(rng, count: int) -> tuple[list[str], list[str]]:
    """Paraphrase pairs: the same three concepts (of 30), written independently."""
    anchors, positives = [], []
    for _ in range(count):
        concepts = rng.choice(30, 3, replace=False)
        anchors.append(_synthetic_sentence(rng, concepts))
        positives.append(_synthetic_sentence(rng, concepts))
    return anchors, positives


def synthetic_sts(rng, count: int) -> tuple[list[str], list[str], np.ndarray]:
    """Scored pairs: gold is how many of their three concepts two sentences share (0-3)."""
    left, right, gold = [], [], []
    for _ in range(count):
        shared = int(rng.integers(4))
        concepts = rng.choice(30, 6 - shared, replace=False)
        left.append(_synthetic_sentence(rng, concepts[:3]))
        right.append(_synthetic_sentence(rng, concepts[3 - shared :]))
        gold.append(shared)
    return left, right, np.asarray(gold, np.float64)
