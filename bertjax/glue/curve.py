"""Scores against pretraining step: whether a longer pretraining run is paying.

    write(reports by step, workdir) -> {"png", "md", "json"}: curve.png, curve.md, curve.json

Each step's report is a suite's (bertjax.glue.results.report); a task's point is its score
(the mean of its reported metrics, in percent), and "mean" the mean over the tasks run at
that step (the subset the curve runs, not GLUE's average unless all eight are there).
"""

from __future__ import annotations

import io
import json

from bertjax.finetune import glue_tasks
from bertjax.storage import fs

CURVE_PNG = "curve.png"
CURVE_MD = "curve.md"
CURVE_JSON = "curve.json"
MPL_EXTRA = "pip install 'bertjax[glue]'"


def points(reports: dict[int, dict]) -> dict:
    """{"steps": [...], "tasks": {task: [score per step]}, "mean": [...]} in percent."""
    steps = sorted(reports)
    names = [
        t.name
        for t in glue_tasks.GLUE_TASKS.values()
        if all(t.name in reports[s]["tasks"] for s in steps)
    ]
    series = {name: [100 * reports[s]["tasks"][name]["score"] for s in steps] for name in names}
    mean = (
        [sum(series[n][k] for n in names) / len(names) for k in range(len(steps))] if names else []
    )
    return {"steps": steps, "tasks": series, "mean": mean}


def markdown(reports: dict[int, dict]) -> str:
    """The curve's numbers as a table: one row per step."""
    data = points(reports)
    titles = [glue_tasks.GLUE_TASKS[n].title for n in data["tasks"]]
    lines = [
        "| Step | " + " | ".join(titles) + " | Mean |",
        "|" + "---|" * (len(titles) + 2),
    ]
    for k, step in enumerate(data["steps"]):
        cells = [f"{data['tasks'][n][k]:.1f}" for n in data["tasks"]]
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {data['mean'][k]:.1f} |")
    return "\n".join(lines) + "\n"


def png(data: dict) -> bytes:
    """The scores against step, one line per task and the mean, as PNG bytes."""
    try:
        import matplotlib  # optional: only the curve draws

        matplotlib.use("Agg")  # files, never a window
        from matplotlib import pyplot
    except ImportError:
        raise ImportError(f"drawing the curve needs matplotlib; {MPL_EXTRA}") from None
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for name, values in data["tasks"].items():
        axes.plot(data["steps"], values, marker="o", label=glue_tasks.GLUE_TASKS[name].title)
    axes.plot(data["steps"], data["mean"], marker="s", color="black", linewidth=2.5, label="mean")
    axes.set_xlabel("pretraining step")
    axes.set_ylabel("dev score (%)")
    axes.set_title("GLUE dev scores over pretraining")
    axes.grid(alpha=0.3)
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    return buffer.getvalue()


def write(reports: dict[int, dict], workdir) -> dict:
    """curve.png, curve.md and curve.json in workdir; their paths."""
    data = points(reports)
    paths = {kind: fs.join(workdir, name) for kind, name in
             (("png", CURVE_PNG), ("md", CURVE_MD), ("json", CURVE_JSON))}  # fmt: skip
    fs.write_bytes(paths["png"], png(data))
    fs.write_text(paths["md"], markdown(reports))
    fs.write_text(paths["json"], json.dumps(data, indent=2) + "\n")
    return paths
