"""The embedding task's files (a random tiny sentence-transformers directory and the task's
data), its config, and examples as flat features and as [batch, texts, seq]."""

import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.tasks.embed import hf as sbert
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.text.tokenizer import WordPieceTokenizer
from configs import finetune as finetune_config
from tests.helpers.embedding import CONFIG, random_params, synthetic_pairs, synthetic_sts

SEQ = 16


TRAIN_EXAMPLES = 2048


LONG = " ".join(f"w{i % 90}" for i in range(60))  # far longer than SEQ: cut


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> pathlib.Path:
    """A sentence-transformers directory of a random tiny model, and the task's files."""
    root = tmp_path_factory.mktemp("embedding_task")
    words = [f"w{i}" for i in range(CONFIG.vocab_size - 5)]
    (root / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n"
    )
    tokenizer = WordPieceTokenizer.from_vocab(root / "vocab.txt")
    sbert.save(
        root / "source", CONFIG, random_params(3), tokenizer, EmbeddingSpec("mean", False, SEQ)
    )
    # A freshly initialised encoder (BERT's initializer) as the model a short run starts from.
    init = jax.jit(lambda key: embedding.init_params(embedding.BiEncoder(CONFIG), key))
    fresh = nn.meta.unbox(init(jax.random.key(0)))
    sbert.save(root / "initial", CONFIG, fresh, tokenizer, EmbeddingSpec("mean", False, SEQ))
    rng = np.random.default_rng(0)
    anchors, positives = synthetic_pairs(rng, TRAIN_EXAMPLES)
    negatives, _ = synthetic_pairs(rng, TRAIN_EXAMPLES)
    (root / "train.tsv").write_text(
        "anchor\tpositive\tnegative\n"
        + "".join(f"{a}\t{p}\t{n}\n" for a, p, n in zip(anchors, positives, negatives))
    )
    left, right, gold = synthetic_sts(rng, 300)
    (root / "dev.tsv").write_text(
        "anchor\tpositive\tscore\n"
        + "".join(f"{a}\t{b}\t{g}\n" for a, b, g in zip(left, right, gold))
    )
    # Retrieval: each query's relevant document is its paraphrase; the rest distract.
    queries, documents = synthetic_pairs(rng, 40)
    (root / "queries.tsv").write_text("".join(f"q{i}\t{t}\n" for i, t in enumerate(queries)))
    (root / "corpus.tsv").write_text("".join(f"d{i}\t{t}\n" for i, t in enumerate(documents)))
    (root / "qrels.tsv").write_text("".join(f"q{i}\td{i}\n" for i in range(40)))
    return root


def _config(root: pathlib.Path, **fields):
    config = finetune_config.get_config()
    config.init_from = str(root / "source")
    config.task = "embedding"
    config.data.train = str(root / "train.tsv")
    config.data.validation = str(root / "dev.tsv")
    config.data.text_fields = "anchor,positive,negative"
    config.data.label_field = "score"
    config.data.max_seq_length = SEQ
    config.batch_size = 32
    config.eval_batch_size = 64
    config.update_from_flattened_dict(fields)
    return config


def _flat_and_stacked(texts: int, seed: int) -> tuple[dict, dict]:
    """The same random examples as the task's flat features and as [batch, texts, seq]."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(SEQ) < rng.integers(2, SEQ, (8, texts, 1))).astype(np.int32)
    ids = rng.integers(5, CONFIG.vocab_size, (8, texts, SEQ)).astype(np.int32) * mask
    stacked = {"input_ids": ids, "input_mask": mask, "segment_ids": 0 * ids}
    stacked["weights"] = np.asarray([1] * 7 + [0], np.float32)  # the last row only pads
    stacked["scores"] = rng.uniform(0, 3, 8).astype(np.float32)
    flat = {k: stacked[k] for k in ("weights", "scores")}
    for k, prefix in enumerate(("", "positive_", "negative_")[:texts]):
        for name in ("input_ids", "input_mask", "segment_ids"):
            flat[prefix + name] = stacked[name][:, k]
    return flat, stacked
