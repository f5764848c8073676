"""The embedding fine-tuning task: settings, files, the flat-batch objective, the notebook
Model of an embedding model, sentence-transformers both ways, and a short run that learns."""

import numpy as np
import pytest

from bertjax.engine.settings import ConfigError
from bertjax.finetune import task as task_lib
from bertjax.finetune.data import TaskDataError
from bertjax.finetune.settings import FinetuneSettings
from bertjax.tasks.embed import metrics as embedding_eval
from bertjax.tasks.embed import objective as training
from bertjax.tasks.embed import task as task_module
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.labels import model as label_heads
from bertjax.text.tokenizer import WordPieceTokenizer
from tests.helpers.embedding_task import (
    SEQ,
    TRAIN_EXAMPLES,
    _config,
    files,  # noqa: F401 (fixtures)
)


def _settings(root, **fields) -> FinetuneSettings:
    return FinetuneSettings.from_config(_config(root, **fields))


# ----------------------------------------------------------------------------- settings


def test_the_task_is_registered_after_the_four_heads():
    assert task_lib.names()[:4] == label_heads.TASKS and "embedding" in task_lib.names()[4:]
    task = task_lib.get("embedding")
    assert task.default_metric == "spearman" and "ndcg@10" in task.metrics


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"embedding.pooling": "sum"}, r"config.embedding: EmbeddingSpec.pooling='sum' is invalid"),
        ({"embedding.loss": "triplet"}, r"config.embedding: LossSettings.loss='triplet' is inv"),
        ({"embedding.scale": 0.0}, r"LossSettings.scale=0.0 is invalid: must be a number > 0"),
        ({"data.text_fields": "anchor"}, r"text_fields='anchor': the embedding task reads two"),
        (
            {"embedding.loss": "cosine_regression", "data.text_fields": "a,b,c"},
            r"reads two \(scored pairs",
        ),
        ({"grad_accum_steps": 2, "batch_size": 32}, r"config.grad_accum_steps=2: in_batch_neg"),
        ({"embedding.queries": "q.tsv"}, r"needs queries, corpus and relevance; only \['queries"),
        ({"metric": "ndcg@10"}, r"config.metric='ndcg@10' is a retrieval metric"),
        ({"data.label_field": ""}, r"config.data.label_field is empty"),
        ({"metric": "accuracy"}, r"config.metric='accuracy': must be one of \('spearman'"),
    ],
)
def test_settings_refuse_bad_values_in_one_line(files, fields, message):
    with pytest.raises(ConfigError, match=message) as error:
        _settings(files, **fields)
    assert "\n" not in str(error.value)


def test_reads_triples_scored_pairs_and_retrieval_files(files):
    settings = _settings(
        files,
        **{
            "embedding.queries": str(files / "queries.tsv"),
            "embedding.corpus": str(files / "corpus.tsv"),
            "embedding.relevance": str(files / "qrels.tsv"),
            "embedding.pooling": "max",
            "embedding.normalize": True,
            "embedding.symmetric": True,
            "metric": "ndcg@10",
        },
    )
    tokenizer = WordPieceTokenizer.from_vocab(files / "vocab.txt")
    data = task_lib.get("embedding").read(settings.data, tokenizer)
    # The head carries the model's spec and the loss: a run directory opens as it was trained.
    assert data.head.options.spec == EmbeddingSpec("max", True, SEQ)
    assert task_module.loss_of(data.head) == training.LossSettings(symmetric=True)
    train = data.train.features
    assert len(data.train) == TRAIN_EXAMPLES
    for prefix in ("", "positive_", "negative_"):
        assert train[prefix + "input_ids"].shape == (TRAIN_EXAMPLES, SEQ)
        assert (train[prefix + "input_ids"][:, 0] == tokenizer.cls_id).all()
    # A retrieval metric decides: the retrieval split is evaluated first.
    retrieval, sts = data.validation
    assert isinstance(retrieval, task_module.RetrievalExamples)
    assert retrieval.name == "validation_retrieval" and retrieval.queries == 40
    assert len(retrieval) == 80 and retrieval.relevant[7] == frozenset({7})
    assert sts.features["scores"].shape == (300,) and set(sts.features["scores"]) <= {0, 1, 2, 3}
    assert "negative_input_ids" not in sts.features


def test_retrieval_files_name_the_line_of_a_bad_pair(files, tmp_path):
    (tmp_path / "qrels.tsv").write_text("q0\td0\nq1\td99\n")
    tokenizer = WordPieceTokenizer.from_vocab(files / "vocab.txt")
    with pytest.raises(TaskDataError, match=r"qrels.tsv line 2: document 'd99' is not in .*corpus"):
        task_module.read_retrieval(
            str(files / "queries.tsv"),
            str(files / "corpus.tsv"),
            str(tmp_path / "qrels.tsv"),
            tokenizer,
            SEQ,
        )


# ----------------------------------------------------------------------------- the objective


def test_scores_are_sts_or_retrieval_by_split(files):
    task = task_lib.get("embedding")
    head = task_module.head_for(EmbeddingSpec(), training.LossSettings())
    tokenizer = WordPieceTokenizer.from_vocab(files / "vocab.txt")
    retrieval = task_module.read_retrieval(
        str(files / "queries.tsv"),
        str(files / "corpus.tsv"),
        str(files / "qrels.tsv"),
        tokenizer,
        SEQ,
    )
    # Each query's vector is its relevant document's, slightly moved: a perfect ranking.
    docs = np.random.default_rng(2).normal(size=(40, 8)).astype(np.float32)
    vectors = np.concatenate([docs + 0.01, docs])
    scores = task.scores(head, retrieval, {"anchor": vectors})
    assert scores["mrr@10"] == 1.0 and scores["ndcg@10"] == 1.0 and scores["recall@1"] == 1.0
    gold = np.asarray([0.0, 1.0, 2.0, 3.0], np.float32)
    a = np.eye(4, dtype=np.float32)
    b = a + gold[::-1, None] * np.roll(a, 1, axis=0)  # cosine rises with the gold score
    examples = task_lib.Examples("validation", "x", {"scores": gold}, list("abcd"), True)
    got = task.scores(head, examples, {"anchor": a, "positive": b})
    assert got == pytest.approx(embedding_eval.sts_scores(a, b, gold))
    assert got["spearman"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- the notebook


# ----------------------------------------------------------------------------- a run learns
