"""Tokenizers: special ids, byte fallback, CJK, word starts, fingerprints, loading checks;
WordPiece against transformers' BertTokenizerFast; exports read by AutoTokenizer."""

import dataclasses
import io
import json
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
import tokenizers

from bertjax.data.instances import tokenize_documents
from bertjax.text.special_tokens import (
    CLS_ID,
    MASK,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    SPECIAL_PIECES,
    UNK,
    UNK_ID,
    WORD_BOUNDARY,
)
from bertjax.text.tokenizer import SentencePieceTokenizer, Tokenizer, WordPieceTokenizer
from bertjax.text.training import TokenizerSettings, reservoir_sample, train_tokenizer
from tests.helpers.tokenizer import (
    CHINESE,
    JAPANESE,
    sentences,  # noqa: F401 (fixtures)
    wordpiece_dir,  # noqa: F401 (fixtures)
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, sentences):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    return train_tokenizer(sentences, TokenizerSettings(vocab_size=800), path), path


def test_special_ids_are_fixed_control_symbols(tokenizer):
    tok, _ = tokenizer
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert [tok.id_to_piece(i) for i in range(5)] == list(SPECIAL_PIECES)
    assert tok.special_ids == (PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID)
    assert tok.vocab_size == 800


def test_special_tokens_typed_in_text_are_ordinary_text(tokenizer):
    tok, _ = tokenizer
    text = "Use [MASK] and [CLS] or [SEP], never [PAD] nor [UNK]."
    ids = tok.encode(text)
    assert not set(ids) & set(tok.special_ids)
    assert tok.decode(ids) == text


ROUND_TRIP = (
    CHINESE + JAPANESE + ["鬱蒼とした森。龘靐齉。", "emoji 🙂 and ñ, ü, ß.", "全角：ＡＢＣ！"]
)


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_without_unk(tokenizer, text):
    tok, _ = tokenizer
    ids = tok.encode(text)
    assert UNK_ID not in ids  # byte fallback: unseen characters become their UTF-8 bytes
    # The default normalization is NFKC: full-width "，" comes back as ",".
    assert tok.decode(ids) == unicodedata.normalize("NFKC", text)


def test_identity_normalization_round_trips_exactly(sentences, tmp_path):
    tok = train_tokenizer(
        sentences,
        TokenizerSettings(vocab_size=600, normalization="identity"),
        tmp_path / "identity.model",
    )
    for text in ROUND_TRIP:
        ids = tok.encode(text)
        assert UNK_ID not in ids and tok.decode(ids) == text


def test_english_round_trip_and_batch_matches_single(tokenizer, sentences):
    tok, _ = tokenizer
    batch = sentences[:200]
    encoded = tok.encode_batch(batch)
    assert encoded == [tok.encode(s) for s in batch]
    assert [tok.decode(ids) for ids in encoded] == batch
    assert tok.encode_batch([]) == []


def test_decode_shows_or_skips_special_tokens(tokenizer):
    tok, _ = tokenizer
    ids = [CLS_ID] + tok.encode("Hello world.") + [SEP_ID] + tok.encode("Bye.") + [SEP_ID, PAD_ID]
    assert tok.decode(ids) == "[CLS] Hello world. [SEP] Bye. [SEP] [PAD]"
    assert tok.decode(ids, skip_special=True) == "Hello world. Bye."
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_is_word_start(tokenizer):
    tok, _ = tokenizer
    starts = tok.is_word_start
    assert starts.shape == (tok.vocab_size,) and starts.dtype == bool
    assert starts[list(tok.special_ids)].all()
    pieces = [tok.id_to_piece(i) for i in range(tok.vocab_size)]
    for i, piece in enumerate(pieces):
        if piece.startswith(WORD_BOUNDARY):
            assert starts[i], piece
    continuation = [i for i, p in enumerate(pieces) if p.isascii() and p.isalpha() and i > 260]
    assert continuation and not starts[continuation].any()  # "ing", "tion": inside a word
    byte_id = {p: i for i, p in enumerate(pieces) if p.startswith("<0x")}
    assert starts[byte_id["<0xE6>"]] and starts[byte_id["<0xF0>"]]  # lead bytes of CJK chars
    assert not starts[byte_id["<0x80>"]] and not starts[byte_id["<0x41>"]]
    # Every CJK character is a word of its own, with or without a preceding "▁".
    ids = tok.encode("我喜欢机器学习")
    assert starts[ids].all()
    # In English, words start exactly where "▁" pieces start.
    ids = tok.encode("internationalization is surprisingly complicated")
    assert starts[ids].sum() == 4


def test_fingerprint_stable_across_save_load_and_mismatch_error(tokenizer, tmp_path):
    tok, path = tokenizer
    assert len(tok.fingerprint) == 64
    loaded = Tokenizer.load(path, expected_fingerprint=tok.fingerprint)
    assert loaded.fingerprint == tok.fingerprint
    copy = tmp_path / "copy.model"
    loaded.save(copy)
    assert Tokenizer.load(copy).fingerprint == tok.fingerprint
    wrong = "0" * 64
    with pytest.raises(ValueError) as err:
        Tokenizer.load(path, expected_fingerprint=wrong)
    assert tok.fingerprint in str(err.value) and wrong in str(err.value)


def test_training_is_deterministic(sentences, tmp_path):
    settings = TokenizerSettings(vocab_size=600, sample_sentences=1000)
    first = train_tokenizer(sentences, settings, tmp_path / "a.model")
    second = train_tokenizer(sentences, settings, tmp_path / "b.model")
    assert first.fingerprint == second.fingerprint
    reseeded = dataclasses.replace(settings, seed=1)
    other = train_tokenizer(sentences, reseeded, tmp_path / "c.model")
    assert other.fingerprint != first.fingerprint  # another sample of the input


def test_bpe_and_lowercase_options(sentences, tmp_path):
    bpe = train_tokenizer(
        sentences, TokenizerSettings(vocab_size=500, model_type="bpe"), tmp_path / "bpe.model"
    )
    for text in ["The assert statement.", JAPANESE[0], "龘 🙂"]:
        ids = bpe.encode(text)
        assert UNK_ID not in ids and bpe.decode(ids) == text
    lower = train_tokenizer(
        sentences, TokenizerSettings(vocab_size=500, lowercase=True), tmp_path / "lower.model"
    )
    assert lower.encode("The ASSERT Statement") == lower.encode("the assert statement")
    assert lower.decode(lower.encode("The ASSERT Statement")) == "the assert statement"


def test_load_rejects_files_that_are_not_bert_sentencepiece_models(tmp_path, sentences):
    with pytest.raises(FileNotFoundError, match="missing.model"):
        Tokenizer.load(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"this is not a protobuf")
    with pytest.raises(ValueError, match="junk.model"):
        Tokenizer.load(junk)
    # A plain sentencepiece model: <unk>, <s>, </s> at 0..2 and no [CLS]/[SEP]/[MASK].
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences[:1000]),
        model_writer=writer,
        vocab_size=300,
        num_threads=2,
        minloglevel=2,
    )
    plain = tmp_path / "plain.model"
    plain.write_bytes(writer.getvalue())
    with pytest.raises(ValueError, match="special tokens"):
        Tokenizer.load(plain)


def test_settings_and_training_errors(tmp_path):
    with pytest.raises(ValueError, match="model_type"):
        TokenizerSettings(model_type="wordpiece")
    with pytest.raises(ValueError, match="vocab_size"):
        TokenizerSettings(vocab_size=100)
    with pytest.raises(ValueError, match="normalization"):
        TokenizerSettings(normalization="nfd")
    with pytest.raises(ValueError, match="lowercase"):
        TokenizerSettings(lowercase=True, normalization="identity")
    with pytest.raises(ValueError, match="no non-empty sentences"):
        train_tokenizer(["", "  "], TokenizerSettings(vocab_size=300), tmp_path / "x.model")
    with pytest.raises(ValueError, match="vocab_size=5000"):
        train_tokenizer(["tiny."] * 10, TokenizerSettings(vocab_size=5000), tmp_path / "y.model")


def test_reservoir_sample_is_uniform_and_in_stream_order():
    counts = np.zeros(50)
    for seed in range(1000):
        sample = reservoir_sample((str(i) for i in range(50)), 10, np.random.default_rng(seed))
        assert len(sample) == 10 and sample == sorted(sample, key=int)
        counts[[int(s) for s in sample]] += 1
    assert abs(counts.mean() - 200) < 1e-9 and counts.min() > 150 and counts.max() < 250
    assert reservoir_sample(iter(["a", "b"]), 5, np.random.default_rng(0)) == ["a", "b"]


def test_tokenize_documents_matches_encode(tokenizer):
    tok, _ = tokenizer
    documents = [["Hello there.", "Second."], [], CHINESE[:2]]
    result = tokenize_documents(documents, tok)
    assert [len(d) for d in result] == [2, 0, 2]
    assert all(s.dtype == np.int32 for d in result for s in d)
    assert result[2][1].tolist() == tok.encode(CHINESE[1])


# ---------------------------------------------------------------------------------------------
# WordPiece (BERT's vocab.txt) and exports that transformers reads.


def test_wordpiece_basic_tokenization():
    vocab = [*SPECIAL_PIECES, "hello", "world", "cafe", "café", "Hello", "##s", ",", "!"]
    vocab += ["我", "喜", "欢", "a", "b"]
    uncased = WordPieceTokenizer(vocab, lowercase=True)
    cased = WordPieceTokenizer(vocab, lowercase=False)

    def pieces(tok, text):
        return [tok.id_to_piece(i) for i in tok.encode(text)]

    # Uncased lower-cases and strips accents; both split punctuation and CJK characters.
    assert pieces(uncased, "HELLO,Worlds! Café") == ["hello", ",", "world", "##s", "!", "cafe"]
    assert pieces(cased, "Hello,worlds! café") == ["Hello", ",", "world", "##s", "!", "café"]
    assert pieces(cased, "HELLO") == [UNK]
    assert pieces(uncased, "a我喜欢b") == ["a", "我", "喜", "欢", "b"]
    # Control characters are dropped, any whitespace separates words.
    assert pieces(uncased, "hello\x00\x7f\tworld\u3000a") == ["hello", "world", "a"]
    starts = uncased.is_word_start
    assert starts[vocab.index("hello")] and not starts[vocab.index("##s")]
    assert starts[list(uncased.special_ids)].all()
    assert uncased.decode(uncased.encode("hellos, world")) == "hellos, world"
    assert uncased.fingerprint != cased.fingerprint


def test_wordpiece_files_and_fingerprints(wordpiece_dir, tmp_path):
    directory, lowercase = wordpiece_dir
    tok = WordPieceTokenizer.from_vocab(directory / "vocab.txt", lowercase=lowercase)
    lines = (directory / "vocab.txt").read_text().splitlines()
    assert tok.kind == "wordpiece" and tok.vocab_size == len(lines)
    assert [tok.id_to_piece(i) for i in range(tok.vocab_size)] == lines
    # tokenizer.json written by save or save_hf reads back as the same tokenizer.
    tok.save(tmp_path / "tok.json")
    again = Tokenizer.load(tmp_path / "tok.json", expected_fingerprint=tok.fingerprint)
    assert isinstance(again, WordPieceTokenizer)
    tok.save_hf(tmp_path / "hf")
    exported = Tokenizer.load(tmp_path / "hf" / "tokenizer.json")
    assert exported.fingerprint == tok.fingerprint
    assert (tmp_path / "hf" / "vocab.txt").read_text() == (directory / "vocab.txt").read_text()
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] == lowercase and config["mask_token"] == MASK
    assert config["tokenizer_class"] == "BertTokenizer"
    # Casing is part of the fingerprint; a vocab.txt alone does not say it.
    other = WordPieceTokenizer.from_vocab(directory / "vocab.txt", lowercase=not lowercase)
    assert other.fingerprint != tok.fingerprint
    with pytest.raises(ValueError, match="WordPieceTokenizer.from_vocab"):
        Tokenizer.load(directory / "vocab.txt")
    with pytest.raises(ValueError, match="wordpiece tokenizer, not a SentencePieceTokenizer"):
        SentencePieceTokenizer.load(tmp_path / "tok.json")


def test_wordpiece_refuses_what_it_cannot_read(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"lacks \['\[MASK\]'\]"):
        WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        WordPieceTokenizer.from_vocab(tmp_path / "missing.txt")
    # A sentencepiece export's tokenizer.json is not WordPiece: it reads as the pipeline it is
    # (bertjax.text.directory.load_tokenizer prefers the .model beside it), with the same ids.
    spm_tok, _ = tokenizer
    spm_tok.save_hf(tmp_path / "spm")
    pipeline = Tokenizer.load(tmp_path / "spm" / "tokenizer.json")
    assert pipeline.kind == "pipeline" and pipeline.vocab_size == spm_tok.vocab_size
    text = "Paris is the capital of France."
    assert pipeline.encode(text) == spm_tok.encode(text)
    with pytest.raises(ValueError, match="its model is 'Unigram'"):
        WordPieceTokenizer.from_json((tmp_path / "spm" / "tokenizer.json").read_text())
    # A pipeline without BERT's special tokens is named as such.
    bare = tokenizers.Tokenizer(tokenizers.models.BPE())
    (tmp_path / "bare.json").write_text(bare.to_str())
    with pytest.raises(ValueError, match=r"lacks \['\[PAD\]', '\[UNK\]'"):
        Tokenizer.load(tmp_path / "bare.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a tokenizer.json"):
        Tokenizer.load(tmp_path / "junk.json")


def test_special_tokens_in_text_for_sentencepiece(tokenizer):
    tok, _ = tokenizer
    ids = tok.encode("Paris is the [MASK] of France.", special_tokens_in_text=True)
    assert ids.count(MASK_ID) == 1
    before, after = ids[: ids.index(MASK_ID)], ids[ids.index(MASK_ID) + 1 :]
    # The text around a special token is encoded on its own, as transformers does.
    assert before == tok.encode("Paris is the") and after == tok.encode(" of France.")
    assert tok.encode_batch(["[CLS][SEP]x", "plain"], special_tokens_in_text=True) == [
        [CLS_ID, SEP_ID, *tok.encode("x")],
        tok.encode("plain"),
    ]
