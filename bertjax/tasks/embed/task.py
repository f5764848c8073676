"""The `embedding` task: a bi-encoder trained so that similar texts get similar vectors.

Training files (CSV, TSV, JSON Lines, as the other tasks read them) hold per example an
anchor and a positive text, and optionally a hard negative: config.data.text_fields names
them ("anchor,positive" or "anchor,positive,negative"). With loss=cosine_regression they are
scored pairs instead: two text fields and config.data.label_field holding the gold score.

Evaluation, after each epoch:
  data.validation          scored pairs (the first two text fields and label_field): STS
                           Spearman and Pearson of cosine similarity against the scores
  embedding.queries,       optional retrieval files, TSV without a header: queries and
  embedding.corpus,        corpus are `id<TAB>text` lines, relevance `query_id<TAB>doc_id`
  embedding.relevance      lines (one per relevant document); MRR@10, nDCG@10, recall@k of
                           exact search over the corpus (split "validation_retrieval")

The best checkpoint is kept by config.metric: spearman (default), pearson, or a retrieval
metric (then the retrieval split is evaluated first and its metric decides).

Batch features, one row per example: input_ids, input_mask, segment_ids [n, seq] hold the
anchor; positive_* and negative_* the other texts; scores [n] the gold score of a pair;
weights [n]. The loss (bertjax.tasks.embed.objective) sees the embeddings of the whole global
batch as [batch, texts, hidden]: in-batch negatives take every positive of the batch as a
candidate for every anchor. A contrastive batch does not split into micro-batches, so
grad_accum_steps must be 1 with in_batch_negatives; a batch larger than memory trains
with bertjax.tasks.embed.objective.make_cached_train_step (GradCache), a library function.

The head (HeadSpec "embedding") carries the model's pooling, normalisation and longest
input (EmbeddingSpec) and the loss settings as its typed options (EmbeddingOptions), so a run
directory opens as an embedding model (bertjax.Model.load) and resuming with other settings
is refused.
Test predictions: index, cosine similarity of the pair.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.capability import HeadSpec
from bertjax.encoders.family import EncoderConfig
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError
from bertjax.finetune import data as task_data
from bertjax.finetune.layouts import UNLABELED, Layout
from bertjax.finetune.task import Examples, Task, TaskData, TaskInputs, TaskObjective
from bertjax.inference import vectors
from bertjax.nn import distillation
from bertjax.storage import fs, textfile
from bertjax.tasks.embed import metrics as embedding_eval
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed import objective as objective_lib
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.embed.objective import EmbeddingSums, LossSettings
from bertjax.text.tokenizer import Tokenizer

NAME = embedding.EMBEDDING_TASK
RETRIEVAL_SPLIT = "validation_retrieval"
RETRIEVAL_METRICS = (
    f"mrr@{embedding_eval.MRR_AT}",
    f"ndcg@{embedding_eval.NDCG_AT}",
    *(f"recall@{k}" for k in embedding_eval.RECALL_AT),
)
METRICS = (*embedding_eval.STS_METRICS, *RETRIEVAL_METRICS)
# The texts of an example after the anchor, by feature-name prefix.
POSITIVE = "positive_"
NEGATIVE = "negative_"


@dataclasses.dataclass(frozen=True)
class EmbeddingSettings:
    """config.embedding, validated: the model's pooling and the loss, the retrieval files."""

    pooling: str = embedding.MEAN
    normalize: bool = False
    loss: LossSettings = LossSettings()
    queries: str = ""
    corpus: str = ""
    relevance: str = ""

    @property
    def retrieval(self) -> bool:
        return bool(self.queries)


def read_settings(config) -> EmbeddingSettings:
    """Reads config.embedding (see configs/finetune.py); one-line ConfigErrors."""
    e = config.embedding
    try:
        loss = LossSettings(
            loss=e.loss, scale=e.scale, symmetric=e.symmetric, score_max=e.score_max
        )
        EmbeddingSpec(pooling=e.pooling, normalize=e.normalize)
    except ValueError as err:
        raise ConfigError(f"config.embedding: {err}") from None
    files = {name: e[name] for name in ("queries", "corpus", "relevance")}
    given = [name for name, path in files.items() if path]
    if given and len(given) != 3:
        raise ConfigError(
            f"config.embedding: retrieval evaluation needs queries, corpus and relevance; "
            f"only {given} are set"
        )
    for name, path in files.items():
        try:
            missing = bool(path) and fs.kind(path) != "file"
        except fs.StorageError as err:
            raise ConfigError(f"config.embedding.{name}: {err}") from None
        if missing:
            raise ConfigError(f"config.embedding.{name}={path!r}: no such file")
    fields = [f for f in config.data.text_fields.split(",") if f.strip()]
    counts = (2,) if loss.loss == objective_lib.COSINE_REGRESSION else (2, 3)
    if len(fields) not in counts:
        raise ConfigError(
            f"config.data.text_fields={config.data.text_fields!r}: the embedding task reads "
            + (
                "two (scored pairs: text_a,text_b)"
                if len(counts) == 1
                else "two or three fields (anchor,positive[,negative])"
            )
        )
    if not config.data.label_field:
        raise ConfigError(
            "config.data.label_field is empty: it names the gold score of the validation "
            "file's pairs (and of the training pairs with loss=cosine_regression)"
        )
    if loss.loss == objective_lib.IN_BATCH_NEGATIVES and config.grad_accum_steps != 1:
        raise ConfigError(
            f"config.grad_accum_steps={config.grad_accum_steps}: in_batch_negatives needs "
            "the whole batch in one step (each anchor's negatives are the batch's other "
            "positives); use 1"
        )
    metric = config.metric
    if metric in RETRIEVAL_METRICS and not given:
        raise ConfigError(
            f"config.metric={metric!r} is a retrieval metric: set config.embedding.queries, "
            "corpus and relevance"
        )
    return EmbeddingSettings(e.pooling, bool(e.normalize), loss, *files.values())


# ----------------------------------------------------------------------------- the head


@dataclasses.dataclass(frozen=True)
class EmbeddingOptions:
    """An embedding head's options: how a text becomes a vector, and what trained it."""

    spec: EmbeddingSpec = EmbeddingSpec()
    loss: LossSettings = LossSettings()

    @classmethod
    def from_dict(cls, d: dict) -> EmbeddingOptions:
        return cls(EmbeddingSpec(**d["spec"]), LossSettings(**d["loss"]))

    @classmethod
    def from_labels(cls, labels: tuple[str, ...]) -> EmbeddingOptions:
        """The options of a head written before they were typed: name=value labels."""
        items = dict(label.split("=", 1) for label in labels if "=" in label)
        loss = LossSettings()
        if "loss" in items:
            loss = LossSettings(
                loss=items["loss"],
                scale=float(items["scale"]),
                symmetric=items["symmetric"] == "True",
                score_max=float(items["score_max"]),
            )
        return cls(EmbeddingSpec.from_labels(labels), loss)


def head_for(spec: EmbeddingSpec, loss: LossSettings | None = None) -> HeadSpec:
    """The head of an embedding model: no labels, its spec and loss as options."""
    return HeadSpec(NAME, (), EmbeddingOptions(spec, loss or LossSettings()))


def loss_of(head: HeadSpec) -> LossSettings:
    """The loss settings an embedding head carries."""
    return head.options.loss


# ----------------------------------------------------------------------------- reading


def _encode_texts(
    tokenizer: Tokenizer, texts: list[str], max_seq_length: int, prefix: str = ""
) -> tuple[dict[str, np.ndarray], int]:
    """[CLS] text [SEP] rows, as sentence-transformers cuts them; the count of full rows."""
    sequences = embedding.token_ids(tokenizer, texts, max_seq_length)
    padded = embedding.pad_inputs(sequences, max_seq_length)
    full = sum(len(s) == max_seq_length for s in sequences)
    return {prefix + name: array for name, array in padded.items()}, full


def _pair_examples(
    split: task_data.Split, tokenizer: Tokenizer, max_seq_length: int, texts: int
) -> Examples:
    features: dict[str, np.ndarray] = {}
    full = 0
    for k, prefix in enumerate(("", POSITIVE, NEGATIVE)[:texts]):
        part, cut = _encode_texts(
            tokenizer, [r.texts[k] for r in split.records], max_seq_length, prefix
        )
        features.update(part)
        full += cut
    labels = [r.label for r in split.records]
    features["scores"] = np.asarray([0.0 if x is None else x for x in labels], np.float32)  # [n]
    return Examples(
        split.name,
        split.path,
        features,
        [r.index for r in split.records],
        split.has_labels,
        full_rows=full,
    )


@dataclasses.dataclass(frozen=True)
class RetrievalExamples(Examples):
    """Queries then corpus texts, one row each; which corpus rows each query should find."""

    queries: int = 0  # the first `queries` rows are queries, the rest the corpus
    relevant: tuple[frozenset[int], ...] = ()  # per query: corpus rows (0-based)


def _tsv_lines(path: str, what: str):
    """(line number, fields) of each line with text; `textfile` names the file and line of
    a byte that does not decode, and only a line feed ends a line (U+2028 is text)."""
    try:
        for line, row in enumerate(textfile.read_lines(path), start=1):
            row = row.rstrip("\n").rstrip("\r")
            if row.strip():
                yield line, row.split("\t")
    except textfile.TextFileError as err:
        raise task_data.TaskDataError(f"{err} ({what})") from None


def _read_id_text(path: str, what: str) -> tuple[list[str], list[str]]:
    ids, texts = [], []
    first_line: dict[str, int] = {}
    for line, parts in _tsv_lines(path, what):
        if len(parts) < 2:
            raise task_data.TaskDataError(f"{path} line {line}: expected `id<TAB>text` ({what})")
        index, text = parts[0].strip(), "\t".join(parts[1:])
        if not index:
            raise task_data.TaskDataError(f"{path} line {line}: the id is empty ({what})")
        if not text.strip():
            raise task_data.TaskDataError(
                f"{path} line {line}: the text of id {index!r} is empty ({what})"
            )
        if index in first_line:
            raise task_data.TaskDataError(
                f"{path} line {line}: id {index!r} was already used at line "
                f"{first_line[index]} ({what} ids must be unique)"
            )
        first_line[index] = line
        ids.append(index)
        texts.append(text)
    if not ids:
        raise task_data.TaskDataError(f"{path} holds no {what}")
    return ids, texts


def read_retrieval(
    queries: str, corpus: str, relevance: str, tokenizer: Tokenizer, max_seq_length: int
) -> RetrievalExamples:
    """The retrieval files (module docstring) as one split of query and corpus rows."""
    query_ids, query_texts = _read_id_text(queries, "queries")
    doc_ids, doc_texts = _read_id_text(corpus, "corpus documents")
    query_row = {q: i for i, q in enumerate(query_ids)}
    doc_row = {d: i for i, d in enumerate(doc_ids)}
    relevant: list[set[int]] = [set() for _ in query_ids]
    for line, parts in _tsv_lines(relevance, "relevance"):
        if len(parts) < 2:
            raise task_data.TaskDataError(
                f"{relevance} line {line}: expected `query_id<TAB>doc_id`"
            )
        q, d = parts[0].strip(), parts[1].strip()
        if q not in query_row or d not in doc_row:
            if q not in query_row:
                missing, where = f"query {q!r}", queries
            else:
                missing, where = f"document {d!r}", corpus
            raise task_data.TaskDataError(f"{relevance} line {line}: {missing} is not in {where}")
        relevant[query_row[q]].add(doc_row[d])
    if not any(relevant):
        raise task_data.TaskDataError(f"{relevance} holds no relevance pair")
    features, full = _encode_texts(tokenizer, query_texts + doc_texts, max_seq_length)
    return RetrievalExamples(
        RETRIEVAL_SPLIT,
        relevance,
        features,
        query_ids + doc_ids,
        True,
        full_rows=full,
        queries=len(query_ids),
        relevant=tuple(frozenset(r) for r in relevant),
    )


# ----------------------------------------------------------------------------- the objective


class EmbeddingTaskObjective(TaskObjective):
    """The embedding loss over a flat batch (anchor, positive_*, negative_* features)."""

    eval_outputs = True

    def __init__(self, model_config: EncoderConfig, head: HeadSpec):
        self.spec = head.options.spec
        self.settings = loss_of(head)
        self.model = embedding.make_model(model_config, self.spec)
        # Under jit the batch arrays are global: every anchor meets every positive of the
        # global batch, the compiler gathering across devices (exact, as the tests check).
        self.inner = objective_lib.EmbeddingObjective(self.model, self.settings)

    def init_params(self, rng: jax.Array) -> Any:
        return embedding.init_params(self.model, rng)

    def _embed(self, params, batch, prefix, *, rng, deterministic, packed_length=None):
        return self.model.apply(
            {"params": params},
            batch[prefix + "input_ids"],
            batch[prefix + "segment_ids"],
            batch[prefix + "input_mask"],
            deterministic=deterministic,
            packed_length=packed_length,
            rngs={"dropout": rng} if rng is not None else {},
        )  # [b, h]

    def embeddings(self, params, batch, *, rng, deterministic, packed_length=None) -> jax.Array:
        """[batch, texts, hidden]: anchor, positive (and negative) of each row."""
        prefixes = [p for p in ("", POSITIVE, NEGATIVE) if p + "input_ids" in batch]
        vectors = []
        for k, prefix in enumerate(prefixes):
            key = None if rng is None else jax.random.fold_in(rng, k)
            # The train step checked the anchors' tokens against packed_length only.
            length = packed_length if prefix == "" else None
            vectors.append(
                self._embed(
                    params,
                    batch,
                    prefix,
                    rng=key,
                    deterministic=deterministic,
                    packed_length=length,
                )
            )
        return jnp.stack(vectors, axis=1)  # [b, t, h]

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> EmbeddingSums:
        vectors = self.embeddings(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        return self.inner.sums_of(vectors, batch)

    def distill_outputs(self, params, batch, *, rng, deterministic, packed_length=None):
        vectors = self.embeddings(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        return {"embeddings": vectors}  # [b, t, h]

    def sums_of_outputs(self, outputs, batch) -> EmbeddingSums:
        return self.inner.sums_of(outputs["embeddings"], batch)

    def soft_sums(self, student, teacher, batch, temperature):
        """Each row's mean squared error to the teacher's embeddings of its texts (over texts
        and coordinates, as sentence-transformers' MSELoss distils a model)."""
        errors = distillation.squared_error(student["embeddings"], teacher["embeddings"])
        per_row = jnp.mean(errors, axis=-1) / student["embeddings"].shape[-1]  # [b]
        return jnp.sum(per_row), self.soft_denominator(batch)

    def soft_denominator(self, batch) -> jax.Array:
        return jnp.asarray(batch["input_ids"].shape[0], jnp.float32)

    def evaluate(self, params, batch):
        if POSITIVE + "input_ids" not in batch:  # retrieval: one text per row, no loss
            vectors = self._embed(params, batch, "", rng=None, deterministic=True)
            return self.zero_sums(), {"anchor": vectors}
        vectors = self.embeddings(params, batch, rng=None, deterministic=True)  # [b, t, h]
        return self.inner.sums_of(vectors, batch), {
            "anchor": vectors[:, 0],
            "positive": vectors[:, 1],
        }

    def zero_sums(self) -> EmbeddingSums:
        return self.inner.zero_sums()

    def denominators(self, batch) -> jax.Array:
        return self.inner.denominators(batch)

    def loss(self, sums, denominators) -> jax.Array:
        return self.inner.loss(sums, denominators)

    def metrics(self, sums, prefix: str) -> dict[str, jax.Array]:
        return self.inner.metrics(sums, prefix)


# ----------------------------------------------------------------------------- the task


@dataclasses.dataclass(frozen=True)
class EmbeddingTask(Task):
    """The embedding task (a bertjax.finetune.task.Task)."""

    name: str = NAME
    metrics: tuple[str, ...] = METRICS
    default_metric: str = "spearman"
    conll_files: bool = False
    label_separator: bool = False
    distills: bool = True

    def read_options(self, config) -> TaskInputs:
        """config.embedding, validated, as FinetuneDataSettings.task_options."""
        return TaskInputs((("embedding", read_settings(config)), ("metric", config.metric)))

    def read(self, data, tokenizer: Tokenizer) -> TaskData:
        settings: EmbeddingSettings = dict(data.task_options)["embedding"]
        spec = EmbeddingSpec(settings.pooling, settings.normalize, data.max_seq_length)
        layouts = dict(data.layouts)
        train_layout: Layout = layouts[data.train]
        regression = settings.loss.loss == objective_lib.COSINE_REGRESSION
        if not regression:
            train_layout = dataclasses.replace(train_layout, label_field=None)
        # Scores are floats: read as a regression task's labels are.
        train = task_data.read_split(
            data.train, train_layout, "train", regression, task_data.NUMBER_LABEL
        )
        texts = len(train_layout.text_fields)
        notes = []
        validation = []
        for name, path in data.validation:
            layout = layouts[path]
            layout = dataclasses.replace(layout, text_fields=layout.text_fields[:2])
            split = task_data.read_split(path, layout, name, True, task_data.NUMBER_LABEL)
            validation.append(_pair_examples(split, tokenizer, data.max_seq_length, 2))
        if settings.retrieval:
            retrieval = read_retrieval(
                settings.queries,
                settings.corpus,
                settings.relevance,
                tokenizer,
                data.max_seq_length,
            )
            # The metric that picks the best epoch is read from the first split.
            metric = dict(data.task_options).get("metric", "")
            if metric in RETRIEVAL_METRICS:
                validation.insert(0, retrieval)
            else:
                validation.append(retrieval)
        test = []
        for name, path in data.test:
            layout = layouts[path]
            layout = dataclasses.replace(layout, text_fields=layout.text_fields[:2])
            split = task_data.read_split(path, layout, name, False, task_data.NUMBER_LABEL)
            test.append(_pair_examples(split, tokenizer, data.max_seq_length, 2))
        examples = _pair_examples(train, tokenizer, data.max_seq_length, texts)
        if examples.full_rows:
            notes.append(
                f"{data.train}: {examples.full_rows} text(s) fill max_seq_length="
                f"{data.max_seq_length} (longer ones were cut)"
            )
        unlabeled = None
        if data.unlabeled:  # distillation's: the training file's texts, no scores
            layout = dataclasses.replace(layouts[data.unlabeled], label_field=None)
            split = task_data.read_split(
                data.unlabeled, layout, UNLABELED, False, task_data.NUMBER_LABEL
            )
            unlabeled = _pair_examples(split, tokenizer, data.max_seq_length, texts)
        return TaskData(
            head_for(spec, settings.loss), examples, validation, test, notes, unlabeled=unlabeled
        )

    def check(self, data: TaskData, metric: str) -> None:
        if metric in RETRIEVAL_METRICS and not isinstance(data.validation[0], RetrievalExamples):
            raise ConfigError(
                f"config.metric={metric!r} is a retrieval metric: set config.embedding.queries, "
                "corpus and relevance"
            )

    def objective(self, model_config: EncoderConfig, head: HeadSpec) -> EmbeddingTaskObjective:
        return EmbeddingTaskObjective(model_config, head)

    def scores(
        self, head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
    ) -> dict[str, float]:
        if isinstance(examples, RetrievalExamples):
            vectors = outputs["anchor"]
            n = examples.queries
            return embedding_eval.retrieval_scores(
                vectors[:n], vectors[n:], {q: rows for q, rows in enumerate(examples.relevant)}
            )
        return embedding_eval.sts_scores(
            outputs["anchor"], outputs["positive"], examples.features["scores"]
        )

    def write_predictions(
        self,
        path: fs.AnyPath,
        head: HeadSpec,
        examples: Examples,
        outputs: dict[str, np.ndarray],
    ) -> None:
        a = vectors.l2_normalize(jnp.asarray(outputs["anchor"]))  # [n, h]
        b = vectors.l2_normalize(jnp.asarray(outputs["positive"]))  # [n, h]
        cosine = np.asarray(jnp.sum(a * b, axis=-1))  # [n]
        lines = ["index\tcosine"]
        lines += [f"{i}\t{c:.6f}" for i, c in zip(examples.indices, cosine)]
        rundir.write_text(path, "\n".join(lines) + "\n")
