"""BERT's special tokens, as every tokenizer kind has them: their pieces, the fixed ids of
bertjax's sentencepiece models, transformers' names for them, and how a `tokenizers` pipeline
adds them around a text (tokenizer.json)."""

from __future__ import annotations

import tokenizers
from tokenizers import processors

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_PIECES = (PAD, UNK, CLS, SEP, MASK)
# transformers' names for the special tokens (tokenizer_config.json, special_tokens_map.json).
HF_SPECIAL_TOKENS = {
    "unk_token": UNK,
    "sep_token": SEP,
    "pad_token": PAD,
    "cls_token": CLS,
    "mask_token": MASK,
}
# The word-boundary marker sentencepiece puts in front of pieces that follow a space (a
# metaspace pipeline's too): such a piece starts a word.
WORD_BOUNDARY = "\u2581"


def bert_post_processor(cls_id: int, sep_id: int) -> processors.TemplateProcessing:
    """[CLS] A [SEP], and [CLS] A [SEP] B [SEP] with B's segment id 1, as BERT's inputs."""
    return processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )


def special_added_tokens() -> list[tokenizers.AddedToken]:
    # Matched in the raw text, before normalization, as BERT's tokenizers match them.
    return [
        tokenizers.AddedToken(piece, special=True, normalized=False, lstrip=False, rstrip=False)
        for piece in SPECIAL_PIECES
    ]
