"""The GLUE suite: every task's sweep and seeds as fine-tuning runs, resumable, in one display.

    run_suite(settings, workdir) -> summary   the whole job behind `python evaluate.py`

Each run is one call of bertjax.finetune.loop.finetune, in its own work directory under the
suite's:

    <workdir>/<task>/<configuration>/seed_<n>/     a fine-tuning run directory (its
                          result.json, best/, metrics, log.txt with what it printed, and
                          predictions_dev*.tsv: its best epoch's predictions of the dev files,
                          timing.json: its wall and compile seconds)
    <workdir>/data/<task>/                         the hub's parquet files as GLUE's TSV files
    <workdir>/results.json, results.md             the table (bertjax.glue.results)
    <workdir>/submission/*.tsv, submission.zip     with config.submission
    <workdir>/step_<s>/...                         with config.steps: one suite per step,
                          and <workdir>/curve.{png,md,json} across them

A run whose result.json exists is finished and never redone; a killed suite, rerun, starts
the unfinished runs (a run that was under way resumes from its own checkpoint). Every run's
settings are checked before the first one starts, so a bad field or file fails in one line
with nothing run. A task that starts from another's (config.per_task.<task>.start_from, e.g.
RTE from MNLI) starts from that task's best configuration's median run, and runs after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Any

import jax
import tqdm

from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError
from bertjax.finetune import glue_tasks, loop
from bertjax.glue import curve as curve_lib
from bertjax.glue import files as files_lib
from bertjax.glue import results as results_lib
from bertjax.glue import submission as submission_lib
from bertjax.glue.settings import ALL_STEPS, SuiteSettings, run_config, run_settings
from bertjax.storage import fs

DATA_DIR = "data"
LOG_FILE = "log.txt"
TIMING_FILE = "timing.json"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
STEP_DIR = "step_{}"
# The dev files are predicted as extra "test" splits of each run, under these names.


@dataclasses.dataclass(frozen=True)
class Run:
    """One fine-tuning run of the suite."""

    task: str
    configuration: str  # the configuration's directory name
    values: tuple[tuple[str, Any], ...]  # (dotted fine-tuning field, value) of the sweep point
    seed: int
    step: int | None  # the pretraining checkpoint it starts from (None: init_from's own)
    directory: str  # relative to the suite's work directory


def configuration_name(values: tuple[tuple[str, Any], ...]) -> str:
    """A sweep point as a directory name: "learning_rate=3e-05,num_epochs=3"."""
    return ",".join(f"{field.rsplit('.', 1)[-1]}={value}" for field, value in values) or "default"


def order_tasks(settings: SuiteSettings, tasks: tuple[str, ...]) -> list[str]:
    """The tasks in the table's order, those that start from another task's run after it."""
    first = [t for t in tasks if not settings.plans[t].start_from]
    return first + [t for t in tasks if settings.plans[t].start_from]


def plan(settings: SuiteSettings, tasks: tuple[str, ...], steps: list[int | None]) -> list[Run]:
    """Every run of the suite, in the order they run."""
    runs = []
    for step in steps:
        prefix = "" if step is None else STEP_DIR.format(step) + "/"
        for task in order_tasks(settings, tasks):
            for values in settings.plans[task].configurations():
                name = configuration_name(values)
                for seed in settings.seeds:
                    directory = f"{prefix}{task}/{name}/seed_{seed}"
                    runs.append(Run(task, name, values, seed, step, directory))
    return runs


def kept_steps(init_from: str) -> list[int]:
    """The checkpoint steps a pretraining work directory holds."""
    directory = fs.path(init_from) / rundir.CHECKPOINT_DIR
    if fs.kind(directory) != "directory":
        raise ConfigError(
            f"config.steps: config.init_from={init_from!r} is not a work directory with "
            f"{rundir.CHECKPOINT_DIR}/; steps compare the checkpoints of one pretraining run"
        )
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def resolve_steps(settings: SuiteSettings) -> list[int | None]:
    """The pretraining steps the suite runs at ([None]: init_from as it is)."""
    if not settings.steps:
        return [None]
    kept = kept_steps(settings.init_from)
    if settings.steps == ALL_STEPS:
        if not kept:
            raise ConfigError(f"config.steps='all': {settings.init_from} holds no checkpoint")
        return list(kept)
    missing = [s for s in settings.steps if s not in kept]
    if missing:
        raise ConfigError(
            f"config.steps: {missing} not among the checkpoints of {settings.init_from}: {kept}"
        )
    return list(settings.steps)


def is_finished(directory: fs.AnyPath) -> bool:
    """Whether a run finished: its result.json is written last, after its predictions."""
    return fs.kind(directory / rundir.RESULT_FILE) == "file"


def read_runs(workdir: fs.AnyPath, runs: list[Run]) -> list[results_lib.ConfigurationRuns]:
    """The finished runs of one task's configurations, from their result.json files."""
    by_name: dict[str, results_lib.ConfigurationRuns] = {}
    for run in runs:
        result = json.loads((workdir / run.directory / rundir.RESULT_FILE).read_text())
        best = result["best"]
        entry = by_name.setdefault(
            run.configuration,
            results_lib.ConfigurationRuns(run.configuration, dict(run.values), []),
        )
        entry.runs.append(
            results_lib.RunScores(run.seed, run.directory, best["scores"], best["epoch"])
        )
    return list(by_name.values())


@contextlib.contextmanager
def _captured(path: fs.AnyPath | None):
    """What a run prints (its progress bar included) goes to its log file (None: nowhere, on
    the processes other than the first), so that the suite's one progress display stays
    readable."""
    with (
        path.open("w") if path is not None else open(os.devnull, "w") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        yield


def run_suite(settings: SuiteSettings, workdir: str, *, after_run=None) -> dict:
    """Runs (or resumes) the suite in workdir; writes and prints its table; returns a summary.

    `after_run(run)` is called after each run that this call finished (tests stop a suite
    there, as a kill would).
    """
    start = time.time()
    workdir = fs.makedirs(workdir)
    is_main = jax.process_index() == 0
    steps = resolve_steps(settings)
    tasks = settings.tasks if steps == [None] else settings.curve_tasks
    located, skipped = {}, {}
    for name in tasks:
        task = glue_tasks.GLUE_TASKS[name]
        found = files_lib.locate(settings.data_dir, task, fs.join(workdir, DATA_DIR))
        if found is None:
            skipped[name] = (
                f"no {task.title}/ (GLUE's download) or {task.name}/ (the hub's "
                f"parquet files) in {settings.data_dir}"
            )
        else:
            located[name] = found
    present = tuple(t for t in tasks if t in located)
    if not present:
        raise ConfigError(
            f"config.data_dir={settings.data_dir!r}: holds none of the tasks {list(tasks)} "
            "(GLUE's download: CoLA/, SST-2/, ...; the hub's parquet layout: cola/, sst2/, ...)"
        )
    for name, why in skipped.items():
        print(f"skipped {glue_tasks.GLUE_TASKS[name].title}: {why}", flush=True)
    runs = plan(settings, present, steps)
    for name in sorted({r.task for r in runs if not is_finished(workdir / r.directory)}):
        files_lib.check_labels(located[name])
    # Every run's settings checked before anything runs (a run that starts from another
    # task's is checked against init_from, its stand-in).
    for run in runs:
        run_settings(
            run_config(settings, run, located[run.task].directory, settings.init_from), run.step
        )

    done = sum(is_finished(workdir / run.directory) for run in runs)
    bar = tqdm.tqdm(
        total=len(runs), initial=done, unit="run", file=sys.stderr, dynamic_ncols=True,
        disable=not is_main, desc="GLUE",
    )  # fmt: skip
    executed = []
    try:
        for run in runs:
            directory = workdir / run.directory
            if is_finished(directory):
                continue
            init_from, _ = _init_from(settings, workdir, run, runs)
            config = run_config(settings, run, located[run.task].directory, init_from)
            finetune_settings = run_settings(
                config, None if init_from != settings.init_from else run.step
            )
            bar.set_postfix_str(run.directory)
            fs.makedirs(directory)
            log = directory / LOG_FILE
            try:
                with _captured(log if is_main else None):
                    summary = loop.finetune(finetune_settings, directory)
            except BaseException:
                bar.write(f"{run.directory} stopped; what it printed is in {log}")
                raise
            if summary["preempted"]:
                raise KeyboardInterrupt  # the run saved its state; rerunning resumes it
            timing = {
                k: summary.get(k) for k in ("wall_time_sec", "compile_sec", "programs_compiled")
            }
            if is_main:
                rundir.write_text(directory / TIMING_FILE, json.dumps(timing) + "\n")
            executed.append(run.directory)
            # The next run traces its steps afresh, so the finished run's programs only hold
            # memory: on a CPU each keeps about 9 memory mappings, and a sweep of a hundred
            # runs in one process would reach Linux's limit per process (vm.max_map_count,
            # 65,530), where the next compile crashes the process.
            jax.clear_caches()
            bar.update(1)
            if after_run is not None:
                after_run(run)
    finally:
        bar.close()

    reports = {}
    for step in steps:
        step_runs = [r for r in runs if r.step == step]
        # What each task that starts from another's started from (every run is done now).
        notes = list(dict.fromkeys(_init_from(settings, workdir, r, runs)[1] for r in step_runs))
        task_results = {
            task: results_lib.task_result(
                glue_tasks.GLUE_TASKS[task],
                read_runs(workdir, [r for r in step_runs if r.task == task]),
            )
            for task in present
        }
        report = results_lib.report(
            task_results,
            init_from=settings.init_from,
            step=step,
            skipped=skipped,
            notes=[note for note in notes if note],
        )
        target = workdir if step is None else workdir / STEP_DIR.format(step)
        if is_main:
            rundir.write_text(target / RESULTS_JSON, results_lib.dumps(report))
            rundir.write_text(target / RESULTS_MD, results_lib.markdown(report))
        reports[step] = report
    summary = {
        "workdir": str(workdir),
        "runs": len(runs),
        "executed": executed,
        "skipped": skipped,
        "wall_time_sec": time.time() - start,
    }
    if steps != [None]:
        summary["curve"] = curve_lib.write(reports, workdir) if is_main else None
        if is_main:
            print(curve_lib.markdown(reports), flush=True)
    else:
        summary["report"] = reports[None]
        if is_main:
            print(results_lib.markdown(reports[None]), flush=True)
        if settings.submission:
            summary["submission"] = submission_lib.write(
                reports[None], workdir, settings.data_dir, fs.join(workdir, DATA_DIR), located
            )
    return summary


def _init_from(
    settings: SuiteSettings, workdir: fs.AnyPath, run: Run, runs: list[Run]
) -> tuple[str, str]:
    """What a run starts from, and a note when it is not what its task asked for."""
    source = settings.plans[run.task].start_from
    if not source:
        return settings.init_from, ""
    source_runs = [r for r in runs if r.task == source and r.step == run.step]
    if not source_runs:
        return settings.init_from, (
            f"{run.task} starts from config.init_from: {source}, which it would start from, "
            "is not in this suite"
        )
    result = results_lib.task_result(glue_tasks.GLUE_TASKS[source], read_runs(workdir, source_runs))
    chosen = results_lib.median_run(result)
    return str(workdir / chosen), f"{run.task} starts from {source}'s run {chosen}"
