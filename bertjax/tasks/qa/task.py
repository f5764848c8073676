"""Extractive question answering (SQuAD v1.1 / v2.0) as a fine-tuning task.

The parts (reading, google's windows, the head, n-best decoding, the official scorer) live in
bertjax.tasks.qa.squad; this module wires them into the fine-tuning run:

- `read` reads config.data's train, validation and test files (SQuAD JSON or JSON Lines) and
  turns every example into its windows. A split's rows are windows, not examples: the loop
  trains on windows and its evaluation gathers start and end logits per window; `scores`
  and `write_predictions` decode them per example (best span over all of its windows).
- Training leaves out examples whose answer text is not the context at answer_start; the
  run's notes name them. Evaluation keeps every example (its windows point at the answer
  too, so the validation loss and span_accuracy mean what training's do).
- Metrics: f1 (the default, picks the best epoch) and exact_match, as the official scripts
  compute them (percentages). v2.0 adds best_f1 and best_exact (at the null-odds threshold
  that scores best on the split) beside the thresholded ones.
- Predictions: predictions.json, nbest_predictions.json and (v2.0) null_odds.json in the
  official formats, in <workdir>/predictions_<split>/, for the validation and test files.
  The test file may lack answers (every question, or none): it is then decoded as the
  training data's task and only predicted.

`config.qa` holds the windowing and decoding settings; `CONFIG_DEFAULTS` are google's
run_squad.py values, used where config.task is question_answering and the config leaves the
field unset.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.capability import HeadSpec
from bertjax.encoders.family import EncoderConfig
from bertjax.engine.settings import ConfigError
from bertjax.finetune import layouts
from bertjax.finetune.data import TaskDataError
from bertjax.finetune.settings import FinetuneDataSettings
from bertjax.finetune.task import Examples, Task, TaskData, TaskObjective
from bertjax.nn.heads import HeadSums
from bertjax.storage import fs
from bertjax.tasks.qa import decode as qa_decode
from bertjax.tasks.qa import metrics as qa_metrics
from bertjax.tasks.qa import model as qa_model
from bertjax.tasks.qa import squad as qa
from bertjax.text import features as features_lib
from bertjax.text.tokenizer import Tokenizer

# Where the config leaves them unset: google's run_squad.py values.
CONFIG_DEFAULTS = {
    "optimizer.learning_rate": 3e-5,
    "num_epochs": 2,
    "data.max_seq_length": 384,
}
# Files of one split's predictions, in this directory name under the run directory.
PREDICTIONS_DIR = "predictions_{}"
# config.qa's fields (QASettings but max_seq_length, which is config.data's).
QA_FIELDS = (
    "doc_stride",
    "max_query_length",
    "n_best_size",
    "max_answer_length",
    "null_score_diff_threshold",
    "version_2_with_negative",
)


@dataclasses.dataclass(frozen=True)
class QAExamples(Examples):
    """A split as windows (`features` rows, `indices` their example's id) and what decoding
    per example needs: the examples, the windows' offsets and max-context flags."""

    examples: tuple[qa.QAExample, ...] = ()
    windows: qa.QAFeatures | None = None
    version_2: bool = False
    settings: qa.QASettings | None = None


def qa_settings(values: dict[str, Any], max_seq_length: int) -> qa.QASettings:
    """The config's qa section (a plain dict) and data.max_seq_length as QASettings."""
    fields = {name: values[name] for name in QA_FIELDS if name in values}
    try:
        return qa.QASettings(max_seq_length=max_seq_length, **fields)
    except ValueError as err:
        # Named as the user set them: max_seq_length is config.data's, the rest config.qa's.
        message = str(err).replace("QASettings.max_seq_length", "config.data.max_seq_length")
        message = message.replace("QASettings.", "config.qa.")
        message = message.replace(" max_query_length=", " config.qa.max_query_length=")
        raise ValueError(message) from None


def encode_split(
    name: str,
    path: str,
    tokenizer: Tokenizer,
    settings: qa.QASettings,
    *,
    training: bool,
    version_2: bool | None = None,
) -> tuple[QAExamples, qa.QAData]:
    """A file's examples as windows; bad input raises TaskDataError naming the file.

    `version_2` given (the training data's task): a test file, which may lack answers and
    is then decoded as that task.
    """
    try:
        data = qa.read_examples(
            path,
            version_2_with_negative=settings.version_2_with_negative,
            answers_required=version_2 is None,
        )
    except (ValueError, FileNotFoundError) as err:
        raise TaskDataError(str(err)) from None
    try:  # a question the tokenizer reduces to nothing could only be answered at random
        features_lib.token_ids(tokenizer, [e.question for e in data.examples], "question")
    except features_lib.InputError as err:
        raise TaskDataError(f"{data.examples[err.index].where}: question {err.problem}") from None
    if not data.has_answers:
        data = dataclasses.replace(data, version_2=version_2)
    examples = data.examples
    if not training:
        # Evaluation keeps every example; its windows still point at the answer (where the
        # answer matches the context) so that the validation loss means what training's does.
        examples = [
            e
            if e.is_impossible or e.answer_matches
            else dataclasses.replace(e, answers=(), is_impossible=True)
            for e in examples
        ]
    # Windows do not depend on the answers: the same rows either way.
    windows = qa.make_features(examples, tokenizer, settings, training=True)
    batch = windows.batch()
    del batch["weights"]  # the loop adds its own
    ids = [data.examples[k].id for k in windows.example_index]
    full = int((windows.input_mask.sum(axis=1) == settings.max_seq_length).sum())
    split = QAExamples(
        name=name,
        path=path,
        features=batch,
        indices=ids,
        has_labels=data.has_answers,
        full_rows=full,
        examples=data.examples,
        windows=windows,
        version_2=data.version_2,
        settings=settings,
    )
    return split, data


class QAHeadObjective(qa_model.QAObjective, TaskObjective):
    """The QA head's loss, with the initialisation and evaluation a fine-tuning run asks."""

    eval_outputs = True
    position_outputs = ("start_logits", "end_logits")

    def __init__(self, model_config: EncoderConfig):
        super().__init__(qa_model.QuestionAnswering(model_config))

    def init_params(self, rng):
        return qa_model.init_params(self.model, rng)

    def evaluate(self, params, batch) -> tuple[HeadSums, dict[str, Any]]:
        start, end = self.logits(params, batch, rng=None, deterministic=True)
        sums = self.batch_sums(start, end, batch)
        return sums, {"start_logits": start, "end_logits": end}  # [b, s] each

    def distill_outputs(self, params, batch, *, rng, deterministic, packed_length=None):
        start, end = self.logits(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        return {"start_logits": start, "end_logits": end}  # [b, s] each

    def sums_of_outputs(self, outputs, batch) -> HeadSums:
        return self.batch_sums(outputs["start_logits"], outputs["end_logits"], batch)

    def soft_sums(self, student, teacher, batch, temperature):
        spans = ("start_logits", "end_logits")
        per_window = qa_model.soft_span_loss(
            tuple(student[k] for k in spans),
            tuple(teacher[k] for k in spans),
            batch["input_mask"],
            temperature,
        )  # [b]
        return jnp.sum(per_window), self.soft_denominator(batch)

    def soft_denominator(self, batch) -> jax.Array:
        return jnp.asarray(batch["input_ids"].shape[0], jnp.float32)


def decode_split(examples: QAExamples, outputs: dict[str, np.ndarray]) -> qa_decode.QAPredictions:
    """Each example's n-best answers from its windows' logits (outputs rows = windows)."""
    return qa_decode.decode(
        examples.examples,
        examples.windows,
        outputs["start_logits"],
        outputs["end_logits"],
        examples.settings,
        version_2=examples.version_2,
    )


@dataclasses.dataclass(frozen=True)
class QuestionAnsweringTask(Task):
    """Extractive question answering (a bertjax.finetune.task.Task)."""

    name: str = qa_model.TASK
    metrics: tuple[str, ...] = ("f1", "exact_match")
    default_metric: str = "f1"
    conll_files: bool = False
    label_separator: bool = False
    config_defaults: tuple = tuple(CONFIG_DEFAULTS.items())
    predicts_validation: bool = True  # the official files for the validation split too
    distills: bool = True
    settings_section: str = "qa"  # config.qa: windowing and decoding

    def read_settings(self, values: dict[str, Any], max_seq_length: int) -> qa.QASettings:
        """config.qa's values as QASettings (raises ValueError naming the field)."""
        return qa_settings(values, max_seq_length)

    def read(self, data: FinetuneDataSettings, tokenizer: Tokenizer) -> TaskData:
        settings = data.task_settings or qa.QASettings(max_seq_length=data.max_seq_length)
        encode = functools.partial(encode_split, tokenizer=tokenizer, settings=settings)
        train, train_data = encode(layouts.TRAIN, data.train, training=True)
        notes = [train_data.report()]
        validation, test = [], []
        for name, path in data.validation:
            split, read = encode(name, path, training=False)
            validation.append(split)
            notes.append(read.report())
        for name, path in data.test:
            split, read = encode(name, path, training=False, version_2=train_data.version_2)
            test.append(split)
            notes.append(read.report())
        unlabeled = None
        if data.unlabeled:  # distillation's questions without answers: read as a test file
            unlabeled, read = encode(
                layouts.UNLABELED, data.unlabeled, training=False, version_2=train_data.version_2
            )
            notes.append(read.report())
        for split in (train, *validation, *test, *([unlabeled] if unlabeled else [])):
            notes.append(
                f"{split.path}: {len(split)} windows of {settings.max_seq_length} tokens "
                f"(doc_stride {settings.doc_stride}) for {len(split.examples)} questions"
            )
        return TaskData(
            HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS),
            train,
            validation,
            test,
            notes,
            unlabeled=unlabeled,
        )

    def check(self, data: TaskData, metric: str) -> None:
        if not len(data.train):
            raise ConfigError(f"{data.train.path}: no question is left to train on")

    def objective(self, model_config: EncoderConfig, head: HeadSpec) -> QAHeadObjective:
        return QAHeadObjective(model_config)

    def scores(
        self, head: HeadSpec, examples: QAExamples, outputs: dict[str, np.ndarray]
    ) -> dict[str, float]:
        predictions = decode_split(examples, outputs)
        result = qa_metrics.evaluate(
            examples.examples,
            predictions.predictions,
            version_2=examples.version_2,
            null_odds=predictions.null_odds,
        )
        if not examples.version_2:
            return result
        out = {"f1": result["f1"], "exact_match": result["exact"]}
        out.update({k: float(v) for k, v in result.items() if k.startswith(("best_", "HasAns_"))})
        out.update({k: float(v) for k, v in result.items() if k.startswith("NoAns_")})
        return out

    def write_predictions(
        self,
        path: fs.AnyPath,
        head: HeadSpec,
        examples: QAExamples,
        outputs: dict[str, np.ndarray],
    ) -> fs.AnyPath:
        """The official files of a split in <run>/predictions_<split>/; that directory."""
        directory = fs.path(path).parent / PREDICTIONS_DIR.format(examples.name)
        qa_decode.write_predictions(directory, decode_split(examples, outputs))
        return directory
