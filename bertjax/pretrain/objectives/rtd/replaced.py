"""`Model.replaced`: which tokens of each text a replaced-token detector's discriminator
thinks were replaced. It serves every model with the family's replaced-token head trained
(capability.REPLACED_TOKENS): a replaced-token detection run's discriminator, or a
transformers ElectraForPreTraining directory. Texts run through the Model's one batching
path (length buckets, batch_size, mesh, unpadded rows)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from bertjax.inference import InferenceError, Model, as_texts
from bertjax.pretrain.objectives.rtd.model import DISCRIMINATOR_HEAD, Discriminator


def replaced(model: Model, texts) -> list:
    """Per text, one {"index", "token", "score", "replaced"} per token ([CLS] and [SEP] left
    out): its position in the model's input, its piece, the probability that it was replaced
    and whether that passes 0.5. For one text, its list; for a list, a list."""
    # A family's masked-LM tree may lack the head altogether (a ModernBERT trained with the
    # masked LM), or a directory may not have had it (freshly made).
    if DISCRIMINATOR_HEAD not in model.params or DISCRIMINATOR_HEAD in model.fresh_heads:
        raise InferenceError(
            f"{model.source} has no replaced-token detection head, so it cannot mark "
            "replaced tokens; a discriminator has one (an ELECTRA or ModernBERT run "
            "trained with objective='rtd', or an ElectraForPreTraining directory)"
        )
    single = isinstance(texts, str)
    texts = as_texts(texts, "texts")
    examples = model.examples(texts, None, None)
    # Jitted once for every Model of the same configuration (once per bucket shape).
    function = functools.partial(_replaced, config=model.run_config)
    scores: list[Any] = [None] * len(examples)
    for rows, batch_scores in model.batched(function, [e.features() for e in examples]):
        for row, row_scores in zip(rows, batch_scores):
            scores[row] = row_scores
    special = set(model.tokenizer.special_ids)
    results = [
        [
            {
                "index": index,
                "token": model.tokenizer.id_to_piece(token),
                "score": float(row_scores[index]),
                "replaced": bool(row_scores[index] > 0.5),
            }
            for index, token in enumerate(example.ids)
            if token not in special
        ]
        for example, row_scores in zip(examples, scores)
    ]
    return results[0] if single else results


@functools.partial(jax.jit, static_argnames=("config", "packed_length"))
def _replaced(params, batch, *, config, packed_length: int | None = None):
    """The probability that each token was replaced: float32 [b, s]."""
    logits = Discriminator(config).apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        packed_length=packed_length,
        method=Discriminator.replaced_logits,
    )  # [b, s]
    return jax.nn.sigmoid(logits.astype(jnp.float32))
