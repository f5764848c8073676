"""What pretraining prints at the end of a run: the model's fill-mask guesses on held-out text.

Sentences come from the prepared data's evaluation split (documents the model never trained
on); a word of each is hidden and the model's top guesses are shown beside it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from bertjax.data import storage
from bertjax.data.sentences import split_sentences
from bertjax.encoders.family import EncoderConfig
from bertjax.inference import Model
from bertjax.text.tokenizer import Tokenizer


def held_out_texts(data_dir: str | os.PathLike, tokenizer: Tokenizer, count: int = 4) -> list[str]:
    """The first sentence of the first `count` evaluation instances of a prepared directory.

    The evaluation split holds documents the model was not trained on; each instance's
    first segment is decoded and its first sentence kept.
    """
    manifest = storage.read_manifest(data_dir)
    reader = storage.SplitReader(data_dir, "eval", manifest["splits"]["eval"]["shards"])
    texts: list[str] = []
    for i in range(len(reader)):
        if len(texts) == count:
            break
        length = int(reader.length[i])
        ids = reader.gather(np.asarray([i]), length)["input_ids"][0]  # [length]
        first_sep = int(np.argmax(ids == tokenizer.sep_id))
        sentences = split_sentences(tokenizer.decode(ids[1:first_sep], skip_special=True))
        if sentences and len(sentences[0].split()) >= 4:
            texts.append(sentences[0])
    return texts


def fill_mask_samples(
    config: EncoderConfig,
    params: Any,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    top_k: int = 3,
    mesh: jax.sharding.Mesh | None = None,
) -> list[str]:
    """Printable lines showing what a model predicts for a word hidden in each text.

    A text without [MASK] gets one whole word masked: a one-piece word of letters near the
    middle. Each line reads `<text with [MASK]>  ->  try 0.41 · for 0.12 · if 0.05  (was: with)`.
    """
    model = Model(config, params, tokenizer, mesh=mesh, progress=False)
    sequences, answers = [], []
    for ids in model.token_ids(list(texts), "text"):
        ids = [tokenizer.cls_id, *ids[: config.max_position_embeddings - 2], tokenizer.sep_id]
        answer = None
        if tokenizer.mask_id not in ids:
            position = _word_to_mask(ids, tokenizer)
            answer = _shown(tokenizer, ids[position])
            ids[position] = tokenizer.mask_id
        sequences.append(ids)
        answers.append(answer)
    lines = []
    for ids, answer, (_, scores, predicted) in zip(
        sequences, answers, model.predict_masks(sequences, top_k)
    ):
        guesses = " · ".join(
            f"{_shown(tokenizer, t)} {s:.2f}" for s, t in zip(scores[0], predicted[0])
        )
        line = f"{tokenizer.decode(ids[1:-1])}  ->  {guesses}"
        lines.append(line if answer is None else f"{line}  (was: {answer})")
    return lines


def _shown(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as text, or as its piece when that text is blank (sentencepiece's lone "▁")."""
    return tokenizer.decode([token_id]).strip() or tokenizer.id_to_piece(token_id)


def _word_to_mask(ids: list[int], tokenizer: Tokenizer) -> int:
    """The position to hide in [CLS] ... [SEP], nearest the middle among, by preference:
    one-piece words of three or more letters, other one-piece words, first pieces of words,
    any piece with text (not a lone "▁")."""
    starts = tokenizer.is_word_start

    def text(p: int) -> str:
        return tokenizer.decode([ids[p]]).strip()

    def whole_word(p: int) -> bool:
        return bool(starts[ids[p]] and starts[ids[p + 1]])  # the next piece starts a word

    inner = range(1, len(ids) - 1)
    middle = len(ids) // 2
    for wanted in (
        lambda p: whole_word(p) and len(text(p)) >= 3 and text(p).isalpha(),
        lambda p: whole_word(p) and text(p),
        lambda p: starts[ids[p]] and text(p),
        text,
        lambda p: True,
    ):
        candidates = [p for p in inner if wanted(p)]
        if candidates:
            return min(candidates, key=lambda p: abs(p - middle))
    raise ValueError("a text of [CLS] and [SEP] alone has nothing to hide")
