"""`Model.answer`: extractive answers as transformers' question-answering pipeline gives them.

Each question and its context become google's windows ([CLS] question [SEP] window [SEP]),
run through the Model's one batching path (length buckets, batch_size, mesh); the pipeline's
span scoring picks the answers from every window's start and end logits.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence

import jax
import numpy as np

from bertjax.encoders.family import EncoderConfig
from bertjax.inference import InferenceError, Model, as_bool, as_int, as_texts
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad

# The shortest window: [CLS], a question token, [SEP], a context token, [SEP].
MIN_SEQ_LEN = 5


def answer(
    model: Model,
    question: str | Sequence[str],
    context: str | Sequence[str],
    *,
    top_k: int = 1,
    max_seq_len: int = 384,
    doc_stride: int = 128,
    max_question_len: int = 64,
    max_answer_len: int = 15,
    handle_impossible_answer: bool = False,
    align_to_words: bool = True,
) -> dict | list:
    """Answers as transformers' question-answering pipeline gives them.

    Each answer is {"score", "start", "end", "answer"}: start and end are character offsets
    into the context, answer is context[start:end], score is p(start) * p(end) with each
    probability a softmax over the window's context tokens and [CLS]. A long context is split
    into windows that overlap by `doc_stride` tokens (the pipeline's meaning of the word);
    the top_k spans over all windows are returned, best first, one per character span.
    With handle_impossible_answer the empty answer (score: the lowest [CLS] start x end
    probability over the windows) competes too. With align_to_words (the pipeline's default)
    an answer starting or ending inside a word takes the whole word. One question gives a
    dict (top_k=1) or a list; a list of questions (paired with a context or a list of
    contexts) gives a list of those.
    """
    config, tokenizer = model.config, model.tokenizer
    # Every argument is checked before the tokenizer or a compiled function sees it.
    top_k = as_int(top_k, "top_k", 1)
    max_answer_len = as_int(max_answer_len, "max_answer_len", 1)
    # [CLS], a question token, two [SEP] and a context token; longer than the model's
    # positions is cut to them (the default 384 serves every model).
    max_seq_len = as_int(max_seq_len, "max_seq_len", MIN_SEQ_LEN)
    max_question_len = as_int(max_question_len, "max_question_len", 1)
    doc_stride = as_int(
        doc_stride, "doc_stride", 1, why="tokens of context that consecutive windows share"
    )
    handle_impossible_answer = as_bool(handle_impossible_answer, "handle_impossible_answer")
    align_to_words = as_bool(align_to_words, "align_to_words")
    single = isinstance(question, str)
    questions = as_texts(question, "question", need_words=True)
    contexts = as_texts(context, "context", need_words=True)
    if isinstance(context, str):
        contexts = contexts * len(questions)
    elif len(contexts) != len(questions):
        raise InferenceError(
            f"answer: {len(questions)} question(s) but {len(contexts)} context(s); give one "
            "context for all or one per question"
        )
    max_seq_length = min(max_seq_len, config.max_position_embeddings)
    settings = squad.QASettings(
        max_seq_length=max_seq_length,
        doc_stride=1,  # unused: each question's step below leaves doc_stride tokens of overlap
        max_query_length=max(min(max_question_len, max_seq_length - 4), 1),
    )
    examples = [
        squad.QAExample(id=str(k), question=q, context=c, answers=())
        for k, (q, c) in enumerate(zip(questions, contexts))
    ]
    rows: list[squad.Window] = []
    for k, example in enumerate(examples):
        question_ids = tokenizer.encode(example.question, special_tokens_in_text=True)
        question_ids = question_ids[: settings.max_query_length]
        if not question_ids:
            raise InferenceError(_no_tokens("question", k, len(examples), example.question))
        room = settings.max_seq_length - len(question_ids) - 3
        step = max(room - min(doc_stride, room // 2), 1)
        windows = squad.windows([example], tokenizer, settings, step)[0]
        if not len(windows[0].offsets):
            count = 1 if isinstance(context, str) else len(examples)
            raise InferenceError(_no_tokens("context", k, count, example.context))
        rows += [dataclasses.replace(w, example_index=k) for w in windows]
    features = squad.rows_to_features(rows, settings.max_seq_length)
    starts, ends = window_logits(model, features)
    results = []
    for k, example in enumerate(examples):
        results.append(
            _pipeline_answers(
                example.context,
                features,
                np.flatnonzero(features.example_index == k),
                starts,
                ends,
                top_k,
                max_answer_len,
                handle_impossible_answer,
                tokenizer.is_word_start if align_to_words else None,
            )
        )
    results = [r[0] if top_k == 1 else r for r in results]
    return results[0] if single else results


def _no_tokens(name: str, index: int, count: int, text: str) -> str:
    what = name if count == 1 else f"{name}[{index}]"
    return (
        f"{what}={text[:40]!r} has no tokens: the tokenizer drops all of it (control "
        "characters only?)"
    )


def _pipeline_answers(
    context: str,
    features: squad.QAFeatures,
    rows: Iterable[int],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    top_k: int,
    max_answer_len: int,
    handle_impossible_answer: bool,
    is_word_start: np.ndarray | None,
) -> list[dict]:
    found: dict[tuple[int, int], float] = {}
    min_null = math.inf
    for row in rows:
        allowed = features.offsets[row, :, 0] != squad.NO_OFFSET  # [seq]
        kept = allowed.copy()
        kept[0] = True  # [CLS] takes part in the softmax, as in the pipeline
        probabilities = []
        for logits_row in (start_logits[row], end_logits[row]):
            x = np.where(kept, logits_row.astype(np.float64), -10000.0)
            x = np.exp(x - x.max())
            probabilities.append(x / x.sum())
        p_start, p_end = probabilities
        min_null = min(min_null, float(p_start[0] * p_end[0]))
        scores = np.triu(np.outer(p_start * allowed, p_end * allowed))  # [seq, seq]
        scores = np.tril(scores, max_answer_len - 1)  # spans of at most max_answer_len tokens
        flat = scores.ravel()
        best = np.argsort(-flat, kind="stable")[:top_k]
        for index in best:
            if flat[index] <= 0.0:
                break
            s, e = np.unravel_index(index, scores.shape)
            if is_word_start is not None:
                s, e = _whole_words(features, row, int(s), int(e), is_word_start)
            span = (int(features.offsets[row, s, 0]), int(features.offsets[row, e, 1]))
            found[span] = max(found.get(span, 0.0), float(flat[index]))
    answers = [
        {"score": score, "start": start, "end": end, "answer": context[start:end]}
        for (start, end), score in found.items()
    ]
    if handle_impossible_answer and math.isfinite(min_null):
        answers.append({"score": min_null, "start": 0, "end": 0, "answer": ""})
    answers.sort(key=lambda a: a["score"], reverse=True)
    if not answers:
        answers = [{"score": 0.0, "start": 0, "end": 0, "answer": ""}]
    return answers[:top_k]


def _whole_words(
    features: squad.QAFeatures, row: int, start: int, end: int, is_word_start: np.ndarray
) -> tuple[int, int]:
    """The span widened to the first token of its first word and the last of its last word
    (within the window's context)."""
    ids, offsets = features.input_ids[row], features.offsets[row]
    while not is_word_start[ids[start]] and offsets[start - 1, 0] != squad.NO_OFFSET:
        start -= 1
    last = len(ids) - 1
    while end < last and offsets[end + 1, 0] != squad.NO_OFFSET and not is_word_start[ids[end + 1]]:
        end += 1
    return start, end


def window_logits(model: Model, features: squad.QAFeatures) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits [n, seq] of every window; positions past a batch's bucket (padding)
    get a logit no softmax picks."""
    lengths = features.input_mask.sum(axis=1)
    rows = [
        {"input_ids": features.input_ids[r, :n], "segment_ids": features.segment_ids[r, :n]}
        for r, n in enumerate(lengths)
    ]
    starts = np.full(features.input_ids.shape, -1e9, np.float32)  # [n, seq]
    ends = np.full(features.input_ids.shape, -1e9, np.float32)
    function = functools.partial(_logits, config=model.run_config)
    # Windows are at most the features' width: their buckets stop there (384, not 512).
    for done, (start, end) in model.batched(function, rows, features.input_ids.shape[1]):
        width = min(start.shape[1], starts.shape[1])
        starts[done, :width] = start[:, :width]
        ends[done, :width] = end[:, :width]
    return starts, ends


@functools.partial(jax.jit, static_argnames=("config", "packed_length"))
def _logits(params, batch, *, config: EncoderConfig, packed_length: int | None):
    return qa_model.QuestionAnswering(config).apply(
        {"params": params},
        batch["input_ids"],
        batch["segment_ids"],
        batch["input_mask"],
        packed_length=packed_length,
    )  # [b, s] each
