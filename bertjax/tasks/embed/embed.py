"""`Model.embed` of an embedding model: each text as the model was trained to embed it.

Texts become [CLS] text [SEP] cut to the model's max_seq_length (an empty text is [CLS] [SEP],
special tokens written in a text are theirs, as sentence-transformers' tokenizers read
them), then run through the Model's one batching path (length buckets, batch_size, mesh)
with the model's pooling and normalisation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from bertjax.inference import InferenceError, Model, as_texts
from bertjax.tasks.embed import model as embedding


def embed(model: Model, texts: str | Sequence[str]) -> np.ndarray:
    """float32 [n, hidden]: each text embedded by the model's own EmbeddingSpec."""
    spec = model.head.options.spec
    texts = as_texts(texts, "texts")
    try:
        spec.check(model.config)
    except ValueError as err:
        raise InferenceError(str(err)) from None
    sequences = embedding.token_ids(model.tokenizer, texts, spec.max_seq_length)
    features = [
        {"input_ids": np.asarray(ids, np.int32), "segment_ids": np.zeros(len(ids), np.int32)}
        for ids in sequences
    ]
    function = functools.partial(
        embedding.embed_inputs,
        config=model.run_config,
        pooling=spec.pooling,
        normalize=spec.normalize,
    )
    out = np.zeros((len(texts), model.config.hidden_size), np.float32)
    for rows, vectors in model.batched(function, features):
        out[rows] = vectors
    return out
