"""Packed-document pretraining data: packing, per-document attention, the MLM-only run on it."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.data import make_loader, prepare
from bertjax.data.corpus import InputReport, read_documents
from bertjax.data.instances import tokenize_documents
from bertjax.data.masking import MaskingSettings, num_to_predict
from bertjax.data.packing import (
    best_fit,
    document_features,
    document_pieces,
    efficiency,
    pack_documents,
)
from bertjax.data.storage import shard_paths
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.bert.model import BertModel
from bertjax.engine.settings import ConfigError
from bertjax.nn import attention
from bertjax.pretrain.data import ensure_data
from bertjax.pretrain.settings import PretrainSettings
from bertjax.text.tokenizer import Tokenizer
from tests.helpers.attention_reference import reference_attention
from tests.helpers.packing import SEQ_LEN, packed_config

prepare_module = importlib.import_module("bertjax.data.prepare")

CLS, SEP = 2, 3


def rows_of(instances) -> list[np.ndarray]:
    return [instances.instance(i) for i in range(instances.num_instances)]


# ----------------------------------------------------------------------------- packing


def test_best_fit_packs_a_known_set_as_computed_by_hand():
    # Capacity 10, longest first: 7 opens row 0 (3 left), 5 opens row 1 (5 left), 4 goes to
    # row 1 (the only one with room; 1 left), 3 fills row 0, the next 3 opens row 2 (7 left),
    # 2 and 2 go to row 2 (3 left), 1 fills row 1. 27 tokens in 3 rows of 10.
    rows = best_fit([7, 5, 4, 3, 3, 2, 2, 1], 10)
    assert rows == [[0, 3], [1, 2, 7], [4, 5, 6]]
    assert efficiency(27, len(rows), 10) == pytest.approx(0.9)
    # Best fit, not first fit: 3 goes to the row with 3 left (row 1), not the older row 0
    # with 4 left; then 4 fills row 0.
    assert best_fit([6, 7, 3, 4], 10) == [[1, 2], [0, 3]]


def test_pack_documents_efficiency_by_hand():
    # Documents of 5, 3, 2, 1, 1 tokens are pieces of 7, 5, 4, 3, 3 with [CLS] and [SEP]:
    # rows {7, 3}, {5, 4}, {3} -> 22 tokens in 3 rows of 10. A 20-token document splits into
    # pieces of 8, 8 and 4 tokens (10, 10 and 6 with specials).
    documents = [[np.arange(10, 10 + n, dtype=np.int32)] for n in (5, 3, 2, 1, 1)]
    packed = pack_documents(documents, 10, CLS, SEP)
    assert [len(r) for r in rows_of(packed)] == [10, 9, 3]
    assert efficiency(len(packed.tokens), packed.num_instances, 10) == pytest.approx(22 / 30)
    long = [[np.arange(100, 120, dtype=np.int32)]]
    assert [len(p) for p in document_pieces(long, 10)] == [8, 8, 4]
    assert [len(r) for r in rows_of(pack_documents(long, 10, CLS, SEP))] == [10, 10, 6]


def test_packing_keeps_every_token_of_every_document_exactly_once():
    rng = np.random.default_rng(0)
    documents = []
    for d in range(60):
        # Token 10 + 1000 * d + i is the i-th token of document d: a row tells its source.
        sizes = rng.integers(0, 40, size=rng.integers(1, 6))
        start = 10 + 1000 * d
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        documents.append(
            [np.arange(start + a, start + b, dtype=np.int32) for a, b in zip(bounds, bounds[1:])]
        )
    packed = pack_documents(documents, SEQ_LEN, CLS, SEP)
    seen = {d: [] for d in range(len(documents))}
    for row in rows_of(packed):
        assert 0 < len(row) <= SEQ_LEN
        features = document_features(row[None], np.ones((1, len(row))), CLS)
        ids, positions = features["document_ids"][0], features["positions"][0]
        for doc in np.unique(ids):
            piece = row[ids == doc]
            assert piece[0] == CLS and piece[-1] == SEP  # a whole piece, never cut by a row
            assert np.array_equal(positions[ids == doc], np.arange(len(piece)))
            body = piece[1:-1]
            assert body.size and np.all((body - 10) // 1000 == (body[0] - 10) // 1000)
            seen[int((body[0] - 10) // 1000)].extend(int(t) for t in body)
    for d, document in enumerate(documents):
        expected = np.concatenate(document).tolist() if document else []
        assert sorted(seen[d]) == expected  # every token once, none from elsewhere


def test_document_features_of_a_padded_row():
    ids = np.array([[CLS, 7, 8, SEP, CLS, 9, SEP, 0, 0]])
    mask = (ids != 0).astype(np.int32)
    features = document_features(ids, mask, CLS)
    assert features["document_ids"].tolist() == [[1, 1, 1, 1, 2, 2, 2, 0, 0]]
    assert features["positions"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 0]]


# ----------------------------------------------------------------------------- prepare + loader


def test_prepare_packs_each_chunk_and_reports_the_efficiency(packed_data):
    corpus, data_dir, manifest = packed_data
    assert manifest["layout"] == "packed" and manifest["num_chunks"] >= 3
    tokenizer = Tokenizer.load(data_dir / "tokenizer.model")
    pieces = []
    for split, info in manifest["splits"].items():
        assert info["packing_efficiency"] == pytest.approx(
            info["num_tokens"] / (info["num_instances"] * SEQ_LEN)
        )
        assert 0.9 < info["packing_efficiency"] <= 1.0
        for shard in info["shards"]:
            tokens = np.load(shard_paths(data_dir, split, shard["name"])[0])
            pieces += np.split(tokens, np.flatnonzero(tokens == CLS)[1:])
    # Shard k is exactly chunk k's train documents packed: a pure function of the chunk, which
    # keeps the output byte-identical over any number of processes.
    chunks = prepare_module._chunks(read_documents([str(corpus)], InputReport()), 10_000, 7, 0.1)
    all_documents = []
    for index, parts, _ in chunks:
        expected = pack_documents(tokenize_documents(parts["train"], tokenizer), SEQ_LEN, CLS, SEP)
        tokens_path, index_path = shard_paths(data_dir, "train", f"shard-{index:05d}")
        assert np.array_equal(np.load(tokens_path), expected.tokens)
        assert np.array_equal(np.load(index_path)[:, 1], np.diff(expected.offsets))
        all_documents += parts["train"] + parts["eval"]
    # Every document piece of the corpus is in exactly one row of one split.
    tokens = tokenize_documents(all_documents, tokenizer)
    expected_pieces = [[CLS, *p.tolist(), SEP] for p in document_pieces(tokens, SEQ_LEN)]
    assert sorted(p.tolist() for p in pieces) == sorted(expected_pieces)


def test_layout_and_dupe_factor_are_checked(tmp_path, packed_data):
    corpus = str(packed_data[0])
    with pytest.raises(ValueError, match="layout='rows' is invalid"):
        prepare([corpus], tmp_path / "a", layout="rows", verbose=False)
    with pytest.raises(ValueError, match="dupe_factor=2 is invalid with layout='packed'"):
        prepare([corpus], tmp_path / "b", layout="packed", dupe_factor=2, verbose=False)


def test_packed_batches_carry_documents_and_are_masked_as_pairs(packed_data):
    _, data_dir, _ = packed_data
    masking = MaskingSettings(masked_lm_prob=0.15, max_predictions_per_seq=10)
    loader = make_loader(data_dir, batch_size=8, masking=masking, seed=1)
    maker = loader._maker
    unmasked = maker.reader.gather(maker.order(0)[:8], SEQ_LEN)
    batch = next(loader)
    assert loader.layout == "packed"
    assert not batch["segment_ids"].any() and not batch["next_sentence_labels"].any()
    expected = document_features(unmasked["input_ids"], unmasked["input_mask"], CLS)
    assert np.array_equal(batch["document_ids"], expected["document_ids"])
    assert np.array_equal(batch["positions"], expected["positions"])
    assert batch["document_ids"].max() >= 2  # rows do hold several documents
    # google's count per row, never a special token or padding, 80/10/10 from the loader.
    weights = batch["masked_lm_weights"].astype(bool)
    lengths = batch["input_mask"].sum(axis=1)
    assert np.array_equal(weights.sum(axis=1), num_to_predict(lengths, masking))
    rows = np.broadcast_to(np.arange(8)[:, None], weights.shape)
    originals = unmasked["input_ids"][rows[weights], batch["masked_lm_positions"][weights]]
    assert np.array_equal(originals, batch["masked_lm_ids"][weights])
    assert not np.isin(originals, [0, 1, CLS, SEP, 4]).any()
    assert batch["input_mask"][rows[weights], batch["masked_lm_positions"][weights]].all()


# ----------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def model_and_params():
    config = BertConfig.preset(
        "tiny", vocab_size=40, hidden_dropout=0.0, attention_dropout=0.0, attention_impl="xla"
    )
    model = BertModel(config)
    ids = jnp.ones((1, 16), jnp.int32)
    return model, jax.jit(model.init)(jax.random.key(0), ids)


# Row: document 1 of 5 tokens, document 2 of 6, padding.
ROW = np.array([[CLS, 11, 12, 13, SEP, CLS, 21, 22, 23, 24, SEP, 0, 0, 0, 0, 0]])
MASK = (ROW != 0).astype(np.int32)
DOCS = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0]])
POSITIONS = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0]])
SECOND = slice(5, 11)


def packed_outputs(model, params, row, **kwargs):
    return model.apply(params, row, None, MASK, document_ids=DOCS, positions=POSITIONS, **kwargs)[0]


def test_a_document_does_not_see_the_other_documents_of_its_row(model_and_params):
    model, params = model_and_params
    before = packed_outputs(model, params, ROW)
    changed = ROW.copy()
    changed[0, 1:4] = [31, 32, 33]  # document 1's text
    after = packed_outputs(model, params, changed)
    assert np.array_equal(np.asarray(after[0, SECOND]), np.asarray(before[0, SECOND]))
    assert not np.allclose(after[0, :5], before[0, :5])
    # Token packing in the encoder (packed_length) composes with it.
    squeezed = packed_outputs(model, params, changed, packed_length=12)
    np.testing.assert_allclose(squeezed[0, :11], after[0, :11], atol=1e-6)


def test_a_packed_document_equals_the_document_alone(model_and_params):
    model, params = model_and_params
    packed = packed_outputs(model, params, ROW)
    alone = model.apply(params, ROW[:, SECOND])[0]  # positions 0..5, no other document
    np.testing.assert_allclose(packed[0, SECOND], alone[0], atol=1e-5)
    first = model.apply(params, ROW[:, :5])[0]
    np.testing.assert_allclose(packed[0, :5], first[0], atol=1e-5)


def test_attention_document_mask_on_every_path():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 8, 2, 4)), jnp.float32) for _ in range(3))
    docs = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    mask = (docs > 0).astype(jnp.int32)
    reference = reference_attention(q, k, v, mask, document_ids=docs)
    xla = attention.dot_product_attention(q, k, v, mask, implementation="xla", document_ids=docs)
    np.testing.assert_allclose(xla, reference, atol=1e-5)
    # Each document alone gives the same as within the row.
    alone = reference_attention(q[:1, 3:5], k[:1, 3:5], v[:1, 3:5])
    np.testing.assert_allclose(reference[:1, 3:5], alone, atol=1e-5)
    # cuDNN cannot take the mask: the reason it falls back to xla.
    assert "document" in attention._cudnn_problem(jnp.bfloat16, 64, document_mask=True)


def test_splash_takes_the_documents_as_segment_ids():
    # Pallas interpret mode off TPU; splash needs a multiple of 128 tokens.
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 128, 2, 16)), jnp.float32) for _ in range(3))
    docs = np.zeros((2, 128), np.int32)
    docs[0, :50], docs[0, 50:90], docs[1, :128] = 1, 2, 1
    docs = jnp.asarray(docs)
    mask = (docs > 0).astype(jnp.int32)
    splash = attention.dot_product_attention(
        q, k, v, mask, implementation="splash", document_ids=docs
    )
    reference = reference_attention(q, k, v, mask, document_ids=docs)
    real = np.asarray(mask).astype(bool)
    np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(reference)[real], atol=1e-5)


# ----------------------------------------------------------------------------- settings + run


def test_the_sentence_pair_objective_is_refused_on_packed_data(packed_data):
    config = packed_config(packed_data[1], objective="mlm_sentence")
    with pytest.raises(ConfigError) as error:
        PretrainSettings.from_config(config)
    message = str(error.value)
    assert "\n" not in message
    assert "config.objective='mlm_sentence'" in message and "data.layout='packed'" in message
    with pytest.raises(ConfigError, match="config.data.dupe_factor=2"):
        PretrainSettings.from_config(packed_config(packed_data[1], **{"data.dupe_factor": 2}))


def test_a_run_of_pairs_refuses_packed_data(packed_data, tmp_path):
    config = packed_config(packed_data[1], **{"data.layout": "pairs"})
    settings = PretrainSettings.from_config(config)
    with pytest.raises(ConfigError, match="config.data.layout='pairs' but .* layout='packed'"):
        ensure_data(settings.data, tmp_path, eval_batch_size=4, seed=0)
