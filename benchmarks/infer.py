"""Inference speed of every bertjax.Model notebook method beside transformers, one table.

    python -m benchmarks.infer [--methods fill_mask,embed,search,predict,answer,generate]
        [--fill_mask 500] [--sentences 2000] [--corpus 1000] [--queries 100] [--predict 1000]
        [--answer 64] [--generate 256] [--max_new_tokens 32] [--batch_size 32] [--rounds 1]

One row per method, each on CPU, on models of random weights (timing and agreement need no
training) that both libraries read from one directory: the same weights, the same token ids.
The encoder is BERT-small-sized (L4/H512/A8; every parameter N(0, 0.05),
benchmarks.harness.fixtures.random_params)
with a sentencepiece tokenizer trained here on the demo corpus (the interpreter's
documentation), whose sentences are the inputs.

  fill_mask  one [MASK] per sentence, top 5. transformers: its fill-mask pipeline.
  embed      mean-pooled vectors. transformers: BertModel + masked mean.
  search     an embedding model (mean pooling, normalised; written by Model.save_hf as a
             sentence-transformers directory): embed a corpus and queries, exact cosine top-k
             (Model.search). transformers: BertModel + mean + normalise, then torch matmul
             and topk. Its "sorted" column is sentence-transformers (encode + util.
             semantic_search), which sorts texts by length itself.
  predict    a 3-label classification head (BertForSequenceClassification, head weights
             N(0, 0.2), its bias cancelling the mean logits of 64 of the texts, so that every
             label occurs). transformers: that class, batched, softmax.
  answer     a question-answering head (BertForQuestionAnswering, head weights N(0, 0.2));
             questions cut from a corpus sentence, contexts of 150-600 tokens of consecutive
             corpus text, so that many span several windows (max_seq_len 384, doc_stride
             128: the pipeline's defaults, which Model.answer shares). transformers 5 has no
             question-answering pipeline, so the reference is what that pipeline did: the fast
             tokenizer's overflowing windows, BertForQuestionAnswering over batches of windows
             padded to their longest, and its span decoding in numpy (softmax over [CLS] and
             the context, p(start) * p(end), spans of at most 15 tokens, best over windows,
             widened to whole words; words begin at a "▁" piece, as bertjax's, since the
             exported tokenizer.json has no pre-tokenizer whose words the pipeline could use).
  generate   a bert2bert encoder-decoder (BERT-mini-sized, L4/H256/A4, by
             --generate_preset; cross-attention at its init), greedy, --max_new_tokens.
             transformers: EncoderDecoderModel.generate(num_beams=1, do_sample=False).

transformers runs as its users run it ("dynamic padding"): batches of --batch_size in input
order, each padded to its longest input. As a reference it also runs on batches sorted by
character length ("sorted"), which is where much of bertjax's advantage comes from; ratio is
transformers (dynamic) seconds / bertjax seconds, and the promise is at least 1.5x.

Agreement is checked on the inputs that transformers tokenizes exactly as bertjax does (the
others are a unigram tokenizer's float32 ties, see bertjax/text/sentencepiece_json.py; their
count is printed): the same top-5 tokens and scores within 1e-4 (fill_mask), vectors within 1e-4
(embed), the same top-k corpus rows in the same order (search: corpus and queries are drawn
from such texts only), the same labels (predict), the same answer spans (answer), the same
generated text (generate), each with the largest score difference.

Times are medians of --rounds rounds (benchmarks.harness.timing: the sides of a method in
turn) after a warm-up: for bertjax a whole call, which compiles every bucket (that call's time,
compilation included, is the "first call" column), for torch a few batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from benchmarks.harness import fixtures, report, timing
from bertjax import Model
from bertjax.capability import ENCODER
from bertjax.data import demo_corpus_path
from bertjax.encoders.bert.config import BertConfig
from bertjax.tasks.embed import task as embed_task
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.seq2seq import hf as seq2seq_hf
from bertjax.tasks.seq2seq import model as seq2seq
from bertjax.text.training import MODEL_TYPES, TokenizerSettings, train_tokenizer

TOLERANCE = 1e-4
METHODS = ("fill_mask", "embed", "search", "predict", "answer", "generate")
PROMISE = 1.5  # transformers (dynamic padding) seconds / bertjax seconds, at least
LABELS = ("negative", "neutral", "positive")
HEAD_STD = 0.2  # task heads' weights: peaked outputs, so that rounding picks no winner
# transformers' question-answering pipeline defaults, which Model.answer shares.
MAX_SEQ_LEN, DOC_STRIDE, MAX_ANSWER_LEN = 384, 128, 15
WORD_START = "▁"  # a sentencepiece piece that begins a word
SEARCH_MAX_LENGTH = 256  # the embedding model's max_seq_length: no corpus sentence is cut


def read_sentences(work_dir: pathlib.Path) -> list[str]:
    """The demo corpus's sentences (one per line), in file order."""
    path = demo_corpus_path(work_dir / "corpus")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def masked(sentences: list[str]) -> list[str]:
    """Each sentence with its middle word replaced by [MASK]."""
    out = []
    for sentence in sentences:
        words = sentence.split()
        words[len(words) // 2] = "[MASK]"
        out.append(" ".join(words))
    return out


def same_tokens(tokenizer, hf_tokenizer, texts) -> np.ndarray:
    """[n] bool: transformers (reading the export's tokenizer.json) gives bertjax's token ids.

    Outputs are compared on these texts only; the others are unigram's float32 ties (runs of
    one repeated character, see bertjax/text/sentencepiece_json.py), where the inputs
    themselves differ.
    """
    ours = tokenizer.encode_batch(texts, special_tokens_in_text=True)
    theirs = hf_tokenizer(texts, add_special_tokens=False)["input_ids"]
    return np.asarray([a == b for a, b in zip(ours, theirs)])


# ---------------------------------------------------------------------------------------
# transformers as its users run it: batches in input order (or sorted by length), each
# padded to its longest input.


def batch_rows(lengths, batch_size: int, sort: bool):
    """Row indices of each batch: input order, or shortest first."""
    order = np.argsort(lengths, kind="stable") if sort else np.arange(len(lengths))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def char_lengths(texts) -> list[int]:
    return [len(t) for t in texts]


def torch_embed(model, tokenizer, texts, batch_size, sort, normalize=False, max_length=None):
    """Mean-pooled (optionally unit) embeddings, [n, hidden], batch by batch."""
    import torch

    out = np.zeros((len(texts), model.config.hidden_size), np.float32)
    with torch.inference_mode():
        for rows in batch_rows(char_lengths(texts), batch_size, sort):
            inputs = tokenizer(
                [texts[i] for i in rows],
                padding=True,
                truncation=True,
                max_length=max_length or model.config.max_position_embeddings,
                return_tensors="pt",
            )
            hidden = model(**inputs).last_hidden_state
            mask = inputs["attention_mask"][..., None].to(hidden.dtype)
            vectors = (hidden * mask).sum(1) / mask.sum(1)
            if normalize:
                vectors = torch.nn.functional.normalize(vectors, dim=-1)
            out[rows] = vectors.numpy()
    return out


def torch_search(model, tokenizer, queries, corpus, batch_size, top_k, max_length):
    """Per query the top_k corpus rows by cosine: (scores, rows), [queries, top_k] each."""
    import torch

    embed = lambda texts: torch_embed(  # noqa: E731
        model, tokenizer, texts, batch_size, sort=False, normalize=True, max_length=max_length
    )
    corpus_vectors = torch.from_numpy(embed(corpus))
    query_vectors = torch.from_numpy(embed(queries))
    scores, rows = torch.topk(query_vectors @ corpus_vectors.T, min(top_k, len(corpus)), dim=1)
    return scores.numpy(), rows.numpy()


def st_search(model, queries, corpus, batch_size, top_k):
    """sentence-transformers' encode (sorted by length inside) and semantic_search."""
    from sentence_transformers import util

    corpus_vectors = model.encode(corpus, batch_size=batch_size, convert_to_tensor=True)
    query_vectors = model.encode(queries, batch_size=batch_size, convert_to_tensor=True)
    return util.semantic_search(query_vectors, corpus_vectors, top_k=top_k)


def torch_predict(model, tokenizer, texts, batch_size, sort):
    """Label probabilities [n, labels] from a BertForSequenceClassification."""
    import torch

    out = np.zeros((len(texts), model.config.num_labels), np.float32)
    with torch.inference_mode():
        for rows in batch_rows(char_lengths(texts), batch_size, sort):
            inputs = tokenizer(
                [texts[i] for i in rows],
                padding=True,
                truncation=True,
                max_length=model.config.max_position_embeddings,
                return_tensors="pt",
            )
            out[rows] = torch.softmax(model(**inputs).logits, dim=-1).numpy()
    return out


def torch_answer(model, tokenizer, word_start, questions, contexts, batch_size, sort):
    """The question-answering pipeline's answers ({"score", "start", "end", "answer"}, top 1)
    from BertForQuestionAnswering over the fast tokenizer's windows; see the module doc."""
    import torch

    encoded = tokenizer(
        questions,
        contexts,
        truncation="only_second",
        max_length=MAX_SEQ_LEN,
        stride=DOC_STRIDE,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    windows = encoded["input_ids"]
    best: list[tuple[float, int, int]] = [(-1.0, 0, 0)] * len(questions)
    with torch.inference_mode():
        for rows in batch_rows([len(w) for w in windows], batch_size, sort):
            longest = max(len(windows[w]) for w in rows)
            ids = np.zeros((len(rows), longest), np.int64)
            types, mask = np.zeros_like(ids), np.zeros_like(ids)
            for k, w in enumerate(rows):
                n = len(windows[w])
                ids[k, :n] = windows[w]
                types[k, :n] = encoded["token_type_ids"][w]
                mask[k, :n] = 1
            out = model(
                input_ids=torch.from_numpy(ids),
                token_type_ids=torch.from_numpy(types),
                attention_mask=torch.from_numpy(mask),
            )
            starts, ends = out.start_logits.numpy(), out.end_logits.numpy()
            for k, w in enumerate(rows):
                n = len(windows[w])
                context = np.asarray([s == 1 for s in encoded.sequence_ids(int(w))])  # [n]
                span = _best_span(starts[k, :n], ends[k, :n], context)
                if span is None:
                    continue
                score, s, e = span
                s, e = _whole_words(windows[w], context, s, e, word_start)
                offsets = encoded["offset_mapping"][w]
                example = encoded["overflow_to_sample_mapping"][w]
                first, last = offsets[s][0], offsets[e][1]
                # A word's characters, as the pipeline's word_to_chars: a "▁" piece's offsets
                # hold the space before it.
                while first < last and contexts[example][first].isspace():
                    first += 1
                if score > best[example][0]:
                    best[example] = (score, first, last)
    return [
        {"score": score, "start": start, "end": end, "answer": context[start:end]}
        for (score, start, end), context in zip(best, contexts)
    ]


def _best_span(start, end, context) -> tuple[float, int, int] | None:
    """The pipeline's select_starts_ends + decode_spans for top_k=1 on one window."""
    kept = context.copy()
    kept[0] = True  # [CLS] takes part in the softmax
    probabilities = []
    for logits in (start, end):
        x = np.where(kept, logits, -10000.0)
        x = np.exp(x - x.max())
        probabilities.append(x / x.sum())
    p_start, p_end = probabilities
    p_start[0] = p_end[0] = 0.0
    scores = np.tril(np.triu(np.outer(p_start, p_end)), MAX_ANSWER_LEN - 1)
    s, e = np.unravel_index(int(np.argmax(scores)), scores.shape)
    if not (context[s] and context[e]):
        return None
    return float(scores[s, e]), int(s), int(e)


def _whole_words(ids, context, s, e, word_start) -> tuple[int, int]:
    """The span widened to whole words within the window's context."""
    while not word_start[ids[s]] and context[s - 1]:
        s -= 1
    while e + 1 < len(ids) and context[e + 1] and not word_start[ids[e + 1]]:
        e += 1
    return s, e


def torch_generate(model, tokenizer, texts, batch_size, sort, max_new_tokens):
    """Greedy EncoderDecoderModel.generate per batch; decoded text per source."""
    import torch

    out: list[str] = [""] * len(texts)
    with torch.inference_mode():
        for rows in batch_rows(char_lengths(texts), batch_size, sort):
            inputs = tokenizer(
                [texts[i] for i in rows],
                padding=True,
                truncation=True,
                max_length=model.config.encoder.max_position_embeddings,
                return_tensors="pt",
            )
            generated = model.generate(
                input_ids=inputs["input_ids"],
                attention_mask=inputs["attention_mask"],
                max_new_tokens=max_new_tokens,
                num_beams=1,
                do_sample=False,
            )
            for row, text in zip(rows, tokenizer.batch_decode(generated, skip_special_tokens=True)):
                out[row] = text.strip()
    return out


# ---------------------------------------------------------------------------------------
# Models with heads, from the pretraining model's weights; both libraries read them.


def with_head(hf_class, export: pathlib.Path, directory: pathlib.Path, center_on=(), **config):
    """transformers' hf_class from the export, its head drawn N(0, HEAD_STD), saved with the
    export's tokenizer files (for Model.load); returns the torch model.

    center_on: texts whose mean logits the head's bias cancels, so that a classifier on a
    random encoder (whose pooled outputs are much alike) gives every label to some texts.
    """
    import torch
    import transformers

    torch.manual_seed(0)
    model = hf_class.from_pretrained(export, **config).eval()
    head = model.qa_outputs if hasattr(model, "qa_outputs") else model.classifier
    torch.nn.init.normal_(head.weight, std=HEAD_STD)
    torch.nn.init.zeros_(head.bias)
    if center_on:
        tokenizer = transformers.AutoTokenizer.from_pretrained(export)
        with torch.inference_mode():
            logits = model(**tokenizer(list(center_on), padding=True, return_tensors="pt")).logits
            head.bias.copy_(-logits.mean(0))
    model.save_pretrained(directory)
    for path in export.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(path, directory / path.name)
    return model.eval()


def qa_examples(sentences, tokenizer, count, rng) -> tuple[list[str], list[str]]:
    """Questions (a corpus sentence's first words and "?") with contexts of 150-600 tokens
    of consecutive corpus sentences that hold it."""
    questions, contexts = [], []
    while len(questions) < count:
        target = int(rng.integers(150, 600))
        first = int(rng.integers(0, len(sentences) - 1))
        chosen, tokens = [], 0
        for sentence in sentences[first:]:
            chosen.append(sentence)
            tokens += len(tokenizer.encode(sentence))
            if tokens >= target:
                break
        source = chosen[int(rng.integers(0, len(chosen)))].split()
        if len(source) < 3:
            continue
        questions.append("What about " + " ".join(source[: min(len(source), 8)]) + "?")
        contexts.append(" ".join(chosen))
    return questions, contexts


@dataclasses.dataclass
class Bench:
    """What every method's benchmark shares: flags, inputs, the pretraining model and its
    transformers export."""

    args: argparse.Namespace
    work: pathlib.Path
    sentences: list[str]
    tokenizer: Any
    hf_tokenizer: Any
    config: BertConfig
    params: Any
    model: Model
    export: pathlib.Path

    @property
    def batch_size(self) -> int:
        return self.args.batch_size

    def draw(self, method: str, count: int, pool: list[str] | None = None) -> list[str]:
        """count texts of pool (the corpus), the same for a method whichever others run."""
        pool = self.sentences if pool is None else pool
        rng = np.random.default_rng([0, METHODS.index(method)])
        return [pool[i] for i in rng.choice(len(pool), min(count, len(pool)), replace=False)]

    def same(self, texts: list[str]) -> np.ndarray:
        return same_tokens(self.tokenizer, self.hf_tokenizer, texts)

    def measure(self, ours, theirs, theirs_warm_up, theirs_sorted):
        """bertjax: a whole warm-up call (its time is "first call"); transformers: a few
        batches; then --rounds rounds of bertjax, transformers (dynamic) and transformers
        (sorted) in turn, medians. Returns ((ours, first, theirs, sorted) seconds, our
        outputs, their outputs)."""
        outputs: dict[str, Any] = {}

        def keeping(name: str, function: Callable[[], Any]) -> Callable[[], Any]:
            return lambda: outputs.__setitem__(name, function()) or outputs[name]

        sides = {"bertjax": keeping("bertjax", ours), "transformers": keeping("theirs", theirs)}
        if self.args.sorted_reference:
            sides["sorted"] = theirs_sorted
        theirs_warm_up()
        found = timing.time_rounds(
            sides, rounds=self.args.rounds, warmup={name: int(name == "bertjax") for name in sides}
        )
        sorted_s = found["sorted"].median if "sorted" in found else None
        seconds = (found["bertjax"].median, found["bertjax"].first, found["transformers"].median)
        return (*seconds, sorted_s), outputs["bertjax"], outputs["theirs"]


@dataclasses.dataclass
class Row:
    method: str
    inputs: str
    ours: float
    first: float
    theirs: float
    sorted: float | None
    agreement: str


def bench_fill_mask(b: Bench) -> Row:
    import transformers

    words = [s for s in b.draw("fill_mask", 2 * b.args.fill_mask) if len(s.split()) > 2]
    texts = masked(words[: b.args.fill_mask])  # every text has a word to hide
    pipe = transformers.pipeline("fill-mask", model=str(b.export), device="cpu")

    def fill(texts):
        return pipe(texts, batch_size=b.batch_size, top_k=5)

    order = np.argsort(char_lengths(texts), kind="stable")
    times, ours, theirs = b.measure(
        lambda: b.model.fill_mask(texts),
        lambda: fill(texts),
        lambda: fill(texts[: 2 * b.batch_size]),
        lambda: fill([texts[i] for i in order]),
    )
    same = b.same(texts)
    differ, worst = 0, 0.0
    for a, c in (pair for pair, s in zip(zip(ours, theirs), same) if s):
        if [p["token"] for p in a] != [p["token"] for p in c]:
            differ += 1
            continue
        worst = max(worst, max(abs(p["score"] - q["score"]) for p, q in zip(a, c)))
    agreement = f"same top-5 tokens {same.sum() - differ}/{same.sum()}; max |d score| {worst:.1e}"
    return Row("fill_mask", f"{len(texts)} texts", *times, agreement)


def bench_embed(b: Bench) -> Row:
    import transformers

    texts = b.draw("embed", b.args.sentences)
    encoder = transformers.BertModel.from_pretrained(b.export, add_pooling_layer=False).eval()

    def theirs(texts, sort):
        return torch_embed(encoder, b.hf_tokenizer, texts, b.batch_size, sort)

    times, ours, their_vectors = b.measure(
        lambda: b.model.embed(texts),
        lambda: theirs(texts, False),
        lambda: theirs(texts[: 2 * b.batch_size], False),
        lambda: theirs(texts, True),
    )
    same = b.same(texts)
    error = float(np.max(np.abs(ours - their_vectors)[same]))
    agreement = f"max |d vector| {error:.1e} on {same.sum()}/{len(texts)} texts"
    return Row("embed", f"{len(texts)} texts", *times, agreement)


def bench_search(b: Bench) -> Row:
    import transformers
    from sentence_transformers import SentenceTransformer

    spec = EmbeddingSpec("mean", True, SEARCH_MAX_LENGTH)
    directory = b.work / "embedding"
    head = embed_task.head_for(spec)
    Model(b.config, {ENCODER: b.params[ENCODER]}, b.tokenizer, head=head).save_hf(directory)
    embedder = Model.load(directory, batch_size=b.batch_size, progress=False)
    st = SentenceTransformer(str(directory), device="cpu")
    encoder = transformers.BertModel.from_pretrained(directory).eval()
    # Drawn from the texts whose token ids agree: one differing corpus text would move
    # every query's ranking.
    pool = [s for s, same in zip(b.sentences, b.same(b.sentences)) if same]
    picked = b.draw("search", b.args.corpus + b.args.queries, pool)
    corpus, queries = picked[: b.args.corpus], picked[b.args.corpus :]
    k = min(b.args.top_k, len(corpus))

    def theirs(queries, corpus):
        return torch_search(
            encoder, b.hf_tokenizer, queries, corpus, b.batch_size, k, SEARCH_MAX_LENGTH
        )

    times, ours, (their_scores, their_rows) = b.measure(
        lambda: embedder.search(queries, corpus, top_k=k),
        lambda: theirs(queries, corpus),
        lambda: theirs(queries[: b.batch_size], corpus[: b.batch_size]),
        lambda: st_search(st, queries, corpus, b.batch_size, k),
    )
    our_rows = np.asarray([[h["corpus_id"] for h in hits] for hits in ours])
    our_scores = np.asarray([[h["score"] for h in hits] for hits in ours])
    in_order = int(np.all(our_rows == their_rows, axis=1).sum())
    as_sets = sum(set(a) == set(c) for a, c in zip(our_rows, their_rows))
    error = float(np.max(np.abs(our_scores - their_scores)))
    agreement = (
        f"same top-{k} rows in order {in_order}/{len(queries)} (as sets {as_sets}); "
        f"max |d cosine| {error:.1e}"
    )
    return Row("search", f"{len(queries)} q x {len(corpus)} corpus", *times, agreement)


def bench_predict(b: Bench) -> Row:
    import transformers

    texts = b.draw("predict", b.args.predict)
    directory = b.work / "classifier"
    classifier = with_head(
        transformers.BertForSequenceClassification,
        b.export,
        directory,
        center_on=texts[:64],
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    labeller = Model.load(directory, batch_size=b.batch_size, progress=False)

    def theirs(texts, sort):
        return torch_predict(classifier, b.hf_tokenizer, texts, b.batch_size, sort)

    times, ours, probabilities = b.measure(
        lambda: labeller.predict(texts),
        lambda: theirs(texts, False),
        lambda: theirs(texts[: 2 * b.batch_size], False),
        lambda: theirs(texts, True),
    )
    same = b.same(texts)
    pairs = [(a, p) for a, p, s in zip(ours, probabilities, same) if s]
    agree = sum(a["label"] == LABELS[int(p.argmax())] for a, p in pairs)
    error = max(abs(a["score"] - float(p.max())) for a, p in pairs)
    seen = len({a["label"] for a in ours})
    agreement = (
        f"same label {agree}/{len(pairs)} ({seen} labels seen); max |d probability| {error:.1e}"
    )
    return Row("predict", f"{len(texts)} texts", *times, agreement)


def bench_answer(b: Bench) -> Row:
    import transformers

    rng = np.random.default_rng([0, METHODS.index("answer")])
    questions, contexts = qa_examples(b.sentences, b.tokenizer, b.args.answer, rng)
    directory = b.work / "qa"
    reader = with_head(transformers.BertForQuestionAnswering, b.export, directory)
    answerer = Model.load(directory, batch_size=b.batch_size, progress=False)
    pieces = b.hf_tokenizer.convert_ids_to_tokens(list(range(len(b.hf_tokenizer))))
    word_start = np.asarray([p.startswith(WORD_START) for p in pieces])
    word_start[b.hf_tokenizer.all_special_ids] = True

    def theirs(questions, contexts, sort):
        return torch_answer(
            reader, b.hf_tokenizer, word_start, questions, contexts, b.batch_size, sort
        )

    times, ours, their_answers = b.measure(
        lambda: answerer.answer(questions, contexts),
        lambda: theirs(questions, contexts, False),
        lambda: theirs(questions[:4], contexts[:4], False),
        lambda: theirs(questions, contexts, True),
    )
    same = b.same(questions) & b.same(contexts)
    pairs = [(a, c) for a, c, s in zip(ours, their_answers, same) if s]
    spans = [(a["start"], a["end"]) == (c["start"], c["end"]) for a, c in pairs]
    error = max(
        (abs(a["score"] - c["score"]) for (a, c), span in zip(pairs, spans) if span), default=0.0
    )
    windows = len(
        b.hf_tokenizer(
            questions,
            contexts,
            truncation="only_second",
            max_length=MAX_SEQ_LEN,
            stride=DOC_STRIDE,
            return_overflowing_tokens=True,
        )["input_ids"]
    )
    agreement = f"same span {sum(spans)}/{len(pairs)}; max |d score| {error:.1e}"
    return Row("answer", f"{len(questions)} q, {windows} windows", *times, agreement)


def bench_generate(b: Bench) -> Row:
    import transformers

    texts = b.draw("generate", b.args.generate)
    config = BertConfig.preset(
        b.args.generate_preset, vocab_size=b.tokenizer.vocab_size, max_position_embeddings=512
    )
    s2s_config = seq2seq.Seq2SeqConfig(
        config, b.tokenizer.cls_id, b.tokenizer.sep_id, seq2seq.BERT2BERT
    )
    params = seq2seq.init_params(
        s2s_config, jax.random.key(1), pretrained=fixtures.random_params(config, seed=1)
    )
    directory = b.work / "seq2seq"
    seq2seq_hf.save_seq2seq(s2s_config, nn.meta.unbox(params), directory, b.tokenizer)
    writer = Model.load(directory, batch_size=b.batch_size, progress=False)
    reference = transformers.EncoderDecoderModel.from_pretrained(directory).eval()
    n = b.args.max_new_tokens

    def theirs(texts, sort):
        return torch_generate(reference, b.hf_tokenizer, texts, b.batch_size, sort, n)

    times, ours, their_texts = b.measure(
        lambda: writer.generate(texts, num_beams=1, max_new_tokens=n),
        lambda: theirs(texts, False),
        lambda: theirs(texts[: b.batch_size], False),
        lambda: theirs(texts, True),
    )
    same = b.same(texts)
    agree = sum(a == c for a, c, s in zip(ours, their_texts, same) if s)
    agreement = f"same text {agree}/{same.sum()} ({len(set(ours))} distinct)"
    size = f"L{config.num_layers}/H{config.hidden_size}"
    return Row("generate", f"{len(texts)} texts, {size}, {n} new", *times, agreement)


BENCHES: dict[str, Callable[[Bench], Row]] = {
    "fill_mask": bench_fill_mask,
    "embed": bench_embed,
    "search": bench_search,
    "predict": bench_predict,
    "answer": bench_answer,
    "generate": bench_generate,
}


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'method':<10} {'inputs':<28} {'bertjax s':>9} {'first s':>8} {'transf. s':>9} "
        f"{'sorted s':>8} {'ratio':>6}  agreement"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row.theirs / row.ours
        flag = " " if ratio >= PROMISE else "!"
        sorted_s = "" if row.sorted is None else f"{row.sorted:.2f}"
        print(
            f"{row.method:<10} {row.inputs:<28} {row.ours:>9.2f} {row.first:>8.2f} "
            f"{row.theirs:>9.2f} {sorted_s:>8} {ratio:>5.2f}x{flag} {row.agreement}"
        )
    print(
        "\nratio: transformers (dynamic padding) seconds / bertjax seconds; '!' marks a method "
        f"below the promised {PROMISE}x. first s: bertjax's first call, compilation included. "
        "sorted s: transformers on length-sorted batches (search: sentence-transformers' "
        "encode + semantic_search)."
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated: {METHODS}")
    parser.add_argument("--fill_mask", type=int, default=500, help="sentences to fill")
    parser.add_argument("--sentences", type=int, default=2000, help="sentences to embed")
    parser.add_argument("--corpus", type=int, default=1000, help="search: corpus sentences")
    parser.add_argument("--queries", type=int, default=100, help="search: query sentences")
    parser.add_argument("--top_k", type=int, default=10, help="search: rows per query")
    parser.add_argument("--predict", type=int, default=1000, help="sentences to classify")
    parser.add_argument("--answer", type=int, default=64, help="questions, each with a context")
    parser.add_argument("--generate", type=int, default=256, help="sources to generate from")
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--generate_preset", default="mini", help="the encoder-decoder's size")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--tokenizer", choices=MODEL_TYPES, default="unigram")
    parser.add_argument("--rounds", type=int, default=1, help="timed calls per side")
    parser.add_argument(
        "--sorted_reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time transformers on length-sorted batches",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--work_dir", default="runs/bench_infer")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        parser.error(f"--methods={','.join(args.methods)!r}: choose from {METHODS}")
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} is invalid: must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    methods = args.methods
    report.use_cpu()
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("bertjax.storage.hf").setLevel(logging.ERROR)  # "the QA head has no pooler"
    machine = report.start("infer", argv)
    print(
        f"methods {', '.join(methods)}; batch {args.batch_size}; torch with "
        f"{torch.get_num_threads()} threads"
    )
    work = pathlib.Path(args.work_dir)
    sentences = read_sentences(work)
    tokenizer = train_tokenizer(
        sentences,
        TokenizerSettings(vocab_size=args.vocab_size, model_type=args.tokenizer),
        work / "tokenizer.model",
    )
    config = BertConfig.preset(
        "small", vocab_size=tokenizer.vocab_size, max_position_embeddings=512
    )
    params = fixtures.random_params(config, seed=0)
    model = Model(config, params, tokenizer, batch_size=args.batch_size, progress=False)
    export = work / "hf"
    model.save_hf(export)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    print(
        f"encoder {config.num_layers} layers, hidden {config.hidden_size}, vocabulary "
        f"{config.vocab_size}, random weights\n"
    )
    bench = Bench(args, work, sentences, tokenizer, hf_tokenizer, config, params, model, export)
    rows = []
    for method in methods:
        print(f"timing {method} ...", flush=True)
        rows.append(BENCHES[method](bench))
    print()
    print_table(rows)
    figures = {
        row.method: dataclasses.asdict(row) | {"ratio": row.theirs / row.ours} for row in rows
    }
    report.finish("infer", args, figures, machine)
    return rows


if __name__ == "__main__":
    main()
