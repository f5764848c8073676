"""A GLUE suite's settings, read once from its ConfigDict (configs/glue.py).

`SuiteSettings.from_config(config)` is the edge. The suite's fine-tuning runs share
`config.finetune` (a configs/finetune.py config); a sweep or a task's own fields name a
field of it by its last name (learning_rate is optimizer.learning_rate, num_epochs is
num_epochs) or by its dotted name. A name that is no field of it, a task that GLUE does not
have, a start_from that is not a task of the suite: one line naming the config field.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
from typing import Any

import jax
import ml_collections

from bertjax.engine.settings import ConfigError
from bertjax.finetune import glue_tasks, layouts
from bertjax.finetune.settings import FinetuneSettings
from bertjax.storage import fs

# config.steps: every checkpoint a pretraining run kept.
ALL_STEPS = "all"
# What a run calls its predictions of the dev files (dev, dev_matched, ...).
DEV = "dev"


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """How one task is run: its fixed fields, its sweep and what it starts from."""

    fields: tuple[tuple[str, Any], ...]  # (dotted fine-tuning field, value) for every run
    sweep: tuple[tuple[str, tuple[Any, ...]], ...]  # (dotted field, values tried)
    start_from: str  # a task whose best run this one starts from ("": config.init_from)

    def configurations(self) -> list[tuple[tuple[str, Any], ...]]:
        """Every point of the sweep: ((field, value), ...) in the sweep's order."""
        fields = [field for field, _ in self.sweep]
        return [
            tuple(zip(fields, values)) for values in itertools.product(*(v for _, v in self.sweep))
        ]


@dataclasses.dataclass(frozen=True)
class SuiteSettings:
    """Everything a GLUE suite needs, validated (the runs' own settings are checked by
    bertjax.finetune.settings when the suite is planned)."""

    init_from: str
    data_dir: str
    tasks: tuple[str, ...]  # in the table's order (bertjax.finetune.glue_tasks.GLUE_TASKS)
    seeds: tuple[int, ...]
    plans: dict[str, TaskPlan]  # per task
    finetune: dict  # the fine-tuning config every run starts from
    steps: tuple[int, ...] | str  # pretraining steps to compare, ALL_STEPS, or () for none
    curve_tasks: tuple[str, ...]  # the tasks run at each of those steps
    submission: bool  # predict the test files and write the leaderboard's zip

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> SuiteSettings:
        """Reads and validates a GLUE suite config (configs/glue.py)."""
        return _read(config)


def _fail(field: str, value: Any, message: str) -> ConfigError:
    return ConfigError(f"config.{field}={value!r}: {message}")


def _leaf_fields(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    out = []
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            out.extend(_leaf_fields(value, prefix + key + "."))
        else:
            out.append(prefix + key)
    return out


# Fine-tuning fields each run gets from the suite: a sweep or a task's fields may not set them.
SUITE_FIELDS = {
    "init_from": "config.init_from (or per_task.<task>.start_from)",
    "task": "the GLUE task",
    "seeds": "config.seeds",
    "data.glue_task": "the GLUE task",
    "data.dir": "config.data_dir",
    "data.train": "config.data_dir",
    "data.validation": "config.data_dir",
    "data.test": "config.data_dir",
}


def resolve_field(finetune: ml_collections.ConfigDict, name: str, where: str) -> str:
    """The dotted fine-tuning field `name` means: itself if it is one, else the one field
    whose last name it is; `where` names the config field, for the message."""
    fields = _leaf_fields(finetune)
    matches = [name] if name in fields else [f for f in fields if f.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        if matches[0] in SUITE_FIELDS:
            raise ConfigError(
                f"config.{where}: each run's {matches[0]} comes from {SUITE_FIELDS[matches[0]]}"
            )
        return matches[0]
    if matches:
        raise ConfigError(f"config.{where}: {name!r} is ambiguous; write one of {matches}")
    leaves = {f.rsplit(".", 1)[-1]: f for f in fields}
    close = difflib.get_close_matches(name, [*leaves, *fields], n=1, cutoff=0.6)
    guess = leaves.get(close[0], close[0]) if close else None
    hint = f"; did you mean {guess!r}?" if guess else ""
    raise ConfigError(
        f"config.{where}: {name!r} is not a field of the fine-tuning config "
        f"(configs/finetune.py){hint}"
    )


def _values(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _sweep(finetune, section: ml_collections.ConfigDict, where: str):
    sweep = []
    for name, values in section.items():
        field = resolve_field(finetune, name, f"{where}.{name}")
        values = _values(values)
        if not values:
            raise _fail(f"{where}.{name}", values, "give at least one value to try")
        if len(set(map(repr, values))) != len(values):
            raise _fail(f"{where}.{name}", values, "each value once")
        sweep.append((field, values))
    return tuple(sweep)


def _names(config, field: str) -> tuple[str, ...]:
    try:
        return glue_tasks.parse_names(config[field])
    except ValueError as err:
        raise _fail(field, config[field], str(err)) from None


def _read(config: ml_collections.ConfigDict) -> SuiteSettings:
    for field in ("init_from", "data_dir"):
        value = config[field]
        if not value:
            raise _fail(field, value, _REQUIRED[field])
        if fs.kind(value) != "directory":
            raise _fail(field, value, "no such directory")
    tasks = _names(config, "tasks")
    if not tasks:
        raise _fail("tasks", config.tasks, f"name at least one of {list(glue_tasks.GLUE_TASKS)}")
    seeds = _values(config.seeds)
    if (
        not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise _fail("seeds", config.seeds, "must be distinct integers >= 0, e.g. 1,2,3")
    finetune = config.finetune
    shared = _sweep(finetune, config.sweep, "sweep")
    per_task = config.per_task
    for name in per_task:
        if name not in glue_tasks.GLUE_TASKS:
            raise ConfigError(
                f"config.per_task.{name}: not a GLUE task; the tasks are "
                f"{list(glue_tasks.GLUE_TASKS)}"
            )
    plans = {}
    for task in glue_tasks.GLUE_TASKS:
        own = per_task.get(task, ml_collections.ConfigDict())
        unknown = sorted(set(own) - {"fields", "sweep", "start_from"})
        if unknown:
            raise ConfigError(
                f"config.per_task.{task}: unknown entries {unknown}; a task may set fields, "
                "sweep and start_from"
            )
        fields = tuple(
            (resolve_field(finetune, k, f"per_task.{task}.fields.{k}"), v)
            for k, v in own.get("fields", {}).items()
        )
        sweep = dict(shared)
        sweep.update(
            _sweep(
                finetune, own.get("sweep", ml_collections.ConfigDict()), f"per_task.{task}.sweep"
            )
        )
        start_from = own.get("start_from", "") or ""
        if start_from:
            if start_from not in glue_tasks.GLUE_TASKS or start_from == task:
                raise _fail(
                    f"per_task.{task}.start_from",
                    start_from,
                    "must be another GLUE task (e.g. mnli), or empty",
                )
        plans[task] = TaskPlan(fields, tuple(sweep.items()), start_from)
    for task in tasks:
        source = plans[task].start_from
        if source and plans[source].start_from:
            raise _fail(
                f"per_task.{source}.start_from",
                plans[source].start_from,
                f"{task} starts from {source}, which must itself start from config.init_from",
            )
    steps = _steps(config.steps)
    curve_tasks = _names(config, "curve_tasks")
    if steps and not curve_tasks:
        raise _fail("curve_tasks", config.curve_tasks, "name the tasks run at each step")
    if not isinstance(config.submission, bool):
        raise _fail("submission", config.submission, "must be True or False")
    if config.submission and steps:
        raise _fail("submission", True, "predicts with one model's runs; leave config.steps empty")
    return SuiteSettings(
        init_from=config.init_from,
        data_dir=config.data_dir,
        tasks=tasks,
        seeds=seeds,
        plans=plans,
        finetune=finetune.to_dict(),
        steps=steps,
        curve_tasks=curve_tasks,
        submission=config.submission,
    )


_REQUIRED = {
    "init_from": "set it to the model to evaluate: a pretraining work directory, a fine-tuned "
    "one, or a transformers directory (local or gs://)",
    "data_dir": "set it to the directory holding GLUE's task directories (CoLA/, SST-2/, ... "
    "as GLUE's download has them, or cola/, sst2/, ... with the hub's parquet files)",
}


def _steps(value: Any) -> tuple[int, ...] | str:
    if value in ("", None, ()):
        return ()
    if value == ALL_STEPS:
        return ALL_STEPS
    parts = value.split(",") if isinstance(value, str) else list(_values(value))
    try:
        steps = tuple(int(str(p).strip()) for p in parts if str(p).strip())
    except ValueError:
        steps = ()
    if not steps or any(s < 0 for s in steps) or len(set(steps)) != len(steps):
        raise _fail(
            "steps", value, f"must be checkpoint steps, e.g. 1000,2000,3000, or {ALL_STEPS!r}"
        )
    return tuple(sorted(steps))


def run_config(
    settings: SuiteSettings, run, data_dir: str, init_from: str
) -> ml_collections.ConfigDict:
    """The fine-tuning config of one run (bertjax.glue.suite.Run: its task, sweep point and
    seed): config.finetune, the task's fields, the sweep point, the task's GLUE files and the
    seed."""
    config = ml_collections.ConfigDict(copy.deepcopy(settings.finetune))
    for field, value in (*settings.plans[run.task].fields, *run.values):
        *parents, name = field.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        try:
            node[name] = value
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{run.task}: fine-tuning field {field}={value!r}: {err}") from None
    config.init_from = init_from
    config.task = ""
    config.data.glue_task = run.task
    config.data.dir = data_dir
    config.data.train = config.data.validation = config.data.test = ""
    config.seeds = (run.seed,)
    return config


def run_settings(config: ml_collections.ConfigDict, step: int | None) -> FinetuneSettings:
    """A run's fine-tuning settings: its dev files predicted (as splits named dev, dev_matched,
    ...) in place of the test files, which only a submission predicts."""
    settings = FinetuneSettings.from_config(config, process_count=jax.process_count())
    dev = tuple(
        (DEV + name[len(layouts.VALIDATION) :], path) for name, path in settings.data.validation
    )
    data = dataclasses.replace(settings.data, test=dev)
    return dataclasses.replace(settings, data=data, init_step=step)
