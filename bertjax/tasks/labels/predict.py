"""`Model.predict` for label heads: classification, regression, multi-label, token labels.

Texts (and pairs) become inputs as fine-tuning encoded them and run through the Model's one
batching path (length buckets, batch_size, mesh); each row's head outputs become the
prediction a notebook user reads.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import numpy as np

from bertjax.capability import HeadSpec
from bertjax.encoders.family import EncoderConfig
from bertjax.inference import InferenceError, Model, as_int, as_texts
from bertjax.tasks.labels import model as label_heads
from bertjax.text import features as features_lib
from bertjax.text.features import TruncationWarning


def predict(model: Model, texts, text_pairs=None, max_length: int | None = None) -> Any:
    """A fine-tuned model's predictions with their scores, per text (or pair).

    classification: {"label", "score"}, the most probable label and its probability;
    regression: {"label": the output's name, "score": the predicted value};
    multi_label: [{"label", "score"}, ...] for every label of probability >= 0.5, most
    probable first; token_classification: [{"word", "label", "score"}, ...] per word of
    the text split at whitespace (a word past max_length gets "O", or the first label,
    with score 0). One text gives one result, a list of texts a list of them.
    """
    head = model.head
    single = isinstance(texts, str)
    texts = as_texts(texts, "texts")
    if head.token_level:
        if text_pairs is not None:
            raise InferenceError("token classification labels single texts: give no pairs")
        results = _predict_words(model, texts, max_length)
    else:
        pairs = None if text_pairs is None else as_texts(text_pairs, "text_pairs")
        if pairs is not None and len(pairs) != len(texts):
            raise InferenceError(
                f"text_pairs has {len(pairs)} texts but texts has {len(texts)}; give one "
                "pair per text"
            )
        examples = model.examples(texts, pairs, max_length)
        outputs = _predict_rows(model, [e.features() for e in examples])
        results = [_sequence_prediction(head, out) for out in outputs]
    return results[0] if single else results


def _predict_rows(model: Model, features: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
    """The head's outputs (bertjax.tasks.labels.model.outputs) for each row of features, in
    order."""
    # Jitted once for every Model of the same configuration and head (once per bucket shape).
    function = functools.partial(_predict, config=model.run_config, head=model.head)
    per_row: list[Any] = [None] * len(features)
    for rows, outputs in model.batched(function, features):
        for k, row in enumerate(rows):
            per_row[row] = {name: values[k] for name, values in outputs.items()}
    return per_row


def _predict_words(model: Model, texts: list[str], max_length: int | None) -> list[list[dict]]:
    limit = model.config.max_position_embeddings
    if max_length is not None:
        max_length = as_int(
            max_length, "max_length", 3, limit, why=f"[CLS], [SEP] and a word; {limit} positions"
        )
    max_length = limit if max_length is None else max_length
    words = [text.split() for text in texts]
    for i, sentence in enumerate(words):
        if not sentence:
            raise InferenceError(
                f"{features_lib.which(i, len(texts), 'text')} is empty; every text needs some words"
            )
    inputs = label_heads.encode_words(model.tokenizer, words, max_length)
    lengths = inputs.input_mask.sum(axis=1)
    outputs = _predict_rows(
        model,
        [
            {"input_ids": inputs.input_ids[r, :n], "segment_ids": inputs.segment_ids[r, :n]}
            for r, n in enumerate(lengths)
        ],
    )
    if inputs.words_cut:
        warnings.warn(
            f"{inputs.words_cut} word(s) lie past the limit of {max_length} tokens (or have "
            "no tokens) and get no prediction of their own",
            TruncationWarning,
            stacklevel=4,
        )
    labels = model.head.labels
    default = "O" if "O" in labels else labels[0]
    return [
        [
            {
                "word": word,
                "label": labels[out["labels"][p]] if p >= 0 else default,
                "score": float(out["scores"][p]) if p >= 0 else 0.0,
            }
            for word, p in zip(sentence, where)
        ]
        for sentence, where, out in zip(words, inputs.word_positions, outputs)
    ]


@functools.partial(jax.jit, static_argnames=("config", "head", "packed_length"))
def _predict(params, batch, *, config: EncoderConfig, head: HeadSpec, packed_length: int | None):
    """What a label head gives per row (bertjax.tasks.labels.model.outputs); `packed_length` as
    Model.batched gives it."""
    logits = label_heads.make_model(config, head.task, head.num_outputs).apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        deterministic=True,
        packed_length=packed_length,
    )  # [b, labels] or [b, s, labels]
    return label_heads.outputs(head.task, logits)


def _sequence_prediction(head: HeadSpec, out: dict[str, np.ndarray]) -> Any:
    """One text's prediction (see predict) from its row of label_heads.outputs."""
    if head.task == label_heads.REGRESSION:
        return {"label": head.labels[0], "score": float(out["values"])}
    probabilities = out["probabilities"]
    if head.task == label_heads.MULTI_LABEL:
        chosen = np.flatnonzero(probabilities >= label_heads.MULTI_LABEL_THRESHOLD)
        chosen = sorted(chosen, key=lambda k: -probabilities[k])
        return [{"label": head.labels[k], "score": float(probabilities[k])} for k in chosen]
    best = int(np.argmax(probabilities))
    return {"label": head.labels[best], "score": float(probabilities[best])}
