"""What a capability is, and the one registry every hub asks instead of naming tasks.

A capability is everything bertjax does with a trained encoder for one kind of task: its
model and parameter layout, how a run starts from another run, its fine-tuning task, its
transformers format and its notebook method. Each lives in one package of bertjax.tasks,
which builds one `Capability` and lists it in `bertjax.tasks.CAPABILITIES`; importing
`bertjax` registers them all, so every kind of run opens in a fresh process.

The hubs below the capabilities (the run directory, `Model`, fine-tuning's init, the
transformers reader) never name a task: they look up the capability of a `HeadSpec` with
`of(head)` and call its methods.

A `HeadSpec` is what a fine-tuned checkpoint records about its head: the task's name, the
label names in output order, and the capability's typed options (a frozen dataclass, stored
as JSON in the checkpoint's meta).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax

# Parameters of the encoder, under this name in every capability's model, so that a
# pretrained encoder drops in (BertForPreTraining keeps it there too).
ENCODER = "bert"


@dataclasses.dataclass(frozen=True)
class HeadSpec:
    """A task, its labels in output order, and the task's typed options (or None)."""

    task: str
    labels: tuple[str, ...] = ()
    options: Any = None

    def __post_init__(self):
        if not isinstance(self.task, str) or self.task not in _BY_TASK:
            raise ValueError(f"task={self.task!r} is invalid: must be one of {task_names()}")
        labels = tuple(self.labels)
        object.__setattr__(self, "labels", labels)
        if not all(isinstance(label, str) and label for label in labels):
            raise ValueError(f"labels={labels!r} are invalid: each must be a non-empty str")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels={labels!r} are invalid: a label appears twice")
        _BY_TASK[self.task].check_head(self)

    @property
    def num_outputs(self) -> int:
        return len(self.labels)

    @property
    def token_level(self) -> bool:
        """Whether the head labels each token (its capability says)."""
        return _BY_TASK[self.task].token_level(self)

    def to_dict(self) -> dict:
        """JSON-serialisable form, for checkpoint meta."""
        out: dict[str, Any] = {"task": self.task, "labels": list(self.labels)}
        if self.options is not None:
            out["options"] = _BY_TASK[self.task].options_to_dict(self.options)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HeadSpec:
        """Inverse of `to_dict`; also reads the older form that kept options in the labels
        as name=value strings."""
        capability = get(d["task"])
        if "options" in d:
            options = capability.options_from_dict(d["options"])
            return cls(d["task"], tuple(d["labels"]), options)
        return capability.head_from_legacy(d["task"], tuple(d["labels"]))

    def describe(self) -> str:
        if not self.labels:
            return self.task
        shown = ", ".join(self.labels[:8]) + (" ..." if len(self.labels) > 8 else "")
        return f"{self.task} with {self.num_outputs} label(s) ({shown})"


class Opened(NamedTuple):
    """A directory in a capability's own transformers format, read: host arrays."""

    config: Any  # the encoder's config
    params: Any
    tokenizer: Any
    head: HeadSpec


class Capability:
    """One capability's fixed interface; each method's default suits an encoder plus a head
    under `head_param` (the classifiers), and a capability overrides the rest.

    Members:
      tasks          the HeadSpec task names it owns (config.task values)
      method         the notebook method that fits its runs, e.g. "answer"
      usage          that method as a user writes it, e.g. 'answer("Who?", context)'
      head_param     the name of its head's parameters beside ENCODER ("" if none)
      fine_tuning    task name -> its bertjax.finetune.task.Task
      notebook       method name -> function(model, *args, **kwargs): the Model methods it
                     serves (Model forwards to them)
    """

    tasks: tuple[str, ...] = ()
    method: str = ""
    usage: str = ""
    head_param: str = ""
    fine_tuning: Mapping[str, Any] = {}
    notebook: Mapping[str, Callable[..., Any]] = {}

    # ---------------------------------------------------------------- the head and its options

    def check_head(self, head: HeadSpec) -> None:
        """Raises ValueError unless the labels and options make a head of this capability."""

    def token_level(self, head: HeadSpec) -> bool:
        return False

    def options_to_dict(self, options: Any) -> dict:
        return dataclasses.asdict(options)

    def options_from_dict(self, d: Mapping[str, Any]) -> Any:
        """The typed options of a checkpoint's meta (None for a capability without any)."""
        return None

    def head_from_legacy(self, task: str, labels: tuple[str, ...]) -> HeadSpec:
        """A head recorded before options were typed: options inside the labels."""
        return HeadSpec(task, labels)

    # ---------------------------------------------------------------- parameters

    def init(self, config: Any, head: HeadSpec) -> Callable[[jax.Array], Any]:
        """`rng -> boxed parameters` of the whole model (shapes and logical axes for placing
        a checkpoint on a mesh; fresh values for a new run)."""
        raise NotImplementedError

    def warm_start(
        self, config: Any, head: HeadSpec, source: Any, params: Any, fresh: Any
    ) -> tuple[Any, str, bool]:
        """A new run's first parameters from `source`'s (a rundir.Run and its parameters):
        (params, the line saying what was taken, whether the head starts fresh). `config` is
        the run's encoder config, `fresh` the run's own initialisation; the caller places
        the result on the run's mesh."""
        encoder = params[ENCODER]
        name = self.head_param
        if name and name in params and source.head == head:
            return (
                {**fresh, ENCODER: encoder, name: params[name]},
                f"Initialised the encoder and the {head.task} head from {source.path}",
                False,
            )
        note = f"Initialised the encoder from {source.path}"
        if name:
            note += f"; the {head.task} head starts fresh"
            if source.head is not None:
                note += f" (the checkpoint's head, {source.head.describe()}, is not this task's)"
        return {**fresh, ENCODER: encoder}, note, bool(name)

    # ---------------------------------------------------------------- transformers

    def transformers_head(self, head: HeadSpec) -> TransformersHead | None:
        """How the head travels in a transformers directory of any family (None: it does
        not)."""
        return None

    def head_from_transformers(
        self, hf_config: Mapping[str, Any], task_classes: Sequence[str]
    ) -> HeadSpec | None:
        """This capability's head, if config.json's architectures name one of its task
        classes (`task_classes`: their names without the family's prefix, e.g.
        "ForQuestionAnswering")."""
        return None

    def recognises(self, path: str | os.PathLike) -> bool:
        """Whether `path` is a directory in this capability's own format (one that is not a
        plain transformers BERT directory, e.g. sentence-transformers or EncoderDecoder)."""
        return False

    def open(self, path: str | os.PathLike, **overrides) -> Opened:
        """Reads a directory this capability `recognises`."""
        raise NotImplementedError

    def save(self, model: Any, directory: str | os.PathLike) -> None:
        """Writes a bertjax.Model of this capability as its transformers directory."""
        raise NotImplementedError


# What a head reads of the encoder (TransformersHead.reads).
POOLED = "pooled"  # the pooled row: a sequence head, [batch, outputs]
TOKENS = "tokens"  # every token: [batch, seq, outputs]


@dataclasses.dataclass(frozen=True)
class TransformersHead:
    """A capability's head as transformers' <Family><task_class> classes hold it, in no
    family's vocabulary. Its layers are not fixed here: the encoder's family builds the head
    from this description (bertjax.encoders.family.EncoderFamily.head), a linen module and
    the tensor map of every layer it has (ELECTRA's sequence head: dense -> GELU ->
    out_proj; BERT's: one dense layer after its pooler)."""

    task_class: str  # e.g. "ForSequenceClassification"; a family's class is prefix + this
    param: str  # the head's name in our tree and in transformers' ("classifier", "qa_outputs")
    outputs: int  # its width
    reads: str  # POOLED or TOKENS
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # extra config.json

    def __post_init__(self):
        if self.reads not in (POOLED, TOKENS):
            raise ValueError(f"reads={self.reads!r} is invalid: must be {POOLED!r} or {TOKENS!r}")


# The head of a replaced-token detector's discriminator (bertjax.pretrain.objectives.rtd),
# described as a task head is: one logit per token that it was replaced, read off the last
# hidden states, held by transformers' <Family>ForPreTraining where a family has that class
# (ElectraForPreTraining's discriminator_predictions); each family builds its own
# (EncoderFamily.head with this task class).
REPLACED_TOKENS = TransformersHead("ForPreTraining", "discriminator_head", 1, TOKENS)


_CAPABILITIES: list[Capability] = []
_BY_TASK: dict[str, Capability] = {}


def register(capability: Capability) -> Capability:
    """Adds a capability (bertjax.tasks does, for every package it lists)."""
    if capability in _CAPABILITIES:
        return capability
    taken = sorted(set(capability.tasks) & set(_BY_TASK))
    if taken:
        raise ValueError(f"task(s) {taken} are registered twice")
    _CAPABILITIES.append(capability)
    for task in capability.tasks:
        _BY_TASK[task] = capability
    return capability


def task_names() -> tuple[str, ...]:
    """Every registered task name, in registration order."""
    return tuple(_BY_TASK)


def get(task: str) -> Capability:
    """The capability that owns a task name."""
    if task not in _BY_TASK:
        raise ValueError(f"task={task!r} is invalid: must be one of {task_names()}")
    return _BY_TASK[task]


def of(head: HeadSpec) -> Capability:
    return _BY_TASK[head.task]


def head_from_transformers(hf_config: Mapping[str, Any], class_prefix: str) -> HeadSpec | None:
    """The head a transformers config.json names, asked of every capability: its
    architectures' task classes are those named <class_prefix>For<Task> (the family's)."""
    task_classes = tuple(
        name.removeprefix(class_prefix)
        for name in hf_config.get("architectures") or []
        if name.startswith(class_prefix + "For")
    )
    for capability in _CAPABILITIES:
        head = capability.head_from_transformers(hf_config, task_classes)
        if head is not None:
            return head
    return None


def recognising(path: str | os.PathLike) -> Capability | None:
    """The capability whose own directory format `path` is, if any."""
    for capability in _CAPABILITIES:
        if capability.recognises(path):
            return capability
    return None


def methods() -> tuple[str, ...]:
    """Every notebook method some capability serves."""
    return tuple(dict.fromkeys(m for c in _CAPABILITIES for m in c.notebook))


def serving(method: str) -> Sequence[Capability]:
    return [c for c in _CAPABILITIES if method in c.notebook]
