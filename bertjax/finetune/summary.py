"""What a finished (or preempted) fine-tuning run reports: every seed's best evaluation, their
median over several seeds (seeds.json), the time spent compiling, and the notebook call that
fits the trained model."""

from __future__ import annotations

import json
import statistics

import jax

from bertjax import capability
from bertjax.engine import rundir
from bertjax.storage import fs


def seed_summary(settings, results: list[dict], workdir: fs.AnyPath, seconds: float) -> dict:
    """The run's summary over its seeds' results; writes seeds.json when there are several."""
    values = [r["best"]["value"] for r in results if r.get("best")]
    summary = {
        "workdir": str(workdir),
        "metric": settings.run.metric,
        "seeds": results,
        "wall_time_sec": seconds,
        "preempted": any(r["preempted"] for r in results),
        # The notebook call that fits this run's kind of model.
        "usage": capability.get(settings.task).usage,
    }
    if len(settings.run.seeds) > 1 and len(values) == len(settings.run.seeds):
        summary["median"] = statistics.median(values)
        if jax.process_index() == 0:
            record = {
                "metric": settings.run.metric,
                "median": summary["median"],
                "seeds": {str(r["seed"]): r["best"]["value"] for r in results},
            }
            rundir.write_text(workdir / rundir.SEEDS_FILE, json.dumps(record, indent=2) + "\n")
    return summary


def print_summary(summary: dict) -> None:
    """Prints the summary: each seed's best, the median, wall and compile time, usage."""
    lines = [
        "",
        "Fine-tuning stopped for preemption" if summary["preempted"] else "Fine-tuning finished",
    ]
    for r in summary["seeds"]:
        best = r.get("best")
        shown = f"{best['metric']} {best['value']:.4f} (epoch {best['epoch']})" if best else "-"
        lines.append(f"  seed {r['seed']}: best {shown}  in {r['workdir']}")
        for path in r.get("predictions", []):
            lines.append(f"    predictions: {path}")
    if "median" in summary:
        lines.append(f"  median over {len(summary['seeds'])} seeds: {summary['median']:.4f}")
    wall = summary["wall_time_sec"]
    compiling = summary.get("compile_sec", 0.0)
    lines.append(
        f"  wall time: {wall:.1f} s, of which compiling {compiling:.1f} s "
        f"({100 * compiling / max(wall, 1e-9):.0f} %, {summary.get('programs_compiled', 0)} "
        f"programs compiled, {summary.get('programs_loaded', 0)} loaded from the compilation "
        "cache)"
    )
    first = summary["seeds"][0]["workdir"]
    lines.append(f"  use it:    bertjax.Model.load({first!r}).{summary['usage']}")
    print("\n".join(lines), flush=True)
