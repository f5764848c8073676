"""What a fine-tuning task is, and the registry that `config.task` names one from.

A task is everything the fine-tuning run (bertjax.finetune.loop) does not know by itself: how
its files are read and encoded, which model and objective it trains, what its evaluation
outputs mean, which metric picks the best epoch, and how predictions are written. The loop,
the settings reader and the engine below them (bertjax.steps, bertjax.loop) only call the
methods of `Task`; none of them names a task.

Adding a task is one new module in bertjax/finetune/tasks/ (every module there is imported
when bertjax.finetune is) that defines a `Task` and calls `register(...)` at import:

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

    register(QuestionAnswering())

The contract, per method:

- `read(data: FinetuneDataSettings, tokenizer: Tokenizer) -> TaskData`: the head (a
  `HeadSpec`: the task's name, which `register` makes valid there, and its label names)
  and the train, validation and test splits as `Examples`: numpy `features` with one row
  per example (input_ids, input_mask, segment_ids [n, seq]; labels; any other per-example
  array the objective reads), the examples' ids, and notes for the user. Text becomes
  ids with `bertjax.features`. Bad input raises `TaskDataError` naming the file and line.
- `check(data: TaskData, metric: str)`: a last check of the data against the chosen metric
  (e.g. F1 needs two labels); raise `ConfigError`.
- `objective(model_config: BertConfig, head: HeadSpec) -> TaskObjective`: the model and what
  a step minimises. A `TaskObjective` is a `steps.Objective` (sums over examples) with
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

Two optional members, for a task with more than an encoder and a classifier (seq2seq):
- `read_options(config)`: the task's own settings, checked with one-line ConfigErrors; kept
  as config.data's `task_options` for `read`. Its `fields` ((text fields), label field), if
  any, replace data.text_fields / data.label_field; its `max_seq_length` the input width.
- the objective's `warm_start(source_run, source_params, fresh) -> (params, note)`: the
  run's first parameters from init_from, in place of "the encoder (and the classifier)".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import numpy as np

from bertjax import fs, heads, steps
from bertjax.heads import HeadSpec
from bertjax.model import BertConfig


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


class TaskObjective(steps.Objective):
    """A task's model and loss: a steps.Objective that also initialises and evaluates."""

    def init_params(self, rng: jax.Array) -> Any:
        """Boxed parameters (with logical axis names) of the task's whole model."""
        raise NotImplementedError

    def evaluate(self, params, batch) -> tuple[Any, dict[str, jax.Array]]:
        """(sums, per-example outputs) of a batch, without dropout, in one pass."""
        raise NotImplementedError


class Task(Protocol):
    """A fine-tuning task (see the module docstring for the contract of each member)."""

    name: str
    metrics: tuple[str, ...]
    default_metric: str
    conll_files: bool
    label_separator: bool

    def read(self, data: Any, tokenizer: Any) -> TaskData: ...

    def check(self, data: TaskData, metric: str) -> None: ...

    def objective(self, model_config: BertConfig, head: HeadSpec) -> TaskObjective: ...

    def scores(
        self, head: HeadSpec, examples: Examples, outputs: dict[str, np.ndarray]
    ) -> dict[str, float]: ...

    def write_predictions(
        self,
        path: fs.AnyPath,
        head: HeadSpec,
        examples: Examples,
        outputs: dict[str, np.ndarray],
    ) -> None: ...


_REGISTRY: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Makes `task` what config.task=<task.name> means; a name is registered once."""
    if task.name in _REGISTRY and _REGISTRY[task.name] is not task:
        raise ValueError(f"task {task.name!r} is registered twice")
    heads.add_task_name(task.name)  # its checkpoints' HeadSpec names it
    _REGISTRY[task.name] = task
    return task


def names() -> tuple[str, ...]:
    """The registered tasks' names, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Task:
    """The registered task of that name."""
    if name not in _REGISTRY:
        raise ValueError(f"task={name!r} is not a fine-tuning task: valid {names()}")
    return _REGISTRY[name]
