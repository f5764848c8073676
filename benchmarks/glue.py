"""The GLUE suite's wall time on a reduced sweep, split into compiling, training and evaluating.

    python -m benchmarks.glue --init_from runs/tiny                  # synthetic GLUE-shaped data
    python -m benchmarks.glue --init_from MiniLM/ --data_dir glue/ --tasks sst2,mrpc,stsb,rte

Runs `evaluate.py`'s suite (bertjax.glue.suite.run_suite) with configs/glue.py and one
learning rate and one seed per task (--learning_rates, --seeds widen it) in a fresh work
directory, and prints per task and in total: the wall time of its runs, the part spent
tracing and compiling (bertjax.engine.perf.CompileTime, which each run's summary reports), the part
spent evaluating (every pass of bertjax.finetune.evaluation.run_eval: each epoch's dev scores and
the dev predictions, less the compiling inside them), and the rest (training steps, reading
and encoding the data, checkpoints). Without --data_dir the tasks' files are synthetic:
GLUE's download layout with --examples training and --examples / 4 dev rows of random
words, the labels a function of the words (so the numbers measure time, not learning).

evaluate.py keeps jax's persistent compilation cache (bertjax.engine.compilation_cache); set
JAX_COMPILATION_CACHE_DIR (and JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0, as the
commands do) to measure with it here. The
host is often shared: rerun and compare within one run rather than across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from typing import Any

from benchmarks.harness import report, timing
from bertjax.engine import perf
from bertjax.finetune import evaluation
from bertjax.glue import suite
from bertjax.glue.settings import SuiteSettings
from configs import glue as glue_recipe

WORDS = [f"{a}{b}" for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en")]
# (directory, header of labelled files, text columns, label of an example's word parity)
LAYOUTS = {
    "sst2": ("SST-2", "sentence\tlabel", 1, ("0", "1")),
    "mrpc": ("MRPC", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", 2, ("0", "1")),
    "stsb": ("STS-B", "index\tsentence1\tsentence2\tscore", 2, ("1.0", "4.0")),
    "rte": ("RTE", "index\tsentence1\tsentence2\tlabel", 2, ("entailment", "not_entailment")),
    "qnli": ("QNLI", "index\tquestion\tsentence\tlabel", 2, ("entailment", "not_entailment")),
    "cola": ("CoLA", None, 1, ("0", "1")),
}


def write_synthetic(root: str, tasks: list[str], examples: int) -> None:
    """GLUE's download layout for the tasks, of random words."""
    rng = random.Random(0)
    for task in tasks:
        directory, header, texts, labels = LAYOUTS[task]
        os.makedirs(os.path.join(root, directory), exist_ok=True)
        for name, count in (("train", examples), ("dev", max(8, examples // 4))):
            lines = [header] if header else []
            for k in range(count):
                parts = [" ".join(rng.choices(WORDS, k=rng.randint(6, 24))) for _ in range(texts)]
                label = labels[len(parts[0].split()) % 2]
                if task == "cola":
                    lines.append(f"src\t{label}\t\t{parts[0]}")
                elif task == "sst2":
                    lines.append(f"{parts[0]}\t{label}")
                elif task == "mrpc":
                    lines.append(f"{label}\t{k}\t{k}\t{parts[0]}\t{parts[1]}")
                else:
                    lines.append(f"{k}\t{parts[0]}\t{parts[1]}\t{label}")
            with open(os.path.join(root, directory, f"{name}.tsv"), "w") as f:
                f.write("\n".join(lines) + "\n")


RUN_EVAL = evaluation.run_eval


class EvalTimer:
    """Stands in for evaluation.run_eval: its wall time and the compiling inside it."""

    def __init__(self):
        self.seconds = 0.0
        self.compile_seconds = 0.0

    def __call__(self, *args, **kwargs):
        elapsed = timing.stopwatch()
        with perf.CompileTime() as compiling:
            out = RUN_EVAL(*args, **kwargs)
        self.seconds += elapsed()
        self.compile_seconds += compiling.seconds
        return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--init_from", required=True)
    parser.add_argument("--data_dir", default="")
    parser.add_argument("--tasks", default="sst2,mrpc,stsb,rte")
    parser.add_argument("--learning_rates", default="5e-5")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max_seq_length", type=int, default=128)
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    machine = report.start("glue", argv)

    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data_dir
        if not data_dir:
            data_dir = os.path.join(scratch, "glue")
            write_synthetic(data_dir, args.tasks.split(","), args.examples)
        config = glue_recipe.get_config()
        config.init_from = args.init_from
        config.data_dir = data_dir
        config.tasks = args.tasks
        config.seeds = tuple(int(s) for s in args.seeds.split(","))
        config.sweep.learning_rate = tuple(float(v) for v in args.learning_rates.split(","))
        config.finetune.num_epochs = args.epochs
        config.finetune.data.max_seq_length = args.max_seq_length
        settings = SuiteSettings.from_config(config)
        workdir = os.path.join(scratch, "suite")
        timers: dict[str, EvalTimer] = {}

        def timed(run):
            timers[run.directory] = evaluation.run_eval
            evaluation.run_eval = EvalTimer()

        # Each run's evaluation passes are timed by a fresh timer, swapped in between runs.
        evaluation.run_eval = EvalTimer()
        elapsed = timing.stopwatch()
        try:
            suite.run_suite(settings, workdir, after_run=timed)
        finally:
            evaluation.run_eval = RUN_EVAL
        wall = elapsed()

        rows, totals = [], [0.0, 0.0, 0.0, 0.0]
        for run in suite.plan(settings, settings.tasks, [None]):
            with open(os.path.join(workdir, run.directory, suite.TIMING_FILE)) as f:
                recorded = json.load(f)
            timer = timers[run.directory]
            evaluating = timer.seconds - timer.compile_seconds
            run_wall, compiling = recorded["wall_time_sec"], recorded["compile_sec"]
            figures = [run_wall, compiling, evaluating, run_wall - compiling - evaluating]
            totals = [a + b for a, b in zip(totals, figures)]
            rows.append((run.directory, *figures))
    print(f"suite wall time {wall:.1f} s ({len(rows)} runs; the rest is reading and tables)")
    print(f"{'run':40s} {'wall s':>8s} {'compile':>8s} {'eval':>8s} {'train+':>8s}")
    for name, *figures in rows + [("all runs", *totals)]:
        print(f"{name:40s} " + " ".join(f"{v:8.1f}" for v in figures))
    columns = ("wall s", "compile s", "eval s", "train+ s")
    figures = {"suite wall s": wall}
    figures |= {name: dict(zip(columns, values)) for name, *values in rows}
    figures["all runs"] = dict(zip(columns, totals))
    report.finish("glue", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
