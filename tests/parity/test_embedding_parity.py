"""The parity tests of test_embedding.py (tests/unit/), with its helpers."""

import json

import jax
import numpy as np
import pytest

from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.tasks.embed import hf as sbert
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.text.training import TokenizerSettings, train_tokenizer
from tests.helpers.embedding import (
    CONFIG,
    MODERN,
    TEXTS,
    embed_texts,
    max_difference,
    random_params,
    wordpiece,  # noqa: F401 (fixtures)
)


@pytest.mark.parametrize(
    "spec",
    [
        EmbeddingSpec("mean", False, 16),
        EmbeddingSpec("max", True, 16),
        EmbeddingSpec("cls", True, 24),
    ],
)
def test_saved_directory_loads_in_sentence_transformers(tmp_path, wordpiece, spec):
    from sentence_transformers import SentenceTransformer

    params = random_params(9)
    sbert.save(tmp_path, CONFIG, params, wordpiece, spec)
    reference = SentenceTransformer(str(tmp_path), device="cpu")
    assert reference.max_seq_length == spec.max_seq_length
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    ours = embed_texts(CONFIG, params, wordpiece, spec, TEXTS)
    np.testing.assert_allclose(ours, expected, atol=1e-4)
    # And back: the same spec and weights.
    loaded = sbert.load(tmp_path)
    assert loaded.spec == spec and loaded.config == CONFIG
    assert max_difference(jax.tree.leaves(loaded.params), jax.tree.leaves(params)) == 0


def test_reads_a_directory_sentence_transformers_wrote(tmp_path, wordpiece):
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    torch.manual_seed(0)
    source = tmp_path / "bert"
    hf_config = transformers.BertConfig(
        vocab_size=CONFIG.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=40,
        initializer_range=0.2,  # spread-out vectors: a real test of the 1e-4 agreement
    )
    transformers.BertModel(hf_config).save_pretrained(source)
    wordpiece.save_hf(source)
    transformer = modules.Transformer(str(source))
    reference = SentenceTransformer(
        modules=[transformer, modules.Pooling(32, pooling_mode="max"), modules.Normalize()],
        device="cpu",
    )
    reference.max_seq_length = 20
    reference.save(str(tmp_path / "st"))
    expected = reference.encode(TEXTS, convert_to_numpy=True)

    loaded = sbert.load(tmp_path / "st")
    assert loaded.spec == EmbeddingSpec("max", True, 20)
    ours = embed_texts(loaded.config, loaded.params, loaded.tokenizer, loaded.spec, TEXTS)
    np.testing.assert_allclose(ours, expected, atol=1e-4)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_modernbert_encoder_goes_to_sentence_transformers_and_back(tmp_path, wordpiece, pooling):
    from sentence_transformers import SentenceTransformer

    params = random_params(12, MODERN)
    spec = EmbeddingSpec(pooling, True, 24)
    sbert.save(tmp_path, MODERN, params, wordpiece, spec)
    config_json = json.loads((tmp_path / "config.json").read_text())
    assert config_json["architectures"] == ["ModernBertModel"]
    reference = SentenceTransformer(str(tmp_path), device="cpu")
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    ours = embed_texts(MODERN, params, wordpiece, spec, TEXTS)
    np.testing.assert_allclose(ours, expected, atol=1e-4)

    loaded = sbert.load(tmp_path)
    assert isinstance(loaded.config, ModernBertConfig) and loaded.spec == spec
    assert loaded.config.num_layers == 4 and loaded.config.local_attention == 8
    again = embed_texts(loaded.config, loaded.params, loaded.tokenizer, loaded.spec, TEXTS)
    np.testing.assert_allclose(again, ours, atol=1e-6)


def test_a_sentencepiece_model_embeds_alike_in_sentence_transformers(tmp_path):
    """bertjax's own tokenizer (sentencepiece, exported as tokenizer.json) in the directory."""
    from sentence_transformers import SentenceTransformer

    from tests.helpers.tokenizer import VARIED, training_sentences

    tokenizer = train_tokenizer(
        training_sentences(800)[:800], TokenizerSettings(vocab_size=400), tmp_path / "spm.model"
    )
    config = BertConfig(**{**CONFIG.to_dict(), "vocab_size": 400})
    params = random_params(11, config)
    spec = EmbeddingSpec("mean", True, 24)
    sbert.save(tmp_path / "st", config, params, tokenizer, spec)
    texts = ["", *VARIED[:6], " ".join(training_sentences(40))]
    expected = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts)
    ours = embed_texts(config, params, tokenizer, spec, texts)
    np.testing.assert_allclose(ours, expected, atol=1e-4)
