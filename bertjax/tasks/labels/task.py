"""The tasks of bertjax.nn.heads' heads: classification (one sentence or a pair), regression,
multi-label classification and token classification.

All four read the same files (data.py over bertjax.finetune.data: CSV, TSV, JSON Lines, CoNLL
for token tags, or GLUE's), train a `HeadObjective`, and score with metrics.py.
Predictions files hold one line per example: index, label, score (the label's probability).
Regression: index, prediction. Multi-label: the labels at or above 0.5 and their
probabilities, comma-separated. Token labels: one tag and one probability per word,
space-separated.
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
from bertjax.finetune.settings import FinetuneDataSettings, FinetuneRunSettings
from bertjax.finetune.task import Examples, Task, TaskData, TaskObjective
from bertjax.nn import heads
from bertjax.storage import fs
from bertjax.tasks.labels import data as task_data
from bertjax.tasks.labels import metrics as metrics_lib
from bertjax.tasks.labels import model as label_heads
from bertjax.text.tokenizer import Tokenizer


# A label head's batch features: input_ids, input_mask, segment_ids [batch, seq]; labels
# ([batch] ids or values, [batch, labels] 0/1, or [batch, seq] token ids with
# label_heads.IGNORE_LABEL); weights [batch] (0 for rows that only pad an evaluation batch).
class HeadObjective(TaskObjective):
    """A fine-tuning head's loss as sums over examples (see steps.Loss)."""

    eval_outputs = True

    def __init__(self, model_config: EncoderConfig, head: HeadSpec):
        self.model = label_heads.make_model(model_config, head.task, head.num_outputs)
        self.head = head
        self.position_outputs = ("labels", "scores") if head.token_level else ()

    def init_params(self, rng: jax.Array) -> Any:
        return heads.init_params(self.model, rng)

    def evaluate(self, params, batch):
        logits = self.logits(params, batch, rng=None, deterministic=True)
        return label_heads.head_sums(self.head.task, logits, batch), label_heads.outputs(
            self.head.task, logits
        )

    def logits(self, params, batch, *, rng, deterministic: bool, packed_length=None):
        return heads.apply_model(
            self.model,
            params,
            batch,
            rng=rng,
            deterministic=deterministic,
            packed_length=packed_length,
        )

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> heads.HeadSums:
        logits = self.logits(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        return label_heads.head_sums(self.head.task, logits, batch)

    def zero_sums(self) -> heads.HeadSums:
        return heads.HeadSums.zeros()

    def denominators(self, batch) -> jax.Array:
        return label_heads.denominator(self.head.task, batch, self.head.num_outputs)

    def distill_outputs(self, params, batch, *, rng, deterministic, packed_length=None):
        logits = self.logits(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        return {"logits": logits}

    def sums_of_outputs(self, outputs, batch) -> heads.HeadSums:
        return label_heads.head_sums(self.head.task, outputs["logits"], batch)

    def soft_sums(self, student, teacher, batch, temperature):
        return label_heads.soft_sums(
            self.head.task, student["logits"], teacher["logits"], batch, temperature
        )

    def soft_denominator(self, batch) -> jax.Array:
        return label_heads.soft_denominator(self.head.task, batch, self.head.num_outputs)

    def loss(self, sums: heads.HeadSums, denominators: jax.Array) -> jax.Array:
        # At least 1: a token batch could hold no labelled word at all.
        return sums.loss / jnp.maximum(denominators, 1.0)

    def metrics(self, sums: heads.HeadSums, prefix: str) -> dict[str, jax.Array]:
        return summary_metrics(self.head.task, sums, prefix)


def summary_metrics(task: str, sums: heads.HeadSums, prefix: str) -> dict[str, Any]:
    """Loss (and accuracy where it means something) from summed statistics."""
    count = jnp.maximum(sums.count, 1.0)
    out = {f"{prefix}/loss": sums.loss / count}
    if task == label_heads.MULTI_LABEL:
        out[f"{prefix}/label_accuracy"] = sums.correct / count
    elif task != label_heads.REGRESSION:
        out[f"{prefix}/accuracy"] = sums.correct / count
    return out


@dataclasses.dataclass(frozen=True)
class HeadTask(Task):
    """One of bertjax.nn.heads' tasks (a bertjax.finetune.task.Task)."""

    name: str

    @property
    def metrics(self) -> tuple[str, ...]:
        return metrics_lib.METRIC_NAMES[self.name]

    @property
    def default_metric(self) -> str:
        return metrics_lib.DEFAULT_METRIC[self.name]

    @property
    def conll_files(self) -> bool:
        return self.name == label_heads.TOKEN_CLASSIFICATION

    @property
    def label_separator(self) -> bool:
        return self.name == label_heads.MULTI_LABEL

    distills = True

    def read(self, data: FinetuneDataSettings, tokenizer: Tokenizer) -> TaskData:
        return task_data.load_task(data, self.name, tokenizer)

    def check(self, data: TaskData, metric: str) -> None:
        if (
            metric == "f1"
            and self.name == label_heads.CLASSIFICATION
            and data.head.num_outputs != 2
        ):
            raise ConfigError(
                f"config.metric='f1' is the F1 of a two-label task; {data.train.path} has "
                f"{data.head.num_outputs} labels: use f1_macro"
            )

    def start_head(
        self, params: dict, data: TaskData, run: FinetuneRunSettings
    ) -> tuple[dict, str | None]:
        """A fresh regression head's bias at the training targets' mean (unless
        run.regression_bias_init is "zero"): Adam moves a bias by about the learning rate per
        step, so from 0 it cannot reach targets like STS-B's 0-5 within a fine-tuning run, and
        the encoder would have to learn the offset instead."""
        if self.name != label_heads.REGRESSION or run.regression_bias_init != "mean":
            return params, None
        mean = float(np.mean(data.train.features["labels"]))
        bias = params["classifier"]["bias"]
        start = jax.device_put(np.full(bias.shape, mean, bias.dtype), bias.sharding)
        classifier = {**params["classifier"], "bias": start}
        return {
            **params,
            "classifier": classifier,
        }, f"its bias starts at the targets' mean {mean:.4g}"

    def objective(self, model_config: EncoderConfig, head: HeadSpec) -> HeadObjective:
        return HeadObjective(model_config, head)

    def scores(
        self, head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
    ) -> dict[str, float]:
        return split_scores(head, examples, outputs)

    def write_predictions(
        self,
        path: fs.AnyPath,
        head: HeadSpec,
        examples: Examples,
        outputs: dict[str, np.ndarray],
    ) -> None:
        write_predictions(path, head, examples, outputs)


def word_tags(
    head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
) -> tuple[list[list[str]], list[list[float]]]:
    """Each sentence's predicted tag and probability per word. A word cut by max_seq_length
    gets "O" (or the first label) with probability 0."""
    default = "O" if "O" in head.labels else head.labels[0]
    tags, scores = [], []
    for row, where in enumerate(examples.word_positions):
        kept = where >= 0
        ids = np.zeros(len(where), np.int64)
        ids[kept] = outputs["labels"][row, where[kept]]
        probabilities = np.zeros(len(where))
        probabilities[kept] = outputs["scores"][row, where[kept]]
        tags.append([head.labels[i] if k else default for i, k in zip(ids, kept)])
        scores.append(probabilities.tolist())
    return tags, scores


def split_scores(
    head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
) -> dict[str, float]:
    """The task's metrics (metrics.scores) of one labelled split."""
    gold = examples.features["labels"]
    if head.task == label_heads.CLASSIFICATION:
        predicted = np.argmax(outputs["probabilities"], axis=-1)
    elif head.task == label_heads.REGRESSION:
        predicted = outputs["values"]
    elif head.task == label_heads.MULTI_LABEL:
        predicted = outputs["probabilities"] >= label_heads.MULTI_LABEL_THRESHOLD
    else:
        predicted, _ = word_tags(head, examples, outputs)
        gold = [[head.labels[i] for i in sentence] for sentence in examples.word_labels]
    return metrics_lib.scores(head.task, predicted, gold, head.num_outputs)


def write_predictions(
    path: fs.AnyPath, head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
) -> None:
    """A TSV of predictions, one line per example (see the module docstring)."""
    lines = ["index\tprediction" if head.task == label_heads.REGRESSION else "index\tlabel\tscore"]
    if head.task == label_heads.CLASSIFICATION:
        probabilities = outputs["probabilities"]
        best = np.argmax(probabilities, axis=-1)
        for index, k, p in zip(examples.indices, best, probabilities):
            lines.append(f"{index}\t{head.labels[k]}\t{p[k]:.6f}")
    elif head.task == label_heads.REGRESSION:
        for index, value in zip(examples.indices, outputs["values"]):
            lines.append(f"{index}\t{value:.6f}")
    elif head.task == label_heads.MULTI_LABEL:
        for index, p in zip(examples.indices, outputs["probabilities"]):
            chosen = np.flatnonzero(p >= label_heads.MULTI_LABEL_THRESHOLD)
            labels = ",".join(head.labels[k] for k in chosen)
            lines.append(f"{index}\t{labels}\t{','.join(f'{p[k]:.6f}' for k in chosen)}")
    else:
        tags, scores = word_tags(head, examples, outputs)
        for index, t, s in zip(examples.indices, tags, scores):
            lines.append(f"{index}\t{' '.join(t)}\t{' '.join(f'{x:.6f}' for x in s)}")
    rundir.write_text(path, "\n".join(lines) + "\n")
