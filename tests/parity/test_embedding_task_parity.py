"""The parity tests of test_embedding_task.py (tests/unit/), with its helpers."""

import numpy as np
import pytest

import bertjax
from bertjax.inference import vectors
from bertjax.tasks.embed import task as task_module
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.embedding import CONFIG, TEXTS, random_params
from tests.helpers.embedding_task import (
    LONG,
    SEQ,
    files,  # noqa: F401 (fixtures)
)


def test_model_embeds_a_sentence_transformers_directory_as_it_does(files):
    """SentenceTransformer(path).encode == Model.load(path).embed(texts), long and empty
    texts included; similarity and search agree with the vectors."""
    from sentence_transformers import SentenceTransformer

    texts = [*TEXTS, LONG, ""]
    model = bertjax.Model.load(files / "source")
    assert model.head.options.spec == EmbeddingSpec("mean", False, SEQ)
    ours = model.embed(texts)
    expected = SentenceTransformer(str(files / "source"), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, expected, atol=1e-4)
    sims = model.similarity(texts[:3], texts)
    np.testing.assert_allclose(sims, vectors.similarity(ours[:3], ours), atol=1e-5)
    hits = model.search(texts[:2], texts, top_k=3)
    assert [h["corpus_id"] for h in hits[0]][0] == 0 and len(hits[1]) == 3
    assert hits[1][0]["score"] == pytest.approx(float(np.max(sims[1])), abs=1e-5)
    # Pooling named explicitly keeps the older, encoder-only behaviour.
    assert model.embed(["w1 w2"], pooling="cls").shape == (1, CONFIG.hidden_size)


@pytest.mark.parametrize("spec", [EmbeddingSpec("max", True, 12), EmbeddingSpec("cls", False, 20)])
def test_model_save_hf_of_an_embedding_model_loads_in_sentence_transformers(files, tmp_path, spec):
    from sentence_transformers import SentenceTransformer

    tokenizer = WordPieceTokenizer.from_vocab(files / "vocab.txt")
    model = bertjax.Model(
        CONFIG, {"bert": random_params(4)["bert"]}, tokenizer, head=task_module.head_for(spec)
    )
    model.save_hf(tmp_path / "export")
    reference = SentenceTransformer(str(tmp_path / "export"), device="cpu")
    assert reference.max_seq_length == spec.max_seq_length
    texts = [*TEXTS, LONG, ""]
    np.testing.assert_allclose(model.embed(texts), reference.encode(texts), atol=1e-4)
    # And back through Model.load: the same spec, the same vectors.
    again = bertjax.Model.load(tmp_path / "export")
    assert again.head.options.spec == spec
    np.testing.assert_allclose(again.embed(texts), reference.encode(texts), atol=1e-4)
