"""Small tokenizers of every kind bertjax reads, and their files as the hub ships them.

Three kinds: sentencepiece (trained here), BERT's WordPiece (vocab.txt or tokenizer.json) and
another `tokenizers` pipeline (a byte-level BPE as ModernBERT's). `with_call_settings` adds
the padding and truncation sections that a tokenizer saved after a padded call carries (the
hub's files often do), which must never shape bertjax's encodings. Shared by the test tiers;
none of it needs torch or transformers.
"""

import json
import pathlib

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from tokenizers.implementations import BertWordPieceTokenizer

from bertjax.text.special_tokens import SPECIAL_PIECES
from bertjax.text.tokenizer import PipelineTokenizer, WordPieceTokenizer
from bertjax.text.training import TokenizerSettings, train_tokenizer

KINDS = ("sentencepiece", "wordpiece", "pipeline")
# The truncation length written into the files: texts past it show whether it is obeyed.
FILE_TRUNCATION = 24
WORDS = (
    "see the report for details about the river bank and its long history of trade "
    "many ships came from far away ports carrying grain wine salt and cloth "
    "the city grew around the harbour while merchants built houses on the hills"
).split()


def sentences(count: int = 200, seed: int = 0) -> list[str]:
    """Sentences of 3 to 30 of WORDS: what the tokenizers are trained on."""
    rng = np.random.default_rng(seed)
    return [
        " ".join(rng.choice(WORDS, size=int(rng.integers(3, 31)))).capitalize() + "."
        for _ in range(count)
    ]


def text_of(length: int, seed: int) -> str:
    """A text of about `length` words (each one to a few tokens) drawn from WORDS."""
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=max(int(length), 1))).capitalize() + "."


def with_call_settings(text: str, pad_id: int, *, fixed: int | None = None) -> str:
    """tokenizer.json text with a padding section (to the batch's longest, or `fixed` ids)
    and a truncation section of FILE_TRUNCATION tokens, as `enable_padding` and
    `enable_truncation` leave them in a saved file."""
    pipeline = tokenizers.Tokenizer.from_str(text)
    pipeline.enable_padding(pad_id=pad_id, pad_token="[PAD]", length=fixed)
    pipeline.enable_truncation(FILE_TRUNCATION)
    padded = pipeline.to_str(pretty=True)
    spec = json.loads(padded)
    assert spec["padding"] and spec["truncation"]["max_length"] == FILE_TRUNCATION
    assert spec["padding"]["strategy"] == ("BatchLongest" if fixed is None else {"Fixed": fixed})
    return padded


def pipeline_json(vocab_size: int = 400, texts=None) -> str:
    """A byte-level BPE tokenizer.json learned from `texts` (`sentences()` by default) with
    BERT's special tokens after its pieces, as ModernBERT's file has them ([MASK] strips the
    space before it)."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences() if texts is None else texts, trainer)
    tokenizer.add_special_tokens(
        [
            tokenizers.AddedToken(piece, special=True, lstrip=piece == "[MASK]")
            for piece in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")
        ]
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tokenizer.to_str()


def wordpiece_vocab(lowercase: bool = True) -> list[str]:
    """BERT's layout: [PAD], unused slots, the other specials, then learned pieces."""
    trainer = BertWordPieceTokenizer(lowercase=lowercase)
    trainer.train_from_iterator(sentences(), vocab_size=300, special_tokens=[], show_progress=False)
    learned = sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])
    unused = [f"[unused{i}]" for i in range(3)]
    return ["[PAD]", *unused, "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(p for p, _ in learned)]


def sentencepiece(path: pathlib.Path):
    """A small unigram sentencepiece model trained on `sentences()`, saved at path."""
    return train_tokenizer(sentences(), TokenizerSettings(vocab_size=300, num_threads=1), path)


def write_tokenizer(kind: str, directory: pathlib.Path, *, padded: bool = True):
    """Writes a tokenizer of `kind` into directory as the hub ships it (tokenizer.json with
    padding and truncation sections when `padded`) and returns the tokenizer bertjax reads
    from its file."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "sentencepiece":
        return sentencepiece(directory / "tokenizer.model")
    if kind == "wordpiece":
        text = WordPieceTokenizer(wordpiece_vocab()).hf_tokenizer().to_str()
    else:
        text = pipeline_json()
    pad_id = tokenizers.Tokenizer.from_str(text).token_to_id("[PAD]")
    if padded:
        text = with_call_settings(text, pad_id)
    (directory / "tokenizer.json").write_text(text)
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    config.update({f"{p.strip('[]').lower()}_token": p for p in SPECIAL_PIECES})
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if kind == "wordpiece":
        return WordPieceTokenizer.from_json(text)
    return PipelineTokenizer(text)
