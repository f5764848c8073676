"""Sentence embeddings: a bi-encoder trained on pairs, triples or scored pairs.

model.py      EmbeddingSpec, pooling, the BiEncoder, texts to inputs
objective.py  in-batch negatives and cosine regression as sums; GradCache
metrics.py    STS correlations and retrieval MRR / nDCG / recall
task.py       the fine-tuning task (config.task=embedding, config.embedding)
hf.py         sentence-transformers directories in and out
embed.py      Model.embed as the model was trained (Model.similarity and Model.search
              build on it)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from bertjax import capability
from bertjax.capability import HeadSpec, Opened
from bertjax.tasks.embed import hf as sbert
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed.embed import embed
from bertjax.tasks.embed.task import EmbeddingOptions, EmbeddingTask, head_for


class Embedding(capability.Capability):
    """One vector per text: the encoder and a pooling (no head parameters)."""

    tasks = (embedding.EMBEDDING_TASK,)
    method = "embed"
    usage = 'embed(["a text", ...]) or search(["a query"], ["a text", ...])'
    fine_tuning = {embedding.EMBEDDING_TASK: EmbeddingTask()}
    notebook = {"embed": embed}

    def check_head(self, head: HeadSpec) -> None:
        if head.labels or not isinstance(head.options, EmbeddingOptions):
            raise ValueError(
                f"an {head.task} head has no labels and EmbeddingOptions; got "
                f"labels={head.labels!r}, options={head.options!r}"
            )

    def options_from_dict(self, d: Mapping[str, Any]) -> EmbeddingOptions:
        return EmbeddingOptions.from_dict(d)

    def head_from_legacy(self, task: str, labels: tuple[str, ...]) -> HeadSpec:
        return HeadSpec(task, (), EmbeddingOptions.from_labels(labels))

    def init(self, config, head: HeadSpec):
        model = embedding.make_model(config, head.options.spec)
        return functools.partial(embedding.init_params, model)

    def recognises(self, path: str | os.PathLike) -> bool:
        return sbert.is_sentence_transformers_dir(path)

    def open(self, path: str | os.PathLike, **overrides) -> Opened:
        loaded = sbert.load(path, **overrides)
        return Opened(loaded.config, loaded.params, loaded.tokenizer, head_for(loaded.spec))

    def save(self, model, directory: str | os.PathLike) -> None:
        spec = model.head.options.spec
        sbert.save(directory, model.config, model.params, model.tokenizer, spec)


CAPABILITY = Embedding()
