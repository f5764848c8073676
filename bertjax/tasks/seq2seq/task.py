"""The seq2seq task: a BERT encoder-decoder (bertjax.tasks.seq2seq.model) fine-tuned on text pairs.

    python finetune.py --workdir runs/s2s --config.task=seq2seq --config.init_from=runs/tiny \
        --config.data.train=train.tsv --config.data.validation=dev.tsv \
        --config.data.source_field=source --config.data.target_field=target

Files are CSV, TSV or JSON Lines with a source and a target text per example (the test file
may lack targets). Sources are encoded as [CLS] source [SEP], cut to max_source_length;
targets as target [SEP], cut to max_target_length. Training is teacher-forced cross-entropy
over target tokens (optional label smoothing); each epoch's evaluation generates (greedy, or
beam search with config.seq2seq.num_beams) and scores with config.metric: bleu (sacrebleu,
13a), rouge1 / rouge2 / rougeL (rouge-score, stemmed F1) or exact_match (token ids).
Predictions files hold one line per example: index, generated text.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError, require
from bertjax.finetune import data as task_data
from bertjax.finetune.layouts import TRAIN
from bertjax.finetune.settings import FinetuneDataSettings
from bertjax.finetune.task import Examples, Task, TaskData, TaskInputs, TaskObjective
from bertjax.nn.heads import HeadSums
from bertjax.storage import fs
from bertjax.tasks.seq2seq import decoding
from bertjax.tasks.seq2seq import metrics as text_metrics
from bertjax.tasks.seq2seq import model as s2s
from bertjax.tasks.seq2seq.options import TaskOptions, task_init
from bertjax.text import features as features_lib
from bertjax.text.tokenizer import Tokenizer

METRICS = ("bleu", "rouge1", "rouge2", "rougeL", "exact_match")


@dataclasses.dataclass(frozen=True)
class Seq2SeqData:
    """The task's own settings (config.data.source_field ... and config.seq2seq)."""

    source_field: str
    target_field: str
    max_seq_length: int  # the source's positions: data.max_source_length (or max_seq_length)
    max_target_length: int
    init: str
    label_smoothing: float
    generation: decoding.GenerationSettings
    # The config field max_seq_length was read from, for messages.
    max_seq_length_field: str = "data.max_seq_length"

    @property
    def fields(self) -> tuple[tuple[str, ...], str]:
        """(text fields, label field) of the files' layout."""
        return (self.source_field,), self.target_field

    def options(self, tokenizer: Tokenizer) -> TaskOptions:
        return TaskOptions(
            decoder_start_id=tokenizer.cls_id,
            eos_id=tokenizer.sep_id,
            init=self.init,
            label_smoothing=self.label_smoothing,
            max_target_length=self.max_target_length,
            generation=self.generation,
        )


@dataclasses.dataclass(frozen=True)
class Seq2SeqExamples(Examples):
    """Examples whose labels are texts: the targets as written, and the tokenizer that turns
    generated ids back into text."""

    targets: tuple[str, ...] | None = None
    tokenizer: Any = None


def _int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def read_options(config) -> Seq2SeqData:
    """config.data's seq2seq fields and config.seq2seq, checked (one-line ConfigErrors)."""
    d, s = config.data, config.seq2seq
    for field in ("source_field", "target_field"):
        value = d[field]
        require(
            config,
            isinstance(value, str) and bool(value.strip()),
            f"data.{field}",
            (
                "must name the field (column) of the files that holds the "
                + ("source text" if field == "source_field" else "target text")
            ),
        )
    require(
        config,
        d.source_field != d.target_field,
        "data.target_field",
        "must differ from data.source_field",
    )
    require(
        config,
        d.max_source_length == 0 or _int(d.max_source_length, 3),
        "data.max_source_length",
        "must be an int >= 3 ([CLS], a token, [SEP]) or 0 (data.max_seq_length)",
    )
    require(
        config,
        _int(d.max_target_length, 2),
        "data.max_target_length",
        "must be an int >= 2 (a token and [SEP])",
    )
    require(config, s.init in s2s.INITS, "seq2seq.init", f"must be one of {s2s.INITS}")
    smoothing = s.label_smoothing
    require(
        config,
        isinstance(smoothing, (int, float))
        and not isinstance(smoothing, bool)
        and 0.0 <= smoothing < 1.0,
        "seq2seq.label_smoothing",
        "must be in [0, 1)",
    )
    require(config, _int(s.num_beams, 1), "seq2seq.num_beams", "must be an int >= 1 (1: greedy)")
    require(
        config,
        _int(s.max_new_tokens, 0),
        "seq2seq.max_new_tokens",
        "must be an int >= 0 (0: data.max_target_length)",
    )
    require(
        config,
        _int(s.no_repeat_ngram_size, 0),
        "seq2seq.no_repeat_ngram_size",
        "must be an int >= 0 (0: off)",
    )
    require(
        config,
        isinstance(s.length_penalty, (int, float)) and not isinstance(s.length_penalty, bool),
        "seq2seq.length_penalty",
        "must be a number (1.0: transformers' default)",
    )
    generation = decoding.GenerationSettings(
        max_new_tokens=s.max_new_tokens or d.max_target_length,
        num_beams=s.num_beams,
        length_penalty=float(s.length_penalty),
        no_repeat_ngram_size=s.no_repeat_ngram_size,
    )
    return Seq2SeqData(
        source_field=d.source_field.strip(),
        target_field=d.target_field.strip(),
        max_seq_length=d.max_source_length or d.max_seq_length,
        max_seq_length_field="data.max_source_length"
        if d.max_source_length
        else "data.max_seq_length",
        max_target_length=d.max_target_length,
        init=s.init,
        label_smoothing=float(smoothing),
        generation=generation,
    )


# ----------------------------------------------------------------------------- the objective


class Seq2SeqObjective(TaskObjective):
    """Teacher-forced cross-entropy over target tokens; evaluation also generates."""

    eval_outputs = True

    def __init__(self, model_config: BertConfig, head: HeadSpec):
        self.options = TaskOptions.from_head(head)
        self.config = self.options.config(model_config)
        self._init = task_init(model_config, head)
        positions = model_config.max_position_embeddings
        target, new = self.options.max_target_length, self.options.generation.max_new_tokens
        if target > positions:
            raise ConfigError(
                f"config.data.max_target_length={target}: exceeds the decoder's "
                f"max_position_embeddings={positions}"
            )
        if new + 1 > positions:
            raise ConfigError(
                f"config.seq2seq.max_new_tokens={new}: needs {new + 1} decoder positions (the "
                f"start token first), more than max_position_embeddings={positions}"
            )

    def init_params(self, rng: jax.Array) -> Any:
        return self._init(rng)

    def sums(self, params, batch, *, rng, deterministic: bool, packed_length=None) -> HeadSums:
        logits = s2s.Seq2SeqModel(self.config).apply(
            {"params": s2s.full_params(self.config, params)},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["decoder_input_ids"],
            deterministic=deterministic,
            packed_length=packed_length,
            rngs={"dropout": rng} if rng is not None else {},
        )  # [b, s, v]
        mask = batch["target_mask"] * batch["weights"][:, None]  # [b, s]
        return s2s.loss_sums(logits, batch["target_ids"], mask, self.options.label_smoothing)

    def evaluate(self, params, batch):
        sums = self.sums(params, batch, rng=None, deterministic=True)
        generated = decoding.generate(
            self.config,
            params,
            batch["input_ids"],
            batch["input_mask"],
            batch["segment_ids"],
            settings=self.options.generation,
        )
        return sums, {"tokens": generated.tokens, "lengths": generated.lengths}

    def zero_sums(self) -> HeadSums:
        return HeadSums.zeros()

    def denominators(self, batch) -> jax.Array:
        return jnp.sum(batch["target_mask"] * batch["weights"][:, None]).astype(jnp.float32)

    def loss(self, sums: HeadSums, denominators: jax.Array) -> jax.Array:
        return sums.loss / jnp.maximum(denominators, 1.0)

    def metrics(self, sums: HeadSums, prefix: str) -> dict[str, jax.Array]:
        count = jnp.maximum(sums.count, 1.0)
        return {
            f"{prefix}/loss": sums.loss / count,
            f"{prefix}/token_accuracy": sums.correct / count,
        }


# ----------------------------------------------------------------------------- data


def encode(
    split: task_data.Split, data: Seq2SeqData, options: TaskOptions, tokenizer: Tokenizer
) -> tuple[Seq2SeqExamples, list[str]]:
    """A split's sources and targets as arrays, and notes on what was cut."""
    texts = [record.texts[0] for record in split.records]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", features_lib.TruncationWarning)
        try:
            rows = features_lib.inputs(tokenizer, texts, None, data.max_seq_length)
        except features_lib.InputError as err:
            raise task_data.record_fault(split, err, field=data.source_field) from None
    features = features_lib.stack(rows, width=data.max_seq_length)
    notes = []
    cut_sources = sum(len(r.ids) == data.max_seq_length for r in rows)
    if caught:
        notes.append(
            f"{split.path}: some sources are longer than {data.max_seq_length_field}="
            f"{data.max_seq_length} tokens and were cut"
        )
    targets = None
    if split.has_labels:
        targets = tuple(record.label for record in split.records)
        ids = tokenizer.encode_batch(list(targets))
        for record, target_ids in zip(split.records, ids):
            if not target_ids:  # nothing to learn but [SEP]
                raise task_data.TaskDataError(
                    f"{split.path} line {record.line}: field {data.target_field!r} "
                    f"({record.label[:40]!r}) has no tokens: the tokenizer drops all of it "
                    "(control characters only?)"
                )
        cut = sum(len(t) > data.max_target_length - 1 for t in ids)
        if cut:
            notes.append(
                f"{split.path}: {cut} of {len(ids)} target(s) are longer than "
                f"data.max_target_length={data.max_target_length} tokens ([SEP] included) "
                "and were cut"
            )
    else:
        ids = [[] for _ in split.records]
    target = s2s.target_features(
        ids, data.max_target_length, options.decoder_start_id, options.eos_id
    )
    if not split.has_labels:  # nothing to learn or score: no target token counts
        target["target_mask"][:] = 0
    features.update(target)
    examples = Seq2SeqExamples(
        name=split.name,
        path=split.path,
        features=features,
        indices=[record.index for record in split.records],
        has_labels=split.has_labels,
        full_rows=cut_sources,
        targets=targets,
        tokenizer=tokenizer,
    )
    return examples, notes


# ----------------------------------------------------------------------------- outputs


def predicted_ids(examples: Seq2SeqExamples, outputs: dict[str, np.ndarray]) -> list[list[int]]:
    """Each example's generated ids, without [SEP] and padding."""
    eos = examples.tokenizer.sep_id
    generated = decoding.Generated(outputs["tokens"], outputs["lengths"], None)
    return decoding.strip(generated, eos)


def predicted_texts(examples: Seq2SeqExamples, outputs: dict[str, np.ndarray]) -> list[str]:
    """Each example's generated text."""
    decode = functools.partial(examples.tokenizer.decode, skip_special=True)
    return [decode(ids).strip() for ids in predicted_ids(examples, outputs)]


def split_scores(examples: Seq2SeqExamples, outputs: dict[str, np.ndarray]) -> dict[str, float]:
    """BLEU, ROUGE-1/2/L against the targets as written; exact match of the token ids."""
    texts = predicted_texts(examples, outputs)
    references = list(examples.targets)
    scores = {"bleu": text_metrics.corpus_bleu(texts, references)}
    scores.update(text_metrics.rouge(texts, references))
    gold = examples.features["target_ids"] * examples.features["target_mask"]
    eos = examples.tokenizer.sep_id
    hits = [
        ids == [t for t in row.tolist() if t not in (0, eos)]
        for ids, row in zip(predicted_ids(examples, outputs), gold)
    ]
    scores["exact_match"] = float(np.mean(hits))
    return scores


# ----------------------------------------------------------------------------- the task


@dataclasses.dataclass(frozen=True)
class Seq2SeqTask(Task):
    """Text to text with a warm-started encoder-decoder (a bertjax.finetune.task.Task)."""

    name: str = s2s.TASK
    metrics: tuple[str, ...] = METRICS
    default_metric: str = "bleu"
    conll_files: bool = False
    label_separator: bool = False

    def read_options(self, config) -> TaskInputs:
        options = read_options(config)
        return TaskInputs(
            options, options.fields, options.max_seq_length, options.max_seq_length_field
        )

    def read(self, data: FinetuneDataSettings, tokenizer: Tokenizer) -> TaskData:
        settings: Seq2SeqData = data.task_options
        options = settings.options(tokenizer)
        layout = dict(data.layouts)
        splits = [task_data.read_split(data.train, layout[data.train], TRAIN, True)]
        splits += [
            task_data.read_split(path, layout[path], name, True) for name, path in data.validation
        ]
        splits += [
            task_data.read_split(path, layout[path], name, False) for name, path in data.test
        ]
        encoded, notes = [], []
        for split in splits:
            examples, split_notes = encode(split, settings, options, tokenizer)
            encoded.append(examples)
            notes += split_notes
            if split.skipped:
                notes.append(f"{split.path}: skipped {split.skipped} malformed row(s)")
        count = 1 + len(data.validation)
        return TaskData(options.head(), encoded[0], encoded[1:count], encoded[count:], notes)

    def check(self, data: TaskData, metric: str) -> None:
        """Every metric scores any text pairs: nothing to check."""

    def objective(self, model_config: BertConfig, head: HeadSpec) -> Seq2SeqObjective:
        return Seq2SeqObjective(model_config, head)

    def scores(
        self, head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
    ) -> dict[str, float]:
        return split_scores(examples, outputs)

    def write_predictions(
        self,
        path: fs.AnyPath,
        head: HeadSpec,
        examples: Examples,
        outputs: dict[str, np.ndarray],
    ) -> None:
        lines = ["index\tprediction"]
        for index, text in zip(examples.indices, predicted_texts(examples, outputs)):
            lines.append(f"{index}\t{' '.join(text.split())}")  # one line, no tabs
        rundir.write_text(path, "\n".join(lines) + "\n")


def warm_start(
    options: TaskOptions, model_config: BertConfig, source: rundir.Run, params: Any, fresh: Any
) -> tuple[Any, str]:
    """A run's first parameters from init_from, and a line saying what was taken: a seq2seq
    run goes on; an encoder becomes the encoder (and the decoder) as `options.init` says."""
    init = options.init
    if source.head is not None and source.head.task == s2s.TASK:
        theirs = TaskOptions.from_head(source.head)
        if theirs.init != init:
            raise ConfigError(
                f"config.seq2seq.init={init!r}: config.init_from={str(source.path)!r} is "
                f"a {theirs.init} encoder-decoder; set init={theirs.init!r} to go on "
                "training it"
            )
        return nn.meta.unbox(params), f"Initialised the encoder-decoder from {source.path}"
    if init == s2s.RND2RND:
        return fresh, "rnd2rnd: the encoder-decoder starts from random weights"
    params = s2s.from_pretrained(
        options.config(model_config), fresh, jax.tree.map(np.asarray, params)
    )
    decoder = {
        s2s.BERT2BERT: "the decoder from it too",
        s2s.BERTSHARE: "the decoder shares the encoder's weights",
        s2s.BERT2RND: "the decoder starts fresh",
    }[init]
    return params, (
        f"{init}: initialised the encoder from {source.path}, {decoder}; cross-attention "
        "starts fresh"
    )
