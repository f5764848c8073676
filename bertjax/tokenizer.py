"""SentencePiece tokenizer with BERT's special tokens at fixed ids.

Ids 0..4 are [PAD], [UNK], [CLS], [SEP], [MASK]. [PAD], [CLS], [SEP] and [MASK] are control
symbols: sentencepiece never produces them from text, so typing "[MASK]" in a document yields
ordinary pieces. Byte fallback maps any character outside the vocabulary to its UTF-8 bytes, so
text never becomes [UNK].
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pathlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_PIECES = (PAD, UNK, CLS, SEP, MASK)

MODEL_TYPES = ("unigram", "bpe")
# Sentencepiece's built-in normalizations. "nmt_nfkc" is NFKC plus whitespace clean-up; NFKC
# folds compatibility forms (full-width "，" becomes ","), so text round-trips up to NFKC.
# "identity" keeps text byte for byte.
NORMALIZATIONS = ("nmt_nfkc", "nfkc", "identity")
# The word-boundary marker sentencepiece puts in front of pieces that follow a space.
WORD_BOUNDARY = "\u2581"
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
) -> Tokenizer:
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
    tokenizer = Tokenizer(writer.getvalue(), source=f"trained model for {output_path}")
    tokenizer.save(output_path)
    return tokenizer


def _is_cjk(char: str) -> bool:
    """True for Chinese/Japanese characters, each of which counts as a word by itself."""
    cp = ord(char)
    return (
        0x3040 <= cp <= 0x30FF  # hiragana, katakana
        or 0x3400 <= cp <= 0x4DBF  # CJK extension A
        or 0x4E00 <= cp <= 0x9FFF  # CJK unified ideographs
        or 0xF900 <= cp <= 0xFAFF  # CJK compatibility ideographs
        or 0xFF66 <= cp <= 0xFF9F  # half-width katakana
        or 0x20000 <= cp <= 0x2FA1F  # CJK extensions B..F, compatibility supplement
        or 0x3000 <= cp <= 0x303F  # CJK symbols and punctuation
        or 0x31F0 <= cp <= 0x31FF  # katakana phonetic extensions
    )


# UTF-8 lead bytes of code points U+3000..U+9FFF (3-byte forms 0xE3..0xE9) and of the
# supplementary CJK planes (U+20000.. lead byte 0xF0): a fallback byte sequence for a CJK
# character starts a word, like the character itself would.
_CJK_LEAD_BYTES = frozenset(range(0xE3, 0xEA)) | {0xF0}


class Tokenizer:
    """A loaded sentencepiece model with BERT's special ids."""

    pad_id = PAD_ID
    unk_id = UNK_ID
    cls_id = CLS_ID
    sep_id = SEP_ID
    mask_id = MASK_ID

    def __init__(self, model_proto: bytes, *, source: str = "<memory>"):
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self._proto)
        except (RuntimeError, OSError) as err:
            raise ValueError(f"{source} is not a sentencepiece model: {err}") from err
        self._check_specials(source)
        self.vocab_size: int = self._sp.get_piece_size()
        self.fingerprint: str = hashlib.sha256(self._proto).hexdigest()
        self.special_ids: tuple[int, ...] = tuple(
            i for i in range(self.vocab_size) if self._sp.IsControl(i) or self._sp.IsUnknown(i)
        )
        self._special_set = frozenset(self.special_ids)
        self.is_word_start: np.ndarray = self._word_starts()  # [vocab_size] bool

    def _check_specials(self, source: str) -> None:
        size = self._sp.get_piece_size()
        found = [self._sp.id_to_piece(i) if i < size else None for i in range(len(SPECIAL_PIECES))]
        kinds_ok = (
            size > len(SPECIAL_PIECES)
            and self._sp.IsUnknown(UNK_ID)
            and all(self._sp.IsControl(i) for i in (PAD_ID, CLS_ID, SEP_ID, MASK_ID))
        )
        if tuple(found) != SPECIAL_PIECES or not kinds_ok:
            raise ValueError(
                f"{source} is a sentencepiece model without BERT's special tokens: ids 0..4 are "
                f"{found}, expected {list(SPECIAL_PIECES)} as control symbols ([UNK] as unknown). "
                "Train it with bertjax.tokenizer.train_tokenizer."
            )

    def _word_starts(self) -> np.ndarray:
        starts = np.zeros(self.vocab_size, dtype=bool)  # [vocab_size]
        for i in range(self.vocab_size):
            if i in self._special_set:
                starts[i] = True
            elif self._sp.IsByte(i):
                # "<0xAB>": continuation bytes (0x80..0xBF) and ASCII bytes continue a word.
                starts[i] = int(self._sp.id_to_piece(i)[3:5], 16) in _CJK_LEAD_BYTES
            else:
                piece = self._sp.id_to_piece(i)
                starts[i] = piece.startswith(WORD_BOUNDARY) or _is_cjk(piece[0])
        return starts

    @classmethod
    def load(cls, path: str | os.PathLike, expected_fingerprint: str | None = None) -> Tokenizer:
        """Loads a .model file; checks BERT's special ids and, if given, the fingerprint."""
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer model {str(path)!r} does not exist")
        tokenizer = cls(path.read_bytes(), source=f"tokenizer model {str(path)!r}")
        if expected_fingerprint is not None and tokenizer.fingerprint != expected_fingerprint:
            raise ValueError(
                f"tokenizer model {str(path)!r} has fingerprint {tokenizer.fingerprint}, but "
                f"{expected_fingerprint} was expected (the data was prepared with another "
                "tokenizer)"
            )
        return tokenizer

    def save(self, path: str | os.PathLike) -> None:
        """Writes the serialized model proto (atomically) to path."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self._proto)
        os.replace(tmp, path)

    @property
    def model_proto(self) -> bytes:
        """The serialized sentencepiece model."""
        return self._proto

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        if not texts:
            return []
        return self._sp.encode(list(texts), out_type=int)

    def encode(self, text: str) -> list[int]:
        """Token ids of one text, without special tokens."""
        return self._sp.encode(text, out_type=int)

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece of an id."""
        return self._sp.id_to_piece(int(token_id))

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ids; special ids appear as their names ("[CLS]") unless skip_special."""
        parts: list[str] = []
        run: list[int] = []
        for token_id in ids:
            token_id = int(token_id)
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})"
                )
            if token_id in self._special_set:
                if run:
                    parts.append(self._sp.decode(run))
                    run = []
                if not skip_special:
                    parts.append(self._sp.id_to_piece(token_id))
            else:
                run.append(token_id)
        if run:
            parts.append(self._sp.decode(run))
        return " ".join(p for p in parts if p)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint[:12]})"
