"""`Model.generate`: an encoder-decoder's text for each source text, greedy or beam search.

Sources become [CLS] text [SEP] and run through the Model's one batching path (length
buckets, batch_size, mesh); each batch generates inside one compiled loop
(bertjax.tasks.seq2seq.decoding.generate).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from bertjax.inference import InferenceError, Model, as_texts
from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq.options import TaskOptions


def generate(
    model: Model,
    texts: str | Sequence[str],
    num_beams: int = 4,
    max_new_tokens: int = 64,
    *,
    length_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    early_stopping: bool | str = False,
    max_length: int | None = None,
) -> str | list[str]:
    """An encoder-decoder's generated text per source text (greedy with num_beams=1).

    The arguments mean what transformers' generate's do; sources longer than max_length
    tokens (default: the model's positions) are cut. One text gives one string.
    """
    options: TaskOptions = model.head.options
    try:
        settings = decoding.GenerationSettings(
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            length_penalty=length_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            early_stopping=early_stopping,
            usable_vocab=model.tokenizer.vocab_size,
        )
    except ValueError as err:
        raise InferenceError(str(err).replace("GenerationSettings.", "")) from None
    positions = model.config.max_position_embeddings
    if max_new_tokens + 1 > positions:
        raise InferenceError(
            f"max_new_tokens={max_new_tokens} is invalid: the decoder has {positions} "
            f"positions, so at most {positions - 1}"
        )
    single = isinstance(texts, str)
    texts = as_texts(texts, "texts")
    features = [e.features() for e in model.examples(texts, None, max_length)]
    function = functools.partial(
        _generate, config=options.config(model.run_config), settings=settings
    )
    results: list[Any] = [None] * len(texts)
    for rows, (tokens, lengths) in model.batched(function, features):
        generated = decoding.Generated(tokens, lengths, None)
        for row, ids in zip(rows, decoding.strip(generated, options.eos_id)):
            results[row] = model.tokenizer.decode(ids, skip_special=True).strip()
    return results[0] if single else results


def _generate(params, batch, *, config, settings, packed_length):
    generated = decoding.generate(
        config,
        params,
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        settings=settings,
        packed_length=packed_length,
    )
    return generated.tokens, generated.lengths
