"""The seq2seq task's files, config and exported model."""

import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertForPreTraining
from bertjax.tasks.seq2seq import hf as seq2seq_hf
from bertjax.tasks.seq2seq import model as s2s
from bertjax.text.tokenizer import WordPieceTokenizer
from configs import finetune as finetune_config

WORDS = [f"w{i}" for i in range(27)]


SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


START, EOS = 2, 3


def bert_config(**fields) -> BertConfig:
    return BertConfig(
        **{
            "vocab_size": len(SPECIAL) + len(WORDS),
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 16,
            **fields,
        }
    )


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> pathlib.Path:
    """A transformers BERT directory (random BertForPreTraining weights) with a WordPiece
    vocabulary of [PAD] [UNK] [CLS] [SEP] [MASK] w0..w26: the model to fine-tune."""
    root = tmp_path_factory.mktemp("source")
    (root / "vocab.txt").write_text("\n".join([*SPECIAL, *WORDS]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(root / "vocab.txt")
    config = bert_config()
    ids = np.zeros((1, 4), np.int32)
    params = jax.jit(BertForPreTraining(config).init)(jax.random.key(0), ids, ids, ids)["params"]
    bert_hf.save(config, nn.meta.unbox(params), root / "model", tokenizer)
    return root / "model"


def reversals(rng, count: int, labelled: bool = True) -> list[str]:
    """TSV lines: 3 to 5 words, and (labelled) the same words reversed."""
    lines = ["source\ttarget" if labelled else "source"]
    for _ in range(count):
        words = list(rng.choice(WORDS, size=rng.integers(3, 6)))
        lines.append(" ".join(words) + ("\t" + " ".join(words[::-1]) if labelled else ""))
    return lines


def write_data(directory: pathlib.Path, train: int, validation: int, test: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for name, count, labelled in (
        ("train.tsv", train, True),
        ("dev.tsv", validation, True),
        ("test.tsv", test, False),
    ):
        (directory / name).write_text("\n".join(reversals(rng, count, labelled)) + "\n")


def make_config(source: pathlib.Path, data: pathlib.Path, **fields):
    config = finetune_config.get_config()
    config.init_from = str(source)
    config.task = "seq2seq"
    config.data.train = str(data / "train.tsv")
    config.data.validation = str(data / "dev.tsv")
    config.data.test = str(data / "test.tsv")
    config.data.max_seq_length = 8
    config.data.max_target_length = 8
    config.batch_size = 8
    config.eval_batch_size = 8
    config.update_from_flattened_dict(fields)
    return config


def _batch(rng, rows=4):
    ids = np.zeros((rows, 8), np.int32)
    targets = []
    for i in range(rows):
        words = rng.integers(5, 32, size=rng.integers(2, 5))
        ids[i, : len(words) + 2] = [START, *words, EOS]
        targets.append(words[::-1].tolist())
    batch = dict(
        input_ids=ids,
        input_mask=(ids > 0).astype(np.int32),
        segment_ids=np.zeros_like(ids),
        **s2s.target_features(targets, 6, START, EOS),
    )
    batch["weights"] = np.ones(rows, np.float32)
    return batch


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """A transformers EncoderDecoderModel directory of random weights, written by bertjax,
    with the tokenizer; initializer_range 0.2 so that outputs vary by input."""
    run_dir = tmp_path_factory.mktemp("vocab")
    (run_dir / "vocab.txt").write_text("\n".join([*SPECIAL, *WORDS]) + "\n")
    tokenizer = WordPieceTokenizer.from_vocab(run_dir / "vocab.txt")
    config = s2s.Seq2SeqConfig(
        bert_config(initializer_range=0.2, max_position_embeddings=24), START, EOS, s2s.RND2RND
    )
    params = nn.meta.unbox(jax.jit(lambda key: s2s.init_params(config, key))(jax.random.key(5)))
    directory = run_dir / "export"
    seq2seq_hf.save_seq2seq(config, params, directory, tokenizer)
    return directory


TEXTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9 w10", "w11", "w3 w3 w12 w20"]
