"""Sentences in several scripts (the interpreter's docs, Chinese, Japanese), a BERT-layout
vocab.txt learned from them, and tokenizer directories as transformers writes them."""

import json
import pydoc_data.topics

import pytest
from tokenizers.implementations import BertWordPieceTokenizer

from bertjax.data.sentences import split_sentences
from bertjax.text.training import MODEL_TYPES, TokenizerSettings, train_tokenizer

CHINESE = [
    "我喜欢机器学习。",
    "北京是中国的首都。",
    "今天天气很好，我们去公园散步吧。",
    "他在大学学习计算机科学。",
]


JAPANESE = [
    "東京は日本の首都です。",
    "私は毎朝コーヒーを飲みます。",
    "ひらがなとカタカナと漢字を使います。",
]


def training_sentences(count=2000):
    """English prose from the interpreter's docs plus some Chinese and Japanese."""
    english = []
    for name in sorted(pydoc_data.topics.topics):
        english.extend(split_sentences(pydoc_data.topics.topics[name]))
        if len(english) >= count:
            break
    return english[:count] + (CHINESE + JAPANESE) * 30


@pytest.fixture(scope="module")
def sentences():
    return training_sentences()


# Text that trips tokenizers up: accents and combining marks, CJK, emoji (with skin tones and
# joiners), URLs, very long words, control and zero-width characters, odd whitespace, and
# text that looks like special or byte pieces.
VARIED = [
    "Café, naïve façade; résumé — déjà vu. Ångström, Øresund, Straße, İstanbul.",
    "e\u0301 composed differently from é; ﬁ ligature; ① ② ③; ＦＵＬＬＷＩＤＴＨ ｶﾀｶﾅ",
    "我喜欢机器学习。北京是中国的首都，今天天气很好！",
    "東京は日本の首都です。ひらがなとカタカナ。鬱蒼とした森。龘靐齉",
    "안녕하세요 세계, Привет мир, γειά σου κόσμε, مرحبا بالعالم, שלום עולם",
    "emoji 🙂👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷 and keycap 1\ufe0f\u20e3 end",
    "See https://example.com/path/to/page?query=1&x=%20y#frag or mailto:someone@example.org.",
    "Supercalifragilisticexpialidocious" * 4 + " and " + "a" * 150,
    "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "control\x00chars\x01here\x7f and\u200bzero\u200cwidth\u200d joiners\ufeff bom",
    "tabs\tand\nnewlines\r\nand   multiple    spaces \u3000ideographic\u00a0nbsp ",
    "   leading and trailing whitespace   ",
    "Typed specials [MASK], [CLS] and [SEP]; bytes <0x41> and <0xE6>; pieces \u2581 ▁▁x",
    "Numbers 3.14159, 1,000,000, 42nd, 1e-10, $5.00, 50% and 12:30pm.",
    "code: def f(x): return x ** 2  # comment <tag attr='v'>&amp;</tag> {a: [1, 2]}",
    "\U0001f600\U0010ffff\U000e0001 private use \ue000 and unassigned \u0378",
    "x",
    "!",
]


HF_CONFIG = {"model_type": "bert"}


def write_wordpiece_vocab(path, sentences, lowercase, size=700):
    """A BERT-layout vocab.txt learned from sentences: [PAD], [unused*], [UNK] [CLS] [SEP]
    [MASK], then the pieces, so the special ids are not bertjax's 0..4."""
    trainer = BertWordPieceTokenizer(lowercase=lowercase)
    trainer.train_from_iterator(sentences, vocab_size=size, special_tokens=[], show_progress=False)
    learned = sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])
    unused = [f"[unused{i}]" for i in range(9)]
    vocab = ["[PAD]", *unused, "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(p for p, _ in learned)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(piece + "\n" for piece in vocab), encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def wordpiece_dir(request, tmp_path_factory, sentences):
    """A transformers-style directory with only vocab.txt and tokenizer_config.json."""
    directory = tmp_path_factory.mktemp("wordpiece")
    write_wordpiece_vocab(directory / "vocab.txt", sentences + VARIED, lowercase=request.param)
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": request.param}))
    return directory, request.param


@pytest.fixture(scope="module", params=MODEL_TYPES)
def exported(request, tmp_path_factory, sentences):
    """A sentencepiece tokenizer of each model type and its transformers directory."""
    root = tmp_path_factory.mktemp(f"export_{request.param}")
    settings = TokenizerSettings(vocab_size=700, model_type=request.param)
    tok = train_tokenizer(sentences + VARIED, settings, root / "tokenizer.model")
    tok.save_hf(root / "hf", model_max_length=128)
    (root / "hf" / "config.json").write_text(json.dumps(HF_CONFIG))
    return tok, root / "hf"
