"""What a fine-tuning task is: the part of a capability (bertjax.capability) that trains.

A task is everything the fine-tuning run (bertjax.finetune.loop) does not know by itself: how
its files are read and encoded, which model and objective it trains, what its evaluation
outputs mean, which metric picks the best epoch, and how predictions are written. The loop,
the settings reader and the engine below them (bertjax.engine.steps, bertjax.engine.loop) only
call the methods of `Task`; none of them names a task.

A task is defined in its capability's package (bertjax/tasks/<name>/task.py) and listed in
that capability's `fine_tuning`; `config.task` names it:

    class QuestionAnswering:
        name = "question_answering"
        metrics = ("exact_match", "f1")
        default_metric = "f1"
        conll_files = False
        label_separator = False

        def read(self, data, tokenizer): ...           # -> TaskData
        def check(self, data, metric): ...              # -> None, or raises ConfigError
        def objective(self, model_config, head): ...    # -> TaskObjective
        def scores(self, head, examples, outputs): ...  # -> {metric: value}
        def write_predictions(self, path, head, examples, outputs): ...

The contract, per method:

- `read(data: FinetuneDataSettings, tokenizer: Tokenizer) -> TaskData`: the head (a
  `HeadSpec`: the task's name, which `register` makes valid there, and its label names)
  and the train, validation and test splits as `Examples`: numpy `features` with one row
  per example (input_ids, input_mask, segment_ids [n, seq]; labels; any other per-example
  array the objective reads), the examples' ids, and notes for the user. Text becomes
  ids with `bertjax.text.features`. Bad input raises `TaskDataError` naming the file and line.
- `check(data: TaskData, metric: str)`: a last check of the data against the chosen metric
  (e.g. F1 needs two labels); raise `ConfigError`.
- `objective(model_config: EncoderConfig, head: HeadSpec) -> TaskObjective`: the model and what
  a step minimises. A `TaskObjective` is a `steps.Loss` (sums over examples) with
  `init_params(rng)` (boxed parameters; the encoder under "bert", so a pretrained one drops
  in, the task's own layers under "classifier") and `evaluate(params, batch)` returning
  (sums, outputs): outputs are per-example arrays, batch-major, gathered over the eval set.
  Rows an eval batch only pads carry `weights` 0; the sums must ignore them.
- `scores(head, examples, outputs) -> dict[str, float]`: the task's metrics of one labelled
  split, keyed by the names in `metrics` (higher is better unless the name is in
  bertjax.finetune.metrics.LOWER_IS_BETTER).
- `write_predictions(path, head, examples, outputs)`: one file of a test split's predictions.
- `start_head(params, data: TaskData, run: FinetuneRunSettings) -> (params, note or None)`,
  optional: adjusts a head that starts fresh (not taken from config.init_from) before the
  first step, from the training data (the regression head's bias starts at the targets'
  mean); the note is added to the line that says what was initialised.
- `conll_files` (the task reads CoNLL `token TAG` files) and `label_separator` (a label field
  may hold several labels) steer the settings reader's checks of config.data.

- `read_options(config) -> TaskInputs or None`, optional: the task's own settings, checked
  with one-line ConfigErrors; `options` is kept as config.data's `task_options` for `read`,
  `fields` ((text fields), label field) replace data.text_fields / data.label_field, and
  `max_seq_length` the input width.
- `settings_section` and `read_settings(values, max_seq_length)`, optional: a config section
  of the task's own, whose files the task reads itself (SQuAD's).
- `config_defaults` and `predicts_validation`: see `Task`.

How a run starts from init_from (which weights are taken) is the capability's
(bertjax.capability.Capability.warm_start), not the task's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from bertjax import capability
from bertjax.capability import HeadSpec
from bertjax.encoders.family import EncoderConfig
from bertjax.engine import steps
from bertjax.storage import fs


@dataclasses.dataclass(frozen=True)
class Examples:
    """A split encoded for the model, in file order."""

    name: str  # train, validation, test (MNLI: validation_matched, ...)
    path: str
    features: dict[str, np.ndarray]  # input_ids, input_mask, segment_ids [n, seq], labels
    indices: list[str]  # each example's id, for prediction files
    has_labels: bool
    # Token tasks: per sentence, each word's first sub-word position (-1: cut) and its
    # gold tag id (-1 without labels). With word positions, "labels" is per position.
    word_positions: list[np.ndarray] | None = None
    word_labels: list[np.ndarray] | None = None
    full_rows: int = 0  # inputs filling all max_seq_length positions (longer ones were cut)
    words_cut: int = 0  # token tasks: words without a position

    def __len__(self) -> int:
        return len(self.indices)


@dataclasses.dataclass(frozen=True)
class TaskData:
    """A task's head and its encoded splits."""

    head: HeadSpec
    train: Examples
    validation: list[Examples]  # one, or MNLI's matched and mismatched
    test: list[Examples]  # possibly none
    notes: list[str]  # what the user should know: skipped rows, cut inputs
    # config.data.unlabeled's examples, read as a test split (no labels), for distillation.
    unlabeled: Examples | None = None


class TaskObjective(steps.Loss):
    """A task's model and loss: a steps.Loss that also initialises and evaluates."""

    def init_params(self, rng: jax.Array) -> Any:
        """Boxed parameters (with logical axis names) of the task's whole model."""
        raise NotImplementedError

    def evaluate(self, params, batch) -> tuple[Any, dict[str, jax.Array]]:
        """(sums, per-example outputs) of a batch, without dropout, in one pass."""
        raise NotImplementedError

    # Distillation (bertjax.finetune.distill), for a task whose `Task.distills`: a teacher's
    # objective gives its outputs, a student's matches them.

    def distill_outputs(
        self, params, batch, *, rng, deterministic: bool, packed_length=None
    ) -> dict[str, jax.Array]:
        """The head's raw outputs by name (logits, span logits, embeddings), batch-major:
        what a student learns to match."""
        raise NotImplementedError

    def sums_of_outputs(self, outputs: dict[str, jax.Array], batch) -> Any:
        """`sums` of a batch, from its `distill_outputs` (the same values)."""
        raise NotImplementedError

    def soft_sums(
        self,
        student: dict[str, jax.Array],
        teacher: dict[str, jax.Array],
        batch,
        temperature: float,
    ) -> tuple[jax.Array, jax.Array]:
        """(the student's soft loss against the teacher's outputs summed over the batch, what
        it is averaged over): every real row (or position) counts, labelled or not."""
        raise NotImplementedError

    def soft_denominator(self, batch) -> jax.Array:
        """`soft_sums`' count of a whole batch, from its features alone."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class TaskInputs:
    """What a task with settings of its own read from the config (Task.read_options)."""

    options: Any  # kept as config.data's task_options, for Task.read
    # (text fields, label field) of the files, in place of data.text_fields / label_field
    fields: tuple[tuple[str, ...], str] | None = None
    max_seq_length: int | None = None  # the input width, in place of data.max_seq_length
    # The config field that set max_seq_length, for messages about it.
    max_seq_length_field: str = "data.max_seq_length"


class Task:
    """A fine-tuning task (see the module docstring for the contract of each member).

    The members with a value here are optional: a task sets them only where it differs.
    """

    name: str
    metrics: tuple[str, ...]
    default_metric: str
    conll_files: bool = False  # reads CoNLL `token TAG` files
    label_separator: bool = False  # a label field may hold several labels
    # Dotted config fields -> the task's own default, used where the user set none.
    config_defaults: tuple[tuple[str, Any], ...] = ()
    # Prediction files for the validation splits too (question answering's official ones).
    predicts_validation: bool = False
    # A config section of the task's own (config.qa), read by read_settings; the task then
    # reads its files itself, config.data naming only train, validation and test.
    settings_section: str = ""
    # Whether its objective distils (TaskObjective.distill_outputs and the rest): a run may
    # then learn from a teacher (config.distill) and from unlabeled files.
    distills: bool = False

    def read(self, data: Any, tokenizer: Any) -> TaskData:
        raise NotImplementedError

    def check(self, data: TaskData, metric: str) -> None:
        """A last check of the data against the chosen metric; raises ConfigError."""

    def objective(self, model_config: EncoderConfig, head: HeadSpec) -> TaskObjective:
        raise NotImplementedError

    def scores(
        self, head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
    ) -> dict[str, float]:
        raise NotImplementedError

    def write_predictions(
        self,
        path: fs.AnyPath,
        head: HeadSpec,
        examples: Examples,
        outputs: dict[str, np.ndarray],
    ) -> Any:
        raise NotImplementedError

    def read_options(self, config: Any) -> TaskInputs | None:
        """The task's own settings from the config, checked (one-line ConfigErrors)."""
        return None

    def read_settings(self, values: dict[str, Any], max_seq_length: int) -> Any:
        """The config section `settings_section` (a plain dict) as the task's settings."""
        raise NotImplementedError

    def start_head(self, params: Any, data: TaskData, run: Any) -> tuple[Any, str | None]:
        """Adjusts a head that starts fresh before the first step; a note or None."""
        return params, None


def names() -> tuple[str, ...]:
    """The tasks config.task may name: every registered capability's (bertjax.capability)."""
    return capability.task_names()


def get(name: str) -> Task:
    """The fine-tuning task of that name, from its capability."""
    if name not in capability.task_names():
        raise ValueError(f"task={name!r} is not a fine-tuning task: valid {names()}")
    return capability.get(name).fine_tuning[name]
