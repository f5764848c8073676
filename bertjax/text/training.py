"""Training bertjax's sentencepiece models (unigram or BPE) on a sample of the corpus, with
BERT's special tokens at ids 0..4 and byte fallback."""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Iterable, Iterator

import numpy as np
import sentencepiece as spm

from bertjax.text.special_tokens import CLS, MASK, PAD, PAD_ID, SEP, UNK, UNK_ID
from bertjax.text.tokenizer import SentencePieceTokenizer

MODEL_TYPES = ("unigram", "bpe")
# Sentencepiece's built-in normalizations. "nmt_nfkc" is NFKC plus whitespace clean-up; NFKC
# folds compatibility forms (full-width "，" becomes ","), so text round-trips up to NFKC.
# "identity" keeps text byte for byte.
NORMALIZATIONS = ("nmt_nfkc", "nfkc", "identity")
# Sentencepiece skips training sentences longer than this many bytes; documents split lines
# far below it, so this only guards against pathological input.
_MAX_SENTENCE_BYTES = 16384


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    """How to train the sentencepiece model."""

    vocab_size: int = 8000
    model_type: str = "unigram"  # "unigram" | "bpe"
    lowercase: bool = False
    normalization: str = "nmt_nfkc"  # one of NORMALIZATIONS
    # Training reads at most this many sentences, a uniform reservoir sample of the input.
    sample_sentences: int = 1_000_000
    character_coverage: float = 0.9995
    # Sentencepiece training is deterministic for a fixed thread count, not across counts.
    num_threads: int = 4
    seed: int = 0

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"TokenizerSettings.model_type={self.model_type!r} is not valid; "
                f"choose one of {MODEL_TYPES}"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"TokenizerSettings.normalization={self.normalization!r} is not valid; "
                f"choose one of {NORMALIZATIONS}"
            )
        if self.lowercase and self.normalization == "identity":
            raise ValueError(
                "TokenizerSettings.lowercase=True needs normalization 'nmt_nfkc' or 'nfkc' "
                "(sentencepiece lower-cases as part of NFKC case folding), not 'identity'"
            )
        # 5 specials + 256 byte pieces must fit with room for real pieces.
        if self.vocab_size < 300:
            raise ValueError(
                f"TokenizerSettings.vocab_size={self.vocab_size} is too small; it must be >= 300 "
                "(5 special tokens and 256 byte-fallback pieces are always in the vocabulary)"
            )
        if self.sample_sentences < 1:
            raise ValueError(
                f"TokenizerSettings.sample_sentences={self.sample_sentences} must be >= 1"
            )
        if not 0.0 < self.character_coverage <= 1.0:
            raise ValueError(
                f"TokenizerSettings.character_coverage={self.character_coverage} must be in (0, 1]"
            )
        if self.num_threads < 1:
            raise ValueError(f"TokenizerSettings.num_threads={self.num_threads} must be >= 1")

    @property
    def normalization_rule(self) -> str:
        """Sentencepiece's normalization rule name, with case folding when lower-casing."""
        return f"{self.normalization}_cf" if self.lowercase else self.normalization


def reservoir_sample(items: Iterable[str], k: int, rng: np.random.Generator) -> list[str]:
    """A uniform sample of at most k items from a stream, kept in stream order (algorithm R)."""
    sample: list[str] = []
    slots: list[int] = []  # stream index of each sampled item, to restore stream order
    seen = 0
    for block in _blocks(iter(items), 65536):
        fill = min(len(block), max(k - seen, 0))
        sample.extend(block[:fill])
        slots.extend(range(seen, seen + fill))
        if fill < len(block):
            _reservoir_block(sample, slots, block[fill:], seen + fill, k, rng)
        seen += len(block)
    order = np.argsort(np.asarray(slots, dtype=np.int64), kind="stable")
    return [sample[i] for i in order]


def _blocks(it: Iterator[str], size: int) -> Iterator[list[str]]:
    block: list[str] = []
    for item in it:
        block.append(item)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


def _reservoir_block(sample, slots, block, block_start, k, rng):
    # Item number n (0-based) replaces slot j ~ U{0..n} when j < k.
    upper = np.arange(block_start, block_start + len(block), dtype=np.int64) + 1
    draws = np.floor(rng.random(len(block)) * upper).astype(np.int64)
    for offset in np.flatnonzero(draws < k):
        j = int(draws[offset])
        sample[j] = block[offset]
        slots[j] = block_start + int(offset)


def train_tokenizer(
    sentences: Iterable[str], settings: TokenizerSettings, output_path: str | os.PathLike
) -> SentencePieceTokenizer:
    """Trains a sentencepiece model on (a sample of) sentences and writes it to output_path."""
    rng = np.random.default_rng(settings.seed)
    sample = [s for s in reservoir_sample(sentences, settings.sample_sentences, rng) if s.strip()]
    if not sample:
        raise ValueError("train_tokenizer got no non-empty sentences to train on")
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_writer=writer,
            vocab_size=settings.vocab_size,
            model_type=settings.model_type,
            normalization_rule_name=settings.normalization_rule,
            character_coverage=settings.character_coverage,
            pad_id=PAD_ID,
            pad_piece=PAD,
            unk_id=UNK_ID,
            unk_piece=UNK,
            bos_id=-1,
            eos_id=-1,
            control_symbols=[CLS, SEP, MASK],
            byte_fallback=True,
            # Our reservoir sample is the sample; sentencepiece must not resample or shuffle.
            input_sentence_size=0,
            shuffle_input_sentence=False,
            max_sentence_length=_MAX_SENTENCE_BYTES,
            num_threads=settings.num_threads,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise ValueError(
            f"sentencepiece training failed with vocab_size={settings.vocab_size}, "
            f"model_type={settings.model_type!r} on {len(sample)} sentences: {err}"
        ) from err
    tokenizer = SentencePieceTokenizer(writer.getvalue(), source=f"trained model for {output_path}")
    tokenizer.save(output_path)
    return tokenizer
