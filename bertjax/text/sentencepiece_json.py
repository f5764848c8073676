"""A sentencepiece model as a `tokenizers` pipeline: what tokenizer.json holds for a
SentencePieceTokenizer, so that transformers' tokenizers give bertjax's ids.

The pipeline restates the model in `tokenizers` terms: the normalization table,
sentencepiece's whitespace rules, the unigram scores or the BPE merges, and byte fallback.
One difference remains: where two unigram segmentations of a text score the same up to
float32 rounding (in practice runs of one repeated character, "*******"), sentencepiece
(float32 sums) and `tokenizers` (float64 sums) may choose different ones of equal score.
Both decode to the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tokenizers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import decoders, normalizers

from bertjax.text.special_tokens import (
    CLS_ID,
    SEP_ID,
    UNK,
    UNK_ID,
    WORD_BOUNDARY,
    bert_post_processor,
    special_added_tokens,
)


def pipeline(model_proto: bytes, source: str) -> tokenizers.Tokenizer:
    """The serialized sentencepiece model `model_proto` (named `source` in errors) as a
    `tokenizers` pipeline: BERT's [CLS] ... [SEP] around a text, the special tokens written
    in a text split off."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_proto)
    _check_exportable(proto, source)
    pieces = proto.pieces
    kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
    normal = [p.type == kinds.NORMAL for p in pieces]
    if proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
        lowest = min(p.score for p, is_normal in zip(pieces, normal) if is_normal)
        # Sentencepiece never matches control or byte pieces in text, but `tokenizers`
        # matches every vocabulary entry: they get a score below any segmentation of the
        # same (at most 6) characters into normal pieces, so typed "<0x41>" stays
        # characters. (When one of those characters is outside the vocabulary, its
        # unknown-character penalty is lower still and the byte piece would win.)
        vocab = [
            (p.piece, p.score if is_normal else 8 * lowest) for p, is_normal in zip(pieces, normal)
        ]
        model = tokenizers.models.Unigram(vocab, unk_id=UNK_ID, byte_fallback=True)
    else:
        model = tokenizers.models.BPE(
            {p.piece: i for i, p in enumerate(pieces)},
            _bpe_merges(pieces, normal),
            unk_token=UNK,
            byte_fallback=True,
            fuse_unk=False,
        )
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer = _sentencepiece_normalizer(proto.normalizer_spec)
    # No pre-tokenizer: the model segments the whole normalized text, as sentencepiece.
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(WORD_BOUNDARY, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),  # the space of the dummy prefix
        ]
    )
    tokenizer.post_processor = bert_post_processor(CLS_ID, SEP_ID)
    tokenizer.add_special_tokens(special_added_tokens())
    return tokenizer


def _check_exportable(proto: Any, source: str) -> None:
    """Refuses sentencepiece options the tokenizer.json translation does not cover."""
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
    problems = []
    if trainer.model_type not in (
        sentencepiece_model_pb2.TrainerSpec.UNIGRAM,
        sentencepiece_model_pb2.TrainerSpec.BPE,
    ):
        problems.append("a model type other than unigram or bpe")
    if not trainer.byte_fallback:
        problems.append("no byte fallback")
    if trainer.treat_whitespace_as_suffix:
        problems.append("treat_whitespace_as_suffix")
    if not spec.escape_whitespaces:
        problems.append("escape_whitespaces=false")
    if any(p.type in (kinds.USER_DEFINED, kinds.UNUSED) for p in proto.pieces):
        problems.append("user-defined or unused pieces")
    if problems:
        raise ValueError(
            f"{source} cannot be written as tokenizer.json: it has "
            f"{', '.join(problems)}; bertjax.text.training.train_tokenizer models have none"
        )


def _sentencepiece_normalizer(spec: Any) -> normalizers.Normalizer:
    """Sentencepiece's normalizer: its table, then its whitespace rules on the result.

    Sentencepiece's whitespace is the ASCII space after the table is applied: runs collapse
    to one, ends are trimmed, a space is put in front of non-empty text, and spaces become
    "▁". `\\A` and `\\z` anchor at the ends of the text (`^`/`$` would match at newlines).
    """
    steps = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        steps.append(normalizers.Replace(tokenizers.Regex(" {2,}"), " "))
        steps.append(normalizers.Replace(tokenizers.Regex(r"\A | \z"), ""))
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    steps.append(normalizers.Replace(" ", WORD_BOUNDARY))
    return normalizers.Sequence(steps)


def _bpe_merges(pieces: Sequence[Any], normal: Sequence[bool]) -> list[tuple[str, str]]:
    """BPE merges that reproduce sentencepiece's: every split of a piece into two pieces.

    Sentencepiece merges the adjacent pair whose concatenation is the highest-scoring
    piece, leftmost first; `tokenizers` merges the lowest-ranked pair, leftmost first. So
    each normal piece contributes all its two-piece splits, ranked by the piece's score.
    Only normal pieces take part: control and byte pieces are never merged into or from.
    """
    index = {p.piece: i for i, p in enumerate(pieces) if normal[i]}
    ranked = sorted(
        (i for i, is_normal in enumerate(normal) if is_normal and len(pieces[i].piece) > 1),
        key=lambda i: (-pieces[i].score, i),
    )
    merges = []
    for i in ranked:
        piece = pieces[i].piece
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                merges.append((left, right))
    return merges
