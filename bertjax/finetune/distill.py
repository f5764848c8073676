"""Task distillation: a fine-tuning run whose model (the student) also learns from a frozen,
already fine-tuned model of the same task (the teacher).

    python finetune.py --workdir W --config.task=classification --config.init_from=SMALL \
        --config.distill.teacher=LARGE_RUN --config.data.train=... --config.data.validation=...

Each training batch goes through the teacher first, on the devices and the mesh the student
trains on (steps.Steps.batch_features); its outputs join the batch and the student minimises

    (1 - alpha) * its task's loss on the labels + alpha * the task's soft loss

where the soft loss is the task's own (TaskObjective.soft_sums): KL at temperature T (times
T^2) for classification, token labels and question answering's span ends, each label's
softened Bernoulli KL for multi-label, squared error to the teacher's score for regression
and to its embeddings for sentence embeddings. Evaluation and the best checkpoint are the
task's, on the labels, as in any run.

The teacher's outputs are computed on the fly, batch by batch, not once and kept beside the
run: the same batch always gets the same outputs (the teacher runs without dropout), so a
resumed run takes the same steps; nothing is written or read per example; and the outputs
always match the batch's width and the run's data, whatever its order. The cost is one
forward pass of the teacher per training step.

Rows of config.data.unlabeled (the task's files without labels) train on the soft loss alone:
their label weight is 0. config.distill.student_layers starts the student as the teacher with
only those encoder layers (DistilBERT's initialisation), its head included.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import capability
from bertjax.capability import HeadSpec
from bertjax.engine import rundir, steps
from bertjax.engine import teacher as teacher_lib
from bertjax.engine.settings import ConfigError
from bertjax.finetune.task import Examples, TaskObjective
from bertjax.nn import distillation
from bertjax.storage import fs
from bertjax.text.tokenizer import Tokenizer

# The per-row weight of a training example's labels: 0 for config.data.unlabeled's rows.
LABEL_WEIGHTS = "weights"


@dataclasses.dataclass(frozen=True)
class DistillSettings:
    """config.distill: the teacher and how the student learns from it."""

    teacher: str  # a fine-tuned bertjax run (its best checkpoint) or a transformers directory
    alpha: float = 0.5  # the teacher's share of the loss; the labels' is 1 - alpha
    temperature: float = 2.0  # both networks' logits are divided by it (Hinton et al.)
    # The teacher's encoder layers the student starts from, in order; empty: init_from.
    student_layers: tuple[int, ...] = ()


def parse_layers(value: Any) -> tuple[int, ...]:
    """ "0,2,4" (or a tuple of ints) as increasing layer indices; "" as none."""
    if value in (None, "", ()):
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        layers = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        raise ValueError("must be layer indices, e.g. 0,2,4") from None
    if any(layer < 0 for layer in layers) or list(layers) != sorted(set(layers)):
        raise ValueError("must be distinct layer indices >= 0 in increasing order, e.g. 0,2,4")
    return layers


# ----------------------------------------------------------------------------- the teacher


def open_teacher(settings: DistillSettings) -> rundir.Run:
    """The teacher run (a fine-tuning run's best checkpoint, or a transformers directory)."""
    field = f"config.distill.teacher={settings.teacher!r}"
    try:
        # A capability's own directory format (a sentence-transformers model) opens as that
        # capability's model, as Model.load opens it.
        own = capability.recognising(settings.teacher)
        if own is not None:
            opened = own.open(settings.teacher)
            teacher = rundir.Run(
                fs.path(settings.teacher),
                rundir.HUGGING_FACE,
                opened.config,
                opened.tokenizer,
                opened.head,
                None,
                None,
                params=opened.params,
            )
        else:
            teacher = rundir.open_run(settings.teacher, pretraining_heads=False)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"{field}: {err}") from None
    if teacher.head is None:
        raise ConfigError(
            f"{field} has no fine-tuned head (it is a pretrained encoder): a teacher is a model "
            "fine-tuned on the task the student learns"
        )
    return teacher


def check_teacher(teacher: rundir.Run, task: str, tokenizer: Tokenizer, source: str) -> None:
    """Fails unless the teacher was fine-tuned on `task` and reads text with `tokenizer` (the
    student's, from `source`)."""
    field = f"config.distill.teacher={str(teacher.path)!r}"
    if teacher.head.task != task:
        raise ConfigError(
            f"{field} is a {teacher.head.describe()} model; this run trains {task}: a teacher "
            "of the task the student learns is needed"
        )
    if teacher.tokenizer.fingerprint != tokenizer.fingerprint:
        raise ConfigError(
            f"{field}: its tokenizer ({teacher.tokenizer.vocab_size} pieces) is not the "
            f"student's ({source}, {tokenizer.vocab_size} pieces); distillation compares the "
            "two networks position by position, so both must read text with one tokenizer"
        )


def check_labels(teacher: HeadSpec, student: HeadSpec) -> None:
    """Fails unless the student's head has the teacher's labels, in the teacher's order."""
    if teacher.labels != student.labels:
        raise ConfigError(
            f"config.distill.teacher: its labels {list(teacher.labels)} are not the student's "
            f"{list(student.labels)}; a teacher of the same label set is needed"
        )


def teacher_outputs_of(
    objective: TaskObjective, params: Any, built: steps.Steps
) -> teacher_lib.TeacherOutputs:
    """The teacher's outputs as batch features: `objective`'s distill_outputs without
    dropout, for the student's mesh (`built`), of `params` placed there."""

    def outputs(params, batch):
        return objective.distill_outputs(params, batch, rng=None, deterministic=True)

    return teacher_lib.frozen_outputs(outputs, params, built)


def student_from_teacher(teacher: rundir.Run, layers: tuple[int, ...]) -> rundir.Run:
    """The teacher with only `layers` (config.distill.student_layers), its head included."""
    return teacher_lib.keep_layers(teacher, layers, "distill.student_layers")


def check_outputs(
    teacher: TaskObjective, student: TaskObjective, train: Examples, mesh: jax.sharding.Mesh
) -> None:
    """Fails unless the teacher's outputs have the student's shapes (e.g. embeddings of one
    width) on a batch of the training split's first example."""
    batch = {
        name: jax.ShapeDtypeStruct((1, *array.shape[1:]), array.dtype)
        for name, array in train.features.items()
    }
    batch.setdefault(LABEL_WEIGHTS, jax.ShapeDtypeStruct((1,), np.float32))

    def shapes(objective: TaskObjective) -> dict[str, tuple[int, ...]]:
        params = nn.meta.unbox(jax.eval_shape(objective.init_params, jax.random.key(0)))

        def outputs(params, batch):
            return objective.distill_outputs(params, batch, rng=None, deterministic=True)

        with jax.set_mesh(mesh):
            found = jax.eval_shape(outputs, params, batch)
        return {name: tuple(value.shape[1:]) for name, value in found.items()}

    theirs, ours = shapes(teacher), shapes(student)
    if theirs != ours:
        raise ConfigError(
            f"config.distill.teacher: its outputs per example {theirs} are not the student's "
            f"{ours}; the student learns them coordinate by coordinate, so both must have "
            "one shape (embeddings of one width: e.g. a student from config.distill.student_"
            "layers)"
        )


def place_teacher(teacher: rundir.Run, objective: TaskObjective, mesh) -> Any:
    """The teacher's parameters sharded on the student's mesh as its own model lays them out
    (no optimizer state: it never trains)."""
    _, params = rundir.read_params(teacher, mesh)
    layout = steps.make_state(objective.init_params, None, mesh)
    return jax.device_put(params, layout.shardings.params)


# ----------------------------------------------------------------------------- the student


def with_unlabeled(train: Examples, unlabeled: Examples) -> Examples:
    """The training split and config.data.unlabeled's rows as one split, the unlabeled rows'
    label weight 0 (their labels are placeholders the loss never reads)."""
    if not len(unlabeled):
        raise ConfigError(f"config.data.unlabeled={unlabeled.path!r} holds no examples")
    features = {}
    for name, array in train.features.items():
        other = unlabeled.features.get(name)
        if other is None or other.shape[1:] != array.shape[1:]:
            raise ConfigError(
                f"config.data.unlabeled={unlabeled.path!r}: its examples do not have the "
                f"training file's {name} {array.shape[1:]}; it must be in the task's own format"
            )
        features[name] = np.concatenate([array, other.astype(array.dtype)])
    features[LABEL_WEIGHTS] = np.concatenate(
        [np.ones(len(train), np.float32), np.zeros(len(unlabeled), np.float32)]
    )
    positions = None
    if train.word_positions is not None:
        positions = [*train.word_positions, *unlabeled.word_positions]
    return dataclasses.replace(
        train,
        features=features,
        indices=[*train.indices, *unlabeled.indices],
        word_positions=positions,
        word_labels=None,
        full_rows=train.full_rows + unlabeled.full_rows,
        words_cut=train.words_cut + unlabeled.words_cut,
    )


# ----------------------------------------------------------------------------- the objective


class DistillSums(NamedTuple):
    """A (micro-)batch's sums: the task's on the labels, and the soft loss's."""

    hard: Any  # the task objective's sums
    soft_loss: jax.Array  # summed soft loss
    soft_count: jax.Array  # what it is averaged over (rows, or positions of token tasks)


class DistillationObjective(TaskObjective):
    """A task's objective whose training loss mixes in the teacher's outputs (the module
    docstring); initialisation and evaluation are the task's own."""

    def __init__(self, student: TaskObjective, alpha: float, temperature: float):
        self.student = student
        self.alpha = alpha
        self.temperature = temperature
        self.eval_outputs = student.eval_outputs
        self.position_outputs = student.position_outputs

    def init_params(self, rng: jax.Array) -> Any:
        return self.student.init_params(rng)

    def evaluate(self, params, batch):
        return self.student.evaluate(params, batch)

    def distill_outputs(self, params, batch, *, rng, deterministic, packed_length=None):
        return self.student.distill_outputs(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> DistillSums:
        outputs = self.distill_outputs(
            params, batch, rng=rng, deterministic=deterministic, packed_length=packed_length
        )
        teacher = teacher_lib.teacher_outputs(batch)
        soft_loss, soft_count = self.student.soft_sums(outputs, teacher, batch, self.temperature)
        return DistillSums(self.student.sums_of_outputs(outputs, batch), soft_loss, soft_count)

    def zero_sums(self) -> DistillSums:
        zero = jnp.zeros((), jnp.float32)
        return DistillSums(self.student.zero_sums(), zero, zero)

    def denominators(self, batch):
        return self.student.denominators(batch), self.student.soft_denominator(batch)

    def loss(self, sums: DistillSums, denominators) -> jax.Array:
        hard, soft = denominators
        soft_loss = sums.soft_loss / jnp.maximum(soft, 1.0)
        return distillation.mix(self.student.loss(sums.hard, hard), soft_loss, self.alpha)

    def metrics(self, sums, prefix: str) -> dict[str, jax.Array]:
        if not isinstance(sums, DistillSums):  # evaluation's: the task's own, on the labels
            return self.student.metrics(sums, prefix)
        out = self.student.metrics(sums.hard, prefix)
        out[f"{prefix}/distill_loss"] = sums.soft_loss / jnp.maximum(sums.soft_count, 1.0)
        return out
