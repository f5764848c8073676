"""The tokenizer a prepared directory holds: a given model copied in, or one trained on a
sample of the corpus's sentences (`make_tokenizer`), or of every source of a mixture
(`train_mixture_tokenizer`); a vocabulary that does not fit the corpus is said in one line."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator, Sequence

import numpy as np

from bertjax.data.corpus import InputReport, ReadSettings, read_documents
from bertjax.storage import fs
from bertjax.text.tokenizer import Tokenizer
from bertjax.text.training import TokenizerSettings, reservoir_sample, train_tokenizer

# Sentences a tokenizer is trained on (a reservoir sample of the corpus, or of each source's).
TOKENIZER_SAMPLE_SENTENCES = 1_000_000
# Stream tag of a mixture's tokenizer sample: (seed, tag, source name's key).
_TOKENIZER_STREAM = 2


def _sentences(paths: Sequence[str], read_settings: ReadSettings) -> Iterator[str]:
    for document in read_documents(paths, InputReport(), settings=read_settings):
        yield from document


# Sentencepiece's messages when the vocabulary does not fit the text it was trained on.
_VOCABULARY_TOO_LARGE = re.compile(
    r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)"
)
_VOCABULARY_TOO_SMALL = re.compile(
    r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)"
)


def _vocabulary_error(err: ValueError, vocab_size: int, inputs: Sequence[str]) -> ValueError | None:
    """One line for a vocabulary that does not fit the corpus, with a size that would, or None."""
    message = f"{err} {err.__cause__ or ''}"
    names = ", ".join(inputs[:3]) + (", ..." if len(inputs) > 3 else "")
    if match := _VOCABULARY_TOO_LARGE.search(message):
        largest = int(match.group(2))
        return ValueError(
            f"vocab_size={vocab_size} is too large for the corpus {names}: its text yields at "
            f"most {largest} pieces; use vocab_size <= {largest}, or more text."
        )
    if match := _VOCABULARY_TOO_SMALL.search(message):
        smallest = int(match.group(2))
        return ValueError(
            f"vocab_size={vocab_size} is too small for the corpus {names}: covering its "
            f"characters takes {smallest} pieces; use vocab_size >= {smallest}."
        )
    return None


def make_tokenizer(
    inputs: list[str],
    tokenizer_file: fs.AnyPath,
    tokenizer_path: str | os.PathLike | None,
    vocab_size: int,
    model_type: str,
    lowercase: bool,
    sample_sentences: int,
    seed: int,
    log,
    read_settings: ReadSettings,
) -> Tokenizer:
    """The given tokenizer copied in, or one trained on a corpus sample, at tokenizer_file."""
    if tokenizer_path is not None:
        tokenizer = Tokenizer.load(tokenizer_path)
        tokenizer.save(tokenizer_file)
        return tokenizer
    settings = TokenizerSettings(
        vocab_size=vocab_size,
        model_type=model_type,
        lowercase=lowercase,
        sample_sentences=sample_sentences,
        seed=seed,
    )
    start = time.perf_counter()
    try:
        tokenizer = train_tokenizer(_sentences(inputs, read_settings), settings, tokenizer_file)
    except ValueError as err:
        clearer = _vocabulary_error(err, vocab_size, inputs)
        if clearer is None:
            raise
        raise clearer from err
    log(f"Trained a {tokenizer.vocab_size}-piece tokenizer in {time.perf_counter() - start:.1f}s")
    return tokenizer


def train_mixture_tokenizer(
    sources: Sequence[tuple[str, Sequence[str], ReadSettings]],
    output_path: str | os.PathLike,
    *,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    lowercase: bool = False,
    sample_sentences: int = TOKENIZER_SAMPLE_SENTENCES,
    seed: int = 12345,
    log=print,
) -> Tokenizer:
    """A tokenizer trained on every source of a mixture, written to output_path.

    ``sources`` are (name, inputs, read settings). Each source gives an equal share of
    ``sample_sentences`` (one more each for the first by name when it does not divide), a
    uniform reservoir sample of its sentences in stream order, drawn from ``(seed, its
    name)``, the samples taken in the order of the names: the vocabulary covers every corpus
    however small its weight, the same sources give the same tokenizer whatever their weights
    and order, and a source with fewer sentences than its share gives all of them.
    """
    if not sources:
        raise ValueError("train_mixture_tokenizer needs at least one source")
    if sample_sentences < len(sources):
        raise ValueError(
            f"sample_sentences={sample_sentences} is fewer than one sentence per source "
            f"({len(sources)} sources)"
        )
    share, extra = divmod(sample_sentences, len(sources))
    start = time.perf_counter()
    sample: list[str] = []
    taken = []
    by_name = sorted(sources, key=lambda source: source[0])
    for index, (name, inputs, read_settings) in enumerate(by_name):
        key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "little")
        rng = np.random.default_rng([seed, _TOKENIZER_STREAM, key])
        sentences = _sentences([str(p) for p in inputs], read_settings)
        try:
            drawn = reservoir_sample(sentences, share + (index < extra), rng)
        except ValueError as err:  # a source that holds no text, named
            raise ValueError(f"source {name!r}: {err}") from None
        sample.extend(drawn)
        taken.append(f"{name} {len(drawn):,}")
    settings = TokenizerSettings(
        vocab_size=vocab_size,
        model_type=model_type,
        lowercase=lowercase,
        sample_sentences=max(len(sample), 1),  # the sample is drawn: train on all of it
        seed=seed,
    )
    try:
        tokenizer = train_tokenizer(sample, settings, output_path)
    except ValueError as err:
        inputs = [str(p) for _, paths, _ in sources for p in paths]
        clearer = _vocabulary_error(err, vocab_size, inputs)
        if clearer is None:
            raise
        raise clearer from err
    log(
        f"Trained a {tokenizer.vocab_size}-piece tokenizer on {len(sample):,} sentences "
        f"({', '.join(taken)}) in {time.perf_counter() - start:.1f}s"
    )
    return tokenizer
