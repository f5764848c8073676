"""Tokenizers with BERT's special tokens: sentencepiece (bertjax.text.training trains them),
WordPiece (vocab.txt)
and transformers' tokenizer.json pipelines (ModernBERT's byte-level BPE).

`Tokenizer` is the one interface the rest of bertjax uses: token ids of texts without special
tokens (`encode`, `encode_batch`), text of ids (`decode`), the special ids, which pieces start a
word (for whole-word masking), a fingerprint, and the files transformers reads (`save_hf`).
Three kinds implement it (the third, `PipelineTokenizer`, is described where it is defined):

`SentencePieceTokenizer` is the model bertjax trains (unigram or BPE). Ids 0..4 are [PAD],
[UNK], [CLS], [SEP], [MASK]. [PAD], [CLS], [SEP] and [MASK] are control symbols: sentencepiece
never produces them from text, so typing "[MASK]" in a document yields ordinary pieces. Byte
fallback maps any character outside the vocabulary to its UTF-8 bytes, so text never becomes
[UNK].

`WordPieceTokenizer` reads BERT's own vocabularies (vocab.txt, cased or uncased) with google's
basic tokenization: control characters dropped, CJK characters and punctuation split off, and
when uncased, lower-casing and accent stripping. The `tokenizers` library runs it, built the
way transformers' BertTokenizerFast builds it, so the ids are transformers' ids.

`save_hf` writes tokenizer.json (a `tokenizers` pipeline), tokenizer_config.json and
special_tokens_map.json, so that `transformers.AutoTokenizer.from_pretrained` gives bertjax's
ids. For sentencepiece, tokenizer.json restates the model in `tokenizers` terms
(bertjax.text.sentencepiece_json). BERT's special tokens: bertjax.text.special_tokens;
training a sentencepiece model: bertjax.text.training.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
import tokenizers
from tokenizers import decoders, normalizers, pre_tokenizers

from bertjax.storage import fs
from bertjax.text import sentencepiece_json
from bertjax.text.special_tokens import (
    CLS_ID,
    HF_SPECIAL_TOKENS,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    SPECIAL_PIECES,
    UNK,
    UNK_ID,
    WORD_BOUNDARY,
    bert_post_processor,
    special_added_tokens,
)

logger = logging.getLogger(__name__)

# Files of a transformers tokenizer directory, and the tokenizer files each kind adds to it.
HF_TOKENIZER_FILE = "tokenizer.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
HF_SPECIAL_TOKENS_FILE = "special_tokens_map.json"
WORDPIECE_VOCAB_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "tokenizer.model"  # the name a prepared data directory uses too

# The special tokens written in a text, as transformers finds them: literally, leftmost first.
_SPECIAL_IN_TEXT = re.compile("(" + "|".join(re.escape(p) for p in SPECIAL_PIECES) + ")")
# WordPiece's marker of a piece that continues a word.
_CONTINUATION = "##"


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
    """The interface of every tokenizer: ids of text, text of ids, special ids, fingerprint.

    Construct one with `Tokenizer.load` (a sentencepiece .model or a tokenizer.json),
    `bertjax.text.training.train_tokenizer`, `WordPieceTokenizer.from_vocab` (BERT's
    vocab.txt) or `bertjax.text.directory.load_tokenizer` (a transformers directory).
    """

    # bertjax's fixed layout, which every SentencePieceTokenizer has. A WordPieceTokenizer
    # sets its vocabulary's ids per instance (bert-base-uncased: [CLS]=101, [MASK]=103).
    pad_id = PAD_ID
    unk_id = UNK_ID
    cls_id = CLS_ID
    sep_id = SEP_ID
    mask_id = MASK_ID

    kind: str  # "sentencepiece" | "wordpiece" | "pipeline"
    own_file: str  # its file in a transformers directory, beside tokenizer.json
    vocab_size: int
    # sha256 hex digest of what decides the ids: equal fingerprints, equal tokenization.
    fingerprint: str
    special_ids: tuple[int, ...]
    is_word_start: np.ndarray  # [vocab_size] bool: the piece begins a word (specials too)

    @classmethod
    def load(cls, path: str | os.PathLike, expected_fingerprint: str | None = None) -> Tokenizer:
        """Loads a sentencepiece .model, or a tokenizer.json (by the .json suffix).

        Checks BERT's special tokens and, if given, the fingerprint. A vocab.txt does not say
        whether it is cased: load it with `WordPieceTokenizer.from_vocab` or, with its
        tokenizer_config.json, `bertjax.text.directory.load_tokenizer`.
        """
        path = fs.path(path)
        with fs.errors(path, "read"):
            if not path.is_file():
                raise FileNotFoundError(f"tokenizer model {str(path)!r} does not exist")
        source = f"tokenizer model {str(path)!r}"
        if path.suffix == ".txt":
            raise ValueError(
                f"{source} looks like a WordPiece vocab.txt, which does not say whether it is "
                "cased; load it with bertjax.text.tokenizer.WordPieceTokenizer.from_vocab(path, "
                "lowercase=...) or load its directory with bertjax.text.directory.load_tokenizer"
            )
        if path.suffix == ".json":
            tokenizer: Tokenizer = tokenizer_from_json(fs.read_text(path), source=source)
        else:
            # sentencepiece reads the model from its bytes: no local copy of a gs:// file.
            tokenizer = SentencePieceTokenizer(fs.read_bytes(path), source=source)
        if not isinstance(tokenizer, cls):
            raise ValueError(f"{source} is a {tokenizer.kind} tokenizer, not a {cls.__name__}")
        if expected_fingerprint is not None and tokenizer.fingerprint != expected_fingerprint:
            raise ValueError(
                f"tokenizer model {str(path)!r} has fingerprint {tokenizer.fingerprint}, but "
                f"{expected_fingerprint} was expected (the data was prepared with another "
                "tokenizer)"
            )
        return tokenizer

    def encode_batch(
        self, texts: Sequence[str], *, special_tokens_in_text: bool = False
    ) -> list[list[int]]:
        """Token ids of each text, without [CLS]/[SEP] added.

        With special_tokens_in_text, "[MASK]" (and the other special tokens) written in a
        text become their ids, as transformers' tokenizers read them; otherwise they are
        ordinary text.
        """
        raise NotImplementedError

    def encode(self, text: str, *, special_tokens_in_text: bool = False) -> list[int]:
        """Token ids of one text, without [CLS]/[SEP] added (see encode_batch)."""
        return self.encode_batch([text], special_tokens_in_text=special_tokens_in_text)[0]

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Token ids of each word of a text given as words (token labels), each on its own,
        as the word reads inside a text: a special token written in it ("[MASK]") is that
        token, as transformers reads words (`is_split_into_words`)."""
        return self.encode_batch(words, special_tokens_in_text=True)

    def encode_with_offsets(
        self, texts: Sequence[str], *, special_tokens_in_text: bool = False
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """(ids, character offsets) of each text: the ids of encode_batch (with the same
        `special_tokens_in_text`), and for each id the [start, end) characters of the text it
        came from (start == end for a piece that covers no character of its own; a special
        token read in the text spans its name)."""
        raise NotImplementedError

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ids; special ids appear as their names ("[CLS]") unless skip_special."""
        raise NotImplementedError

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece of an id."""
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> None:
        """Writes the tokenizer (atomically) to path, for `Tokenizer.load`."""
        raise NotImplementedError

    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        """The same tokenization as a `tokenizers` pipeline, what tokenizer.json holds.

        It adds [CLS] ... [SEP] (and [CLS] A [SEP] B [SEP] with segment ids for pairs) and
        splits off the special tokens written in a text.
        """
        raise NotImplementedError

    def save_hf(self, directory: str | os.PathLike, *, model_max_length: int | None = None):
        """Writes the tokenizer files of a transformers model directory.

        tokenizer.json, tokenizer_config.json and special_tokens_map.json, plus the
        tokenizer's own file (tokenizer.model or vocab.txt), so that bertjax reads back the
        same tokenizer (same fingerprint). `model_max_length` is the model's position limit.
        """
        directory = fs.makedirs(directory)
        # What tokenizers' own save writes (pretty JSON), through the storage layer.
        fs.write_text(directory / HF_TOKENIZER_FILE, self.hf_tokenizer().to_str(pretty=True))
        self._save_own_file(directory)
        for other in (SENTENCEPIECE_FILE, WORDPIECE_VOCAB_FILE):
            # Another tokenizer's file would be read in place of this one.
            if other != self.own_file and (directory / other).exists():
                fs.remove(directory / other)
                logger.warning("%s: removed, it belonged to another tokenizer", directory / other)
        config: dict[str, Any] = {**self._hf_config(), **HF_SPECIAL_TOKENS}
        if model_max_length is not None:
            config["model_max_length"] = int(model_max_length)
        _write_json(directory / HF_TOKENIZER_CONFIG_FILE, config)
        _write_json(directory / HF_SPECIAL_TOKENS_FILE, dict(HF_SPECIAL_TOKENS))

    def _save_own_file(self, directory: fs.AnyPath) -> None:
        """Writes own_file into directory."""
        raise NotImplementedError

    def _hf_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        checked = []
        for token_id in ids:
            token_id = int(token_id)
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})"
                )
            checked.append(token_id)
        return checked

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, "
            f"fingerprint={self.fingerprint[:12]})"
        )


def _write_json(path: fs.AnyPath, value: dict) -> None:
    fs.write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _save_atomic(path: str | os.PathLike, data: bytes) -> None:
    fs.write_bytes(path, data)  # whole or not at all, local or gs://


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece model (unigram or BPE) with BERT's special ids 0..4."""

    kind = "sentencepiece"
    own_file = SENTENCEPIECE_FILE

    def __init__(self, model_proto: bytes, *, source: str = "<memory>"):
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self._proto)
        except (RuntimeError, OSError) as err:
            raise ValueError(f"{source} is not a sentencepiece model: {err}") from err
        self._source = source
        self._check_specials(source)
        self.vocab_size: int = self._sp.get_piece_size()
        self.fingerprint: str = hashlib.sha256(self._proto).hexdigest()
        self.special_ids: tuple[int, ...] = tuple(
            i for i in range(self.vocab_size) if self._sp.IsControl(i) or self._sp.IsUnknown(i)
        )
        self._special_set = frozenset(self.special_ids)
        self._special_by_piece = {piece: i for i, piece in enumerate(SPECIAL_PIECES)}
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
                "Train it with bertjax.text.training.train_tokenizer."
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

    def save(self, path: str | os.PathLike) -> None:
        """Writes the serialized model proto (atomically) to path."""
        _save_atomic(path, self._proto)

    @property
    def model_proto(self) -> bytes:
        """The serialized sentencepiece model."""
        return self._proto

    def encode_batch(
        self, texts: Sequence[str], *, special_tokens_in_text: bool = False
    ) -> list[list[int]]:
        """Token ids of each text, without [CLS]/[SEP] added (see Tokenizer.encode_batch)."""
        if not texts:
            return []
        if not special_tokens_in_text:
            return self._sp.encode(list(texts), out_type=int)
        # A text splits at its special tokens and the text between them is encoded piece by
        # piece, as transformers does: "a [MASK]." is "▁a", [MASK], "▁.".
        parts_of = [_SPECIAL_IN_TEXT.split(text) for text in texts]
        encoded = iter(
            self._sp.encode([p for parts in parts_of for p in parts[0::2]], out_type=int)
        )
        result = []
        for parts in parts_of:
            ids: list[int] = []
            for k, part in enumerate(parts):
                if k % 2:
                    ids.append(self._special_by_piece[part])
                else:
                    ids.extend(next(encoded))
            result.append(ids)
        return result

    def encode(self, text: str, *, special_tokens_in_text: bool = False) -> list[int]:
        """Token ids of one text, without [CLS]/[SEP] added (see Tokenizer.encode_batch)."""
        if special_tokens_in_text:
            return self.encode_batch([text], special_tokens_in_text=True)[0]
        return self._sp.encode(text, out_type=int)

    def encode_with_offsets(
        self, texts: Sequence[str], *, special_tokens_in_text: bool = False
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """(ids, character offsets) of each text (see Tokenizer.encode_with_offsets)."""
        if not texts:
            return []
        if special_tokens_in_text:
            return [self._offsets_around_special_tokens(text) for text in texts]
        result = []
        # Each piece's begin and end are byte offsets into the text as given (a byte-fallback
        # character's last byte piece spans it, the others are empty).
        for text, proto in zip(texts, self._sp.encode(list(texts), return_type="proto")):
            # [chars + 1] byte offset where each character starts, and the end.
            starts = np.cumsum([0] + [len(c.encode("utf-8")) for c in text])
            ids, offsets = [], []
            for piece in proto.pieces:
                begin = int(np.searchsorted(starts, piece.begin, side="right")) - 1
                end = int(np.searchsorted(starts, piece.end, side="left"))
                # "▁word" covers the space before the word: the offsets start at the word.
                while begin < end and text[begin].isspace():
                    begin += 1
                ids.append(piece.id)
                offsets.append((begin, max(begin, end)))
            result.append((ids, offsets))
        return result

    def _offsets_around_special_tokens(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """encode_with_offsets of one text whose special tokens are read as such: the text
        between them encoded piece by piece, as encode_batch does."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        start = 0
        for k, part in enumerate(_SPECIAL_IN_TEXT.split(text)):
            if k % 2:
                ids.append(self._special_by_piece[part])
                offsets.append((start, start + len(part)))
            elif part:
                ((part_ids, part_offsets),) = self.encode_with_offsets([part])
                ids += part_ids
                offsets += [(start + begin, start + end) for begin, end in part_offsets]
            start += len(part)
        return ids, offsets

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece of an id."""
        return self._sp.id_to_piece(int(token_id))

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ids; special ids appear as their names ("[CLS]") unless skip_special."""
        parts: list[str] = []
        run: list[int] = []
        for token_id in self._check_ids(ids):
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

    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        """The model as a `tokenizers` pipeline (bertjax.text.sentencepiece_json, which says
        its one limit)."""
        return sentencepiece_json.pipeline(self._proto, self._source)

    def _save_own_file(self, directory: fs.AnyPath) -> None:
        self.save(directory / self.own_file)

    def _hf_config(self) -> dict[str, Any]:
        # The generic fast tokenizer reads tokenizer.json as it is.
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
            # BERT takes segment ids: without this, the generic class leaves them out.
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        }


class _TokenizersPipeline(Tokenizer):
    """What the kinds run by a `tokenizers` pipeline share: encoding, offsets, decoding and
    the pipeline's own file. `_use_pipeline` sets the pipeline."""

    def _use_pipeline(self, pipeline: tokenizers.Tokenizer) -> None:
        # A file's padding and truncation sections are call-time settings (a tokenizer saved
        # after a padded call keeps them): left on, `encode_batch` would pad each text to the
        # batch's longest with pad ids taken for text, and cut it before its end, so a text's
        # ids would depend on the others of the call. bertjax pads and truncates itself, as
        # transformers overrides both on every call.
        pipeline.no_padding()
        pipeline.no_truncation()
        self._tokenizer = pipeline
        # The same pipeline reading special tokens in text as ordinary text.
        self._plain = tokenizers.Tokenizer.from_str(pipeline.to_str())
        self._plain.encode_special_tokens = True

    def encode_batch(
        self, texts: Sequence[str], *, special_tokens_in_text: bool = False
    ) -> list[list[int]]:
        """Token ids of each text, without [CLS]/[SEP] added (see Tokenizer.encode_batch)."""
        if not texts:
            return []
        tokenizer = self._tokenizer if special_tokens_in_text else self._plain
        return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_offsets(
        self, texts: Sequence[str], *, special_tokens_in_text: bool = False
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """(ids, character offsets) of each text (see Tokenizer.encode_with_offsets)."""
        if not texts:
            return []
        tokenizer = self._tokenizer if special_tokens_in_text else self._plain
        encoded = tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, [(int(a), int(b)) for a, b in e.offsets]) for e in encoded]

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ids, by the pipeline's decoder; special ids by name unless skipped."""
        return self._tokenizer.decode(self._check_ids(ids), skip_special_tokens=skip_special)

    def save(self, path: str | os.PathLike) -> None:
        """Writes tokenizer.json (atomically) to path; `Tokenizer.load` reads it back."""
        _save_atomic(path, self._tokenizer.to_str(pretty=True).encode("utf-8"))

    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        """The `tokenizers` pipeline itself (a copy)."""
        return tokenizers.Tokenizer.from_str(self._tokenizer.to_str())


class WordPieceTokenizer(_TokenizersPipeline):
    """BERT's WordPiece vocabulary with google's basic tokenization, run by `tokenizers`.

    `vocab` lists the pieces by id (vocab.txt's lines); it must hold [PAD], [UNK], [CLS],
    [SEP] and [MASK]. `strip_accents=None` strips accents exactly when lower-casing, as
    google's BERT does.
    """

    kind = "wordpiece"
    own_file = WORDPIECE_VOCAB_FILE

    def __init__(
        self,
        vocab: Sequence[str],
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        clean_text: bool = True,
        max_input_chars_per_word: int = 100,
        source: str = "<memory>",
    ):
        self._vocab = list(vocab)
        self._source = source
        self.lowercase = bool(lowercase)
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.clean_text = bool(clean_text)
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        # As transformers reads vocab.txt: a piece listed twice keeps its last id.
        ids = {piece: i for i, piece in enumerate(self._vocab)}
        missing = [p for p in SPECIAL_PIECES if p not in ids]
        if missing:
            raise ValueError(
                f"{source} is not a BERT WordPiece vocabulary: it lacks {missing} (needs all of "
                f"{list(SPECIAL_PIECES)})"
            )
        self.vocab_size: int = len(self._vocab)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            ids[p] for p in SPECIAL_PIECES
        )
        self.special_ids: tuple[int, ...] = tuple(sorted(ids[p] for p in SPECIAL_PIECES))
        self.fingerprint: str = hashlib.sha256(
            json.dumps(self._settings(), ensure_ascii=False, separators=(",", ":")).encode()
        ).hexdigest()
        starts = np.array([not p.startswith(_CONTINUATION) for p in self._vocab], dtype=bool)
        starts[list(self.special_ids)] = True
        self.is_word_start: np.ndarray = starts  # [vocab_size] bool

        self._use_pipeline(self._build(ids))

    def _settings(self) -> dict[str, Any]:
        """Everything that decides the ids: the fingerprint hashes it."""
        return {
            "kind": self.kind,
            "vocab": self._vocab,
            "lowercase": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "clean_text": self.clean_text,
            "max_input_chars_per_word": self.max_input_chars_per_word,
        }

    def _build(self, ids: dict[str, int]) -> tokenizers.Tokenizer:
        # The pipeline of transformers' BertTokenizerFast.
        tokenizer = tokenizers.Tokenizer(
            tokenizers.models.WordPiece(
                ids,
                unk_token=UNK,
                max_input_chars_per_word=self.max_input_chars_per_word,
                continuing_subword_prefix=_CONTINUATION,
            )
        )
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=self.clean_text,
            handle_chinese_chars=self.tokenize_chinese_chars,
            strip_accents=self.strip_accents,
            lowercase=self.lowercase,
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix=_CONTINUATION)
        tokenizer.post_processor = bert_post_processor(self.cls_id, self.sep_id)
        tokenizer.add_special_tokens(special_added_tokens())
        return tokenizer

    @classmethod
    def from_vocab(
        cls,
        path: str | os.PathLike,
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
    ) -> WordPieceTokenizer:
        """Reads BERT's vocab.txt (one piece per line, the line number is the id).

        Whether the vocabulary is cased is not in the file: bert-base-uncased and its kin
        want lowercase=True (transformers' default too), the -cased models lowercase=False.
        """
        path = fs.path(path)
        with fs.errors(path, "read"):
            if not path.is_file():
                raise FileNotFoundError(f"WordPiece vocabulary {str(path)!r} does not exist")
        # Read as transformers reads it: universal newlines, only the newline stripped.
        with io.StringIO(fs.read_text(path), newline=None) as f:
            vocab = [line.rstrip("\n") for line in f.readlines()]
        return cls(
            vocab,
            lowercase=lowercase,
            strip_accents=strip_accents,
            tokenize_chinese_chars=tokenize_chinese_chars,
            source=f"WordPiece vocabulary {str(path)!r}",
        )

    @classmethod
    def from_json(cls, text: str, *, source: str = "tokenizer.json") -> WordPieceTokenizer:
        """Reads a BERT WordPiece tokenizer.json (as transformers writes for BERT models)."""
        try:
            spec = json.loads(text)
            model = spec["model"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{source} is not a tokenizer.json: {err}") from err

        def refuse(what: str):
            return ValueError(
                f"{source} is not a BERT WordPiece tokenizer.json: {what} (bertjax reads "
                "WordPiece with BertNormalizer and BertPreTokenizer, as BERT's tokenizers have)"
            )

        normalizer = spec.get("normalizer") or {}
        pre_tokenizer = spec.get("pre_tokenizer") or {}
        if model.get("type") != "WordPiece":
            raise refuse(f"its model is {model.get('type')!r}")
        if normalizer.get("type") != "BertNormalizer":
            raise refuse(f"its normalizer is {normalizer.get('type')!r}")
        if pre_tokenizer.get("type") != "BertPreTokenizer":
            raise refuse(f"its pre-tokenizer is {pre_tokenizer.get('type')!r}")
        if model.get("continuing_subword_prefix", _CONTINUATION) != _CONTINUATION:
            raise refuse(f"its subword prefix is {model['continuing_subword_prefix']!r}")
        if model.get("unk_token", UNK) != UNK:
            raise refuse(f"its unknown token is {model['unk_token']!r}")
        ids = model.get("vocab") or {}
        vocab = sorted(ids, key=ids.get)
        if [ids[p] for p in vocab] != list(range(len(vocab))):
            raise refuse("its vocabulary ids are not 0..n-1")
        extra = [
            t["content"] for t in spec.get("added_tokens", []) if ids.get(t["content"]) != t["id"]
        ]
        if extra:
            raise refuse(f"it adds tokens outside its vocabulary: {extra[:5]}")
        lowercase = normalizer.get("lowercase", True)
        return cls(
            vocab,
            lowercase=lowercase,
            strip_accents=normalizer.get("strip_accents"),
            tokenize_chinese_chars=normalizer.get("handle_chinese_chars", True),
            clean_text=normalizer.get("clean_text", True),
            max_input_chars_per_word=model.get("max_input_chars_per_word", 100),
            source=source,
        )

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece of an id."""
        return self._vocab[self._check_ids([token_id])[0]]

    def _save_own_file(self, directory: fs.AnyPath) -> None:
        _save_atomic(
            directory / WORDPIECE_VOCAB_FILE, "".join(p + "\n" for p in self._vocab).encode()
        )

    def _hf_config(self) -> dict[str, Any]:
        standard = self.clean_text and self.max_input_chars_per_word == 100
        return {
            # transformers' BertTokenizer rebuilds this pipeline from these flags, but knows no
            # clean_text or word length limit: otherwise the generic class reads the file as is.
            "tokenizer_class": "BertTokenizer" if standard else "PreTrainedTokenizerFast",
            "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            # Decode as bertjax does: the WordPiece decoder alone, no further clean-up.
            "clean_up_tokenization_spaces": False,
        }


class PipelineTokenizer(_TokenizersPipeline):
    """A transformers tokenizer.json taken as it is: ModernBERT's byte-level BPE and the other
    `tokenizers` pipelines whose special tokens have BERT's names ([PAD], [UNK], [CLS],
    [SEP], [MASK]) at any ids (ModernBERT's: 50283, 50280, 50281, 50282, 50284).

    The file's own pipeline tokenizes, so the ids are transformers': its normaliser,
    pre-tokenizer, model and added tokens. Its padding and truncation sections are dropped, as
    transformers overrides them on every call; they are call-time settings that would make a
    text's ids depend on the other texts of a call. Words given one by one
    (token labels) are each encoded after a space, as they read inside a text: what
    ``add_prefix_space=True`` asks of a byte-level pipeline for ModernBERT's word-level tasks
    (transformers 5's generic tokenizer class ignores that flag and splits a bare word into
    other pieces).
    """

    kind = "pipeline"
    own_file = HF_TOKENIZER_FILE

    def __init__(self, text: str, *, source: str = "tokenizer.json"):
        try:
            pipeline = tokenizers.Tokenizer.from_str(text)
            spec = json.loads(text)
        except Exception as err:  # tokenizers raises its own exception type
            raise ValueError(f"{source} is not a tokenizer.json: {err}") from err
        self._use_pipeline(pipeline)
        self._source = source
        ids = {piece: self._tokenizer.token_to_id(piece) for piece in SPECIAL_PIECES}
        missing = [piece for piece, i in ids.items() if i is None]
        if missing:
            raise ValueError(
                f"{source}: its vocabulary lacks {missing}; bertjax reads pipelines whose "
                f"special tokens are BERT's {list(SPECIAL_PIECES)}"
            )
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            ids[p] for p in SPECIAL_PIECES
        )
        self.vocab_size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_ids: tuple[int, ...] = tuple(sorted(ids.values()))
        # What decides the ids is the whole pipeline, in its canonical form (padding and
        # truncation are off by then: they are no part of a text's ids).
        self.fingerprint: str = hashlib.sha256(pipeline.to_str().encode("utf-8")).hexdigest()
        self._byte_level = '"ByteLevel"' in json.dumps(spec.get("pre_tokenizer"))
        pieces = [self._tokenizer.id_to_token(i) or "" for i in range(self.vocab_size)]
        model = spec.get("model") or {}
        if model.get("type") == "WordPiece":
            # WordPiece marks the pieces that continue a word instead.
            prefix = model.get("continuing_subword_prefix") or _CONTINUATION
            starts = np.array([not p.startswith(prefix) for p in pieces], dtype=bool)
        else:
            # A piece that follows a space starts a word (byte-level "Ġ", metaspace "▁").
            starts = np.array([p.startswith(("\u0120", WORD_BOUNDARY)) for p in pieces], dtype=bool)
        starts[list(self.special_ids)] = True
        self.is_word_start: np.ndarray = starts  # [vocab_size] bool

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        if self._byte_level:
            words = [" " + word for word in words]
        return self.encode_batch(words, special_tokens_in_text=True)

    def id_to_piece(self, token_id: int) -> str:
        return self._tokenizer.id_to_token(self._check_ids([token_id])[0])

    def _save_own_file(self, directory: fs.AnyPath) -> None:
        pass  # tokenizer.json is its file, written by save_hf

    def _hf_config(self) -> dict[str, Any]:
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            # Decode as bertjax does: the pipeline's decoder alone.
            "clean_up_tokenization_spaces": False,
        }


def tokenizer_from_json(text: str, *, source: str = "tokenizer.json") -> Tokenizer:
    """The tokenizer of a tokenizer.json: BERT's WordPiece pipeline as a WordPieceTokenizer,
    any other pipeline with BERT's special tokens (ModernBERT's byte-level BPE) as it is.

    A WordPiece file that adds tokens beyond its vocabulary (`add_tokens` in transformers,
    with the model's embeddings resized to them) is read as the pipeline it is too: its ids
    are transformers' ids, which a vocab.txt cannot state.
    """
    try:
        spec = json.loads(text)
        model = spec["model"]
        model_type = model.get("type")
        vocab = model.get("vocab") or {}
        added = [t["content"] for t in spec.get("added_tokens") or [] if t["content"] not in vocab]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{source} is not a tokenizer.json: {err}") from err
    if model_type == "WordPiece" and not added:
        return WordPieceTokenizer.from_json(text, source=source)
    return PipelineTokenizer(text, source=source)


def check_vocab(config: Any, tokenizer: Tokenizer, what: str) -> None:
    """Fails unless every id of the tokenizer has a row in the vocabulary of `config` (any
    family's encoder config: its vocab_size).

    A model may have more rows than the tokenizer has pieces (vocabularies padded to a
    multiple of 8), never fewer.
    """
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"{what}: the tokenizer has {tokenizer.vocab_size} pieces but the model's "
            f"vocabulary has {config.vocab_size} rows; they do not belong together"
        )
