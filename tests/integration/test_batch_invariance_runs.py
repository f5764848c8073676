"""Every notebook method gives a text the same result alone as inside a list of texts of very
different lengths: for each encoder family (BERT, ModernBERT) and tokenizer kind
(sentencepiece, WordPiece, a byte-level pipeline; the tokenizer.json files carry padding and
truncation sections), with batch_size 1 and the default, on one device and on a mesh of the
8 simulated devices. And each method gives the same results with its batches unpadded (the
encoder's packed_length, the default) as padded (`unpad=False`), full, nearly empty and
one-token rows in one batch.

Tiny random models (one or two layers, hidden 32) with large initial weights, so that outputs
move with their inputs; `hypothesis` draws the mix of lengths (one word, past ModernBERT's
local window, past the files' truncation length, past the models' positions) and texts as
users type them, some holding a special token's literal ("[MASK]", "[SEP]", ...). A method
whose result the tokenizer shapes beyond the ids it reads (tokens decoded, words, character
spans) runs with every kind; the others with one, each kind's reading being checked alone
beside the other texts in tests/unit/test_batch_invariance.py.
"""

import functools
import math
import warnings

import flax.linen as nn
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertjax import Model, capability, encoders, inference
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.inference import batching
from bertjax.nn import sharding
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.embed.task import head_for
from bertjax.tasks.seq2seq.options import TaskOptions
from bertjax.text.features import TruncationWarning
from tests.helpers.tokenizer_kinds import FILE_TRUNCATION, KINDS, text_of, write_tokenizer
from tests.helpers.user_texts import with_literals

pytestmark = pytest.mark.slow

ATOL = 1e-5
POSITIONS = 64
FAMILIES = ("bert", "modernbert")
# Word counts: one word, past the local window (8), past the files' truncation, past the
# positions.
LENGTHS = (1, 6, FILE_TRUNCATION + 6, 3 * POSITIONS)
MIXES = st.lists(st.sampled_from(LENGTHS), min_size=3, max_size=5).filter(
    lambda lengths: len(set(lengths)) > 2
)
LABEL_HEADS = {
    "classification": HeadSpec("classification", ("a", "b", "c")),
    "regression": HeadSpec("regression", ("score",)),
    "multi_label": HeadSpec("multi_label", ("x", "y", "z")),
    "token_classification": HeadSpec("token_classification", ("O", "B-X", "I-X")),
}


@pytest.fixture(scope="module")
def tokenizers_by_kind(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    return {kind: write_tokenizer(kind, root / kind) for kind in KINDS}


# One vocabulary size and one set of special ids for every tokenizer kind (the encoders'
# forward pass never reads the ids): each family has one config, compiled once for all kinds.
VOCAB = 448


def _config(family: str, vocab: int = VOCAB):
    if family == "bert":
        return BertConfig(
            vocab_size=vocab,
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            intermediate_size=64,
            max_position_embeddings=POSITIONS,
            initializer_range=0.2,
        )
    return ModernBertConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,  # a local layer and a global one
        num_heads=2,
        max_position_embeddings=POSITIONS,
        local_attention=8,
        global_attn_every_n_layers=2,
        pad_token_id=0,
        cls_token_id=1,
        sep_token_id=2,
        dtype="float32",
        initializer_range=0.2,
    )


@functools.cache
def _params(config, head):
    """Random parameters of the model a head (None: pretraining heads) needs."""
    if head is None:
        init = encoders.family_of(config).pretraining_init(config)
    else:
        init = capability.of(head).init(config, head)
    return jax.tree.map(np.asarray, nn.meta.unbox(jax.jit(init)(jax.random.key(0))))


def _model(family, tokenizer, head, *, batch_size, mesh, unpad=True):
    # Generation proposes every row of the vocabulary: it must be the tokenizer's own.
    seq2seq = head is not None and head.task == "seq2seq"
    config = _config(family, tokenizer.vocab_size if seq2seq else VOCAB)
    assert tokenizer.vocab_size <= config.vocab_size
    return Model(
        config,
        _params(config, head),
        tokenizer,
        head=head,
        batch_size=batch_size,
        mesh=mesh,
        unpad=unpad,
    )


def _assert_same(alone, together, where):
    """Equal structures; floats within ATOL."""
    if isinstance(alone, dict):
        assert alone.keys() == together.keys(), where
        for key in alone:
            _assert_same(alone[key], together[key], f"{where}.{key}")
    elif isinstance(alone, (list, tuple)):
        assert len(alone) == len(together), where
        for i, (a, b) in enumerate(zip(alone, together)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(alone, np.ndarray):
        np.testing.assert_allclose(alone, together, atol=ATOL, rtol=0, err_msg=where)
    elif isinstance(alone, float):
        assert math.isclose(alone, together, abs_tol=ATOL), (where, alone, together)
    else:
        assert alone == together, (where, alone, together)


def _texts(lengths, seed):
    return [text_of(n, seed + i) for i, n in enumerate(lengths)]


# Each method: (the head its model has, texts -> one result per text).
def _masked(text):
    """One [MASK] in a short text, two in a longer one, within the positions."""
    words = text.split()
    words[0] = "[MASK]"
    if len(words) > 3:
        words[3] = "[MASK]"
    return " ".join(words)


def _fill_mask(model, texts):
    return model.fill_mask([_masked(text) for text in texts], top_k=3)


def _embed(model, texts):
    return list(model.embed(texts, pooling="mean")) + list(model.embed(texts, pooling="cls"))


def _embed_as_trained(model, texts):
    return list(model.embed(texts))


def _search(model, texts):
    corpus = _texts(LENGTHS, 99)
    return model.search(texts, corpus, top_k=3)


def _answer(model, texts):
    questions = ["what did the ships carry"] * len(texts)
    return model.answer(questions, texts, top_k=2, max_seq_len=POSITIONS, doc_stride=16)


def _predict(model, texts):
    return model.predict(texts)


def _generate(model, texts):
    return model.generate(texts, num_beams=2, max_new_tokens=6)


def _seq2seq_head(tokenizer):
    options = TaskOptions(decoder_start_id=tokenizer.cls_id, eos_id=tokenizer.sep_id)
    return options.head()


METHODS = {
    "fill_mask": (lambda tok: None, _fill_mask),
    "embed": (lambda tok: None, _embed),
    "embed_as_trained": (
        lambda tok: head_for(EmbeddingSpec(pooling="mean", normalize=True, max_seq_length=32)),
        _embed_as_trained,
    ),
    "search": (
        lambda tok: head_for(EmbeddingSpec(pooling="cls", max_seq_length=POSITIONS)),
        _search,
    ),
    "answer": (lambda tok: HeadSpec("question_answering", ("start", "end")), _answer),
    **{
        f"predict_{task}": (lambda tok, head=head: head, _predict)
        for task, head in LABEL_HEADS.items()
    },
    "generate": (_seq2seq_head, _generate),
}
# The methods whose results the tokenizer shapes beyond the ids: tokens decoded (fill_mask,
# generate), words (token labels), character spans and word starts (answer).
EVERY_KIND = ("fill_mask", "answer", "predict_token_classification", "generate")
# An encoder-decoder is BERT's (transformers' EncoderDecoderModel of two BERTs).
CASES = [
    (family, method)
    for family in FAMILIES
    for method in METHODS
    if not (family == "modernbert" and method == "generate")
]


def _check(family, method, tokenizer, texts, mesh):
    """Each text alone against the whole list, both with the default batch_size; then the
    whole list with batch_size 1 against that. (With batch_size 1 every text of the list
    runs alone in a one-row batch: the same program and input as the text alone, so those
    two would be one call compared with itself.)"""
    head_of, run = METHODS[method]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)
        model = _model(family, tokenizer, head_of(tokenizer), batch_size=32, mesh=mesh)
        together = run(model, texts)
        assert len(together) >= len(texts)
        for i, text in enumerate(texts):
            (alone,) = run(model, [text])[:1]
            _assert_same(alone, together[i], f"{method} text {i} alone")
        one_by_one = _model(family, tokenizer, head_of(tokenizer), batch_size=1, mesh=mesh)
        _assert_same(run(one_by_one, texts), together, f"{method} batch_size 1")


@pytest.mark.parametrize("family,method", CASES)
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(lengths=MIXES, seed=st.integers(0, 2**16), data=st.data())
def test_a_texts_result_alone_equals_its_result_in_a_mixed_list(
    tokenizers_by_kind, family, method, lengths, seed, data
):
    texts = [data.draw(st.just(t) | with_literals(t)) for t in _texts(lengths, seed)]
    kinds = KINDS if method in EVERY_KIND else (KINDS[CASES.index((family, method)) % 3],)
    for kind in kinds:
        _check(family, method, tokenizers_by_kind[kind], texts, mesh=None)


@pytest.mark.parametrize("family,method", CASES)
def test_the_same_on_a_mesh_of_eight_devices(tokenizers_by_kind, family, method):
    mesh = sharding.make_mesh((2, 2, 2))
    texts = _texts(LENGTHS[::-1], 7)
    texts[1] = texts[1].replace(" ", " [SEP] ", 1)
    _check(family, method, tokenizers_by_kind["pipeline"], texts, mesh=mesh)


# A text past the positions (a full row), nearly empty ones and one in between: the batch's
# real tokens fill well under PACKING_MAX_SHARE of its slots, so it runs unpadded.
UNPADDED_MIX = (3 * POSITIONS, 1, 1, 6)


@pytest.fixture
def packed_lengths(monkeypatch):
    """The packed lengths Model.batched chooses, batch by batch (None: padded)."""
    chosen = []

    def recording(input_mask, shards=1):
        chosen.append(choose(input_mask, shards))
        return chosen[-1]

    choose = batching.fitted_packed_length
    monkeypatch.setattr(batching, "fitted_packed_length", recording)
    return chosen


@pytest.mark.parametrize("family,method", CASES)
def test_unpadded_batches_give_the_padded_results(
    tokenizers_by_kind, packed_lengths, family, method
):
    head_of, run = METHODS[method]
    tokenizer = tokenizers_by_kind["pipeline"]
    texts = _texts(UNPADDED_MIX, 5)
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)
        for unpad in (False, True):
            packed_lengths.clear()
            model = _model(
                family, tokenizer, head_of(tokenizer), batch_size=32, mesh=None, unpad=unpad
            )
            results[unpad] = run(model, texts)
            assert any(packed_lengths) == unpad, packed_lengths
    _assert_same(results[False], results[True], f"{family} {method}")


@pytest.mark.parametrize("family", FAMILIES)
def test_one_token_rows_unpadded_equal_padded(tokenizers_by_kind, family):
    """Rows of one token (below any text's: [CLS] text [SEP]) through Model.batched, beside
    a full row and a nearly empty one, for fill-mask and both embeddings' poolings."""
    config = _config(family)
    model = Model(config, _params(config, None), tokenizers_by_kind["pipeline"], batch_size=32)
    rng = np.random.default_rng(0)
    features = [
        {
            "input_ids": rng.integers(5, VOCAB, n).astype(np.int32),
            "segment_ids": np.zeros(n, np.int32),
            "masked_lm_positions": np.asarray([n - 1]),
        }
        for n in (POSITIONS, 2, 1, 1)
    ]
    functions = {
        "fill_mask": functools.partial(
            inference._fill_mask, config=model.run_config, usable=VOCAB, top_k=3
        ),
        **{
            pooling: functools.partial(
                inference._embed, config=model.run_config, pooling=pooling, normalize=False
            )
            for pooling in ("mean", "cls")
        },
    }
    for name, function in functions.items():
        outputs = {}
        for unpad in (False, True):
            model.batcher.unpad = unpad
            ((rows, out),) = list(model.batched(function, features))
            assert len(rows) == len(features)
            outputs[unpad] = jax.tree.map(lambda x, rows=rows: x[np.argsort(rows)], out)
        _assert_same(outputs[False], outputs[True], f"{family} {name}")
