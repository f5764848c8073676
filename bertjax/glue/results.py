"""A suite's table: each task's best configuration by its median over seeds, the GLUE average,
and the published rows beside it, as results.json and results.md.

    task_result(task, configurations)    -> one task's entry (every run's figures kept)
    glue_average(task results)           -> the average and the tasks it covers
    report(task results, ...)            -> what results.json holds
    markdown(report)                     -> results.md (also printed at the end)

A configuration's figure for a metric is the median of that metric over its seeds (as BERT,
RoBERTa, ELECTRA and ModernBERT report); the best configuration is the one with the highest
median of the task's selection metric (bertjax.finetune.glue_tasks.GlueTask.selection_key). The
GLUE average follows the benchmark's rule (Wang et al. 2019): a task with two metrics scores
their mean (MRPC and QQP: F1 and accuracy; STS-B: Pearson and Spearman; MNLI: matched and
mismatched accuracy), and the average is the mean of the task scores over the eight tasks
without WNLI, as the papers leave it out.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any

from bertjax.finetune import glue_tasks
from bertjax.finetune.glue_tasks import GlueTask
from bertjax.glue import published as published_lib

AVERAGE_RULE = (
    "mean of the task scores over CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI and RTE (WNLI "
    "left out, as the papers do); a task with two metrics scores their mean (MRPC, QQP: F1 "
    "and accuracy; STS-B: Pearson and Spearman; MNLI: matched and mismatched accuracy)"
)


@dataclasses.dataclass(frozen=True)
class RunScores:
    """One finished fine-tuning run of a configuration: its seed and best epoch's scores."""

    seed: int
    directory: str
    scores: dict[str, float]  # the run's result.json best["scores"]
    epoch: int


@dataclasses.dataclass(frozen=True)
class ConfigurationRuns:
    """The runs of one configuration of a task's sweep."""

    name: str
    values: dict[str, Any]  # dotted fine-tuning field -> value
    runs: list[RunScores]


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def task_result(task: GlueTask, configurations: list[ConfigurationRuns]) -> dict:
    """One task's entry: the best configuration's medians, and every configuration's runs."""
    entries = []
    for configuration in configurations:
        medians = {
            m.name: _median([r.scores[m.key] for r in configuration.runs]) for m in task.metrics
        }
        entries.append(
            {
                "name": configuration.name,
                "values": configuration.values,
                "medians": medians,
                "selection": _median([r.scores[task.selection_key] for r in configuration.runs]),
                "runs": [
                    {
                        "seed": r.seed,
                        "directory": r.directory,
                        "epoch": r.epoch,
                        "metrics": {m.name: r.scores[m.key] for m in task.metrics},
                        "selection": r.scores[task.selection_key],
                    }
                    for r in configuration.runs
                ],
            }
        )
    # The first of equal ones wins: the sweep's order decides ties.
    best = max(range(len(entries)), key=lambda k: (entries[k]["selection"], -k))
    chosen = entries[best]
    return {
        "task": task.name,
        "title": task.title,
        "metrics": chosen["medians"],
        "score": sum(chosen["medians"].values()) / len(chosen["medians"]),
        "selection_metric": task.selection_key,
        "configuration": chosen["name"],
        "values": chosen["values"],
        "seeds": len(chosen["runs"]),
        "configurations": entries,
    }


def median_run(task_result_: dict) -> str:
    """The directory of the best configuration's median run by the selection metric (the
    lower of the middle two with an even number of seeds): the run that stands for the task
    (what RTE starts from, what predicts the test file)."""
    chosen = next(
        c for c in task_result_["configurations"] if c["name"] == task_result_["configuration"]
    )
    ordered = sorted(chosen["runs"], key=lambda r: (r["selection"], r["seed"]))
    return ordered[(len(ordered) - 1) // 2]["directory"]


def glue_average(results: dict[str, dict]) -> dict:
    """The GLUE average (AVERAGE_RULE) of the tasks present, and which they are."""
    counted = [t.name for t in glue_tasks.GLUE_TASKS.values() if t.in_average and t.name in results]
    missing = [
        t.name for t in glue_tasks.GLUE_TASKS.values() if t.in_average and t.name not in results
    ]
    value = sum(results[t]["score"] for t in counted) / len(counted) if counted else None
    return {"value": value, "tasks": counted, "missing": missing, "rule": AVERAGE_RULE}


def report(
    results: dict[str, dict],
    *,
    init_from: str,
    step: int | None,
    skipped: dict[str, str],
    notes: list[str],
) -> dict:
    """What results.json holds: the tasks, the average, the published rows."""
    return {
        "init_from": init_from,
        "step": step,
        "tasks": results,
        "average": glue_average(results),
        "skipped": skipped,
        "notes": notes,
        "published": [
            {
                "model": row.model,
                "split": row.split,
                "scores": {f"{task}/{metric}": v for (task, metric), v in row.scores.items()},
                "average": row.average,
                "source": row.source,
                "note": row.note,
            }
            for row in published_lib.ROWS
        ],
    }


def _percent(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def markdown(report_: dict) -> str:
    """results.md: our row beside the published ones, then the winning configurations and
    every configuration's medians."""
    results = report_["tasks"]
    rows = published_lib.ROWS
    head = ["Task", "Metric", "ours", *(f"{r.model} ({r.split})" for r in rows)]
    lines = [
        f"# GLUE dev results: {report_['init_from']}"
        + (f" at step {report_['step']}" if report_["step"] is not None else ""),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for task in glue_tasks.GLUE_TASKS.values():
        for metric in task.metrics:
            ours = (
                _percent(results[task.name]["metrics"][metric.name]) if task.name in results else ""
            )
            theirs = [r.scores.get((task.name, metric.name)) for r in rows]
            if not ours and all(v is None for v in theirs):
                continue
            cells = ["" if v is None else f"{v:.1f}" for v in theirs]
            lines.append(
                f"| {task.title} | {metric.label} | {ours or '-'} | " + " | ".join(cells) + " |"
            )
    average = report_["average"]
    published = ["" if r.average is None else f"{r.average:.1f}" for r in rows]
    ours = _percent(average["value"]) or "-"
    if average["missing"]:
        ours += (
            f" ({len(average['tasks'])} of {len(average['tasks']) + len(average['missing'])} tasks)"
        )
    lines.append("| **Average** |  | " + ours + " | " + " | ".join(published) + " |")
    lines += ["", f"Average: {average['rule']}."]
    if average["missing"]:
        lines.append(f"Not in this average (not run): {', '.join(average['missing'])}.")
    lines += [
        "",
        "## Winning configurations",
        "",
        "| Task | Configuration | Seeds | Selected by |",
        "|---|---|---|---|",
    ]
    for entry in results.values():
        lines.append(
            f"| {entry['title']} | {entry['configuration']} | {entry['seeds']} | "
            f"{entry['selection_metric']} |"
        )
    lines += ["", "## Every configuration (medians over seeds)", ""]
    for entry in results.values():
        for configuration in entry["configurations"]:
            figures = ", ".join(f"{k} {_percent(v)}" for k, v in configuration["medians"].items())
            lines.append(f"- {entry['title']} {configuration['name']}: {figures}")
    if report_["skipped"]:
        lines += ["", "## Skipped", ""]
        lines += [f"- {task}: {why}" for task, why in report_["skipped"].items()]
    if report_["notes"]:
        lines += ["", "## Notes", ""]
        lines += [f"- {note}" for note in report_["notes"]]
    lines += ["", "## Sources of the published rows", ""]
    for row in rows:
        lines.append(f"- {row.model}: {row.source}" + (f"; {row.note}" if row.note else ""))
    return "\n".join(lines) + "\n"


def dumps(report_: dict) -> str:
    """results.json's text."""
    return json.dumps(report_, indent=2) + "\n"
