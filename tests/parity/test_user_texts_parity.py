"""A special token's literal typed in a text ("[MASK]", "[SEP]", an added token) reads as
transformers' tokenizers read it, for every notebook method: the methods that read whole
texts (encode, predict, fill_mask, embed, search, generate), the words of a token-labels
model (transformers' `is_split_into_words`) and a question with its context (`answer`); and a
token classifier's word scores on such texts are transformers'.

For every tokenizer kind that transformers reads (WordPiece and a byte-level pipeline as
tokenizer.json, a WordPiece file with added tokens, sentencepiece as bertjax exports it);
hypothesis draws the texts (tests/helpers/user_texts.py).
"""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax import Model
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.qa import squad
from bertjax.text import features as features_lib
from bertjax.text.directory import load_tokenizer
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.tokenizer_kinds import wordpiece_vocab, write_tokenizer
from tests.helpers.torch_params import randomize_torch
from tests.helpers.user_texts import SPECIAL_LITERALS, user_texts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ADDED = ("<ship>", "<port>")  # tokens a tokenizer.json adds beyond its WordPiece vocabulary
LITERALS = SPECIAL_LITERALS + ADDED
LIMIT = 512  # no text drawn here comes near it: nothing is cut
QA_SETTINGS = squad.QASettings(max_seq_length=LIMIT, doc_stride=128, max_query_length=64)
WORD_LABELS = ("O", "B-X", "I-X")
SCORE_ATOL = 1e-5


def _added_tokens_directory(directory):
    """A WordPiece tokenizer.json that adds ADDED, written by transformers (add_tokens)."""
    directory.mkdir(parents=True)
    WordPieceTokenizer(wordpiece_vocab()).save_hf(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    assert tokenizer.add_tokens(list(ADDED)) == len(ADDED)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """kind -> (bertjax's tokenizer, transformers' tokenizer) of one directory."""
    root = tmp_path_factory.mktemp("kinds")
    for kind in ("wordpiece", "pipeline"):
        write_tokenizer(kind, root / kind, padded=False)
    write_tokenizer("sentencepiece", root / "sentencepiece-model").save_hf(root / "sentencepiece")
    _added_tokens_directory(root / "added")
    return {
        directory.name: (
            load_tokenizer(directory),
            transformers.AutoTokenizer.from_pretrained(directory),
        )
        for directory in sorted(root.iterdir())
        if directory.name != "sentencepiece-model"
    }


def _word_positions(encoding, words) -> list[int]:
    """transformers' position of each word's first token (-1: none)."""
    word_ids = encoding.word_ids()
    return [word_ids.index(k) if k in word_ids else -1 for k in range(len(words))]


@settings(max_examples=40)
@given(text=user_texts(LITERALS), question=user_texts(LITERALS, max_words=5))
def test_a_literal_in_a_text_reads_as_transformers_reads_it(tokenizers, text, question):
    for kind, (ours, theirs) in tokenizers.items():
        # Whole texts: what encode, predict, fill_mask, embed, search and generate read.
        (example,) = features_lib.inputs(ours, [text], None, LIMIT, limit=LIMIT)
        assert example.ids == theirs(text).input_ids, (kind, text)
        # Words, as a token-labels model reads them.
        words = text.split()
        inputs = label_heads.encode_words(ours, [words], LIMIT)
        expected = theirs(words, is_split_into_words=True)
        length = int(inputs.input_mask[0].sum())
        if kind != "pipeline":
            # transformers 5's generic class splits a bare byte-level word without the space
            # a word inside a text has; bertjax reads each word after one (`encode_words`).
            assert inputs.input_ids[0, :length].tolist() == expected.input_ids, (kind, words)
            assert inputs.word_positions[0].tolist() == _word_positions(expected, words), kind
        # A question with its context, as `answer` reads them.
        example = squad.QAExample("0", question, text, ())
        ((window,),) = squad.windows([example], ours, QA_SETTINGS, QA_SETTINGS.doc_stride)
        assert window.ids == theirs(question, text).input_ids, (kind, question, text)


@pytest.fixture(scope="module")
def token_classifier(tmp_path_factory):
    """(our Model, transformers' model and tokenizer) of one BertForTokenClassification
    directory with random weights and a WordPiece vocab.txt."""
    directory = tmp_path_factory.mktemp("token-classifier")
    vocab = wordpiece_vocab()
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        id2label=dict(enumerate(WORD_LABELS)),
        label2id={label: k for k, label in enumerate(WORD_LABELS)},
    )
    theirs = randomize_torch(transformers.BertForTokenClassification(config), seed=0)
    theirs.save_pretrained(directory)
    (directory / "vocab.txt").write_text("".join(p + "\n" for p in vocab))
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    return Model.load(directory), theirs, tokenizer


@settings(max_examples=10)
@given(texts=st.lists(user_texts(max_words=8), min_size=1, max_size=3))
def test_a_token_classifier_scores_words_holding_literals_as_transformers(token_classifier, texts):
    model, theirs, tokenizer = token_classifier
    for text, predicted in zip(texts, model.predict(texts)):
        words = text.split()
        inputs = tokenizer(words, is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            probs = torch.softmax(theirs(**inputs).logits[0], -1).numpy()
        first = _word_positions(inputs, words)
        assert [p["label"] for p in predicted] == [WORD_LABELS[probs[i].argmax()] for i in first]
        np.testing.assert_allclose(
            [p["score"] for p in predicted], [probs[i].max() for i in first], atol=SCORE_ATOL
        )
