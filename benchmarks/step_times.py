"""Where a fine-tuning command's time goes: its training steps, width by width.

    python -m benchmarks.step_times [--torch_model DIR] -- <finetune.py's flags>

runs finetune.py in this process with every training step waited for and timed, and prints,
for each batch width, the number of steps, the median steady step and the first call (which
also traces, lowers and compiles or loads the width's program); then the steady steps' total,
the cores they kept busy, and the time outside the steps. With --torch_model (a directory
transformers' AutoModelForSequenceClassification opens, e.g. the ModernBERT that
benchmarks.modernbert_finetune writes), the batch of each width's median step is also run
through transformers' train step (its real lengths padded to its longest, as a length-sorted
torch loop pads; random token ids; float32, torch's AdamW, the harness's torch loop), median
of --torch_rounds after one untimed step, beside bertjax's. Every step is timed by
benchmarks.harness.timing (its wall and CPU time).

Only classification-like tasks with `input_ids` / `input_mask` batches are timed on the torch
side; the bertjax side times any finetune.py command (with micro-batches grouped by length, a
step is filed under its first micro-batch's width). Figures: docs/modernbert-unpadded.md.
"""

import argparse
import collections
import runpy
import sys
import time
from typing import Any

import numpy as np

from benchmarks.harness import commands, report, timing
from bertjax.engine import steps


def run_timed(finetune_flags: list[str]) -> tuple[list[dict], float]:
    """finetune.py's command in this process with each step timed: (one record per step,
    wall seconds)."""
    records = []
    take_step = steps.Steps.take_step

    def timed(self, state, local, rng):
        batch = local if isinstance(local, dict) else local[0]
        width = batch["input_mask"].shape[1]
        out = []
        found = timing.time_call(
            lambda: out.append(take_step(self, state, local, rng)) or out[0],
            rounds=1,
            warmup=0,
            cpu_clock=time.process_time,
        )
        records.append(
            {
                "width": width,
                "seconds": found.median,
                "cpu": found.cpu[0],
                "first": all(r["width"] != width for r in records),
                "lengths": np.asarray(batch["input_mask"]).sum(axis=1),
            }
        )
        return out[0]

    steps.Steps.take_step = timed
    script = str(commands.REPO / "finetune.py")
    argv, sys.argv = sys.argv, [script, *finetune_flags]
    elapsed = timing.stopwatch()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    finally:
        steps.Steps.take_step = take_step
        sys.argv = argv
    return records, elapsed()


def torch_step_seconds(model_dir: str, lengths: np.ndarray, rounds: int) -> float:
    """transformers' train step on rows of `lengths` tokens padded to the longest (median of
    `rounds` after one untimed step)."""
    from benchmarks.harness import reference  # torch: only with --torch_model

    torch, transformers = reference.torch, reference.transformers
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    rng = np.random.default_rng(0)
    width = int(lengths.max())
    batch = {
        "input_ids": torch.tensor(
            rng.integers(5, model.config.vocab_size - 5, (len(lengths), width))
        ),
        "attention_mask": torch.tensor(
            (np.arange(width)[None] < lengths[:, None]).astype(np.int64)
        ),
        "labels": torch.tensor(rng.integers(0, model.config.num_labels, len(lengths))),
    }
    return timing.time_call(
        lambda: reference.train(model, [batch], optimizer), rounds=rounds, warmup=1
    ).median


def main(argv=None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch_model", default="", help="time transformers' step too")
    parser.add_argument("--torch_rounds", type=int, default=5)
    report.add_json_flag(parser)
    parser.add_argument("finetune_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    flags = [f for f in args.finetune_flags if f != "--"]
    records, wall = run_timed(flags)
    # After the command: it sets up jax's CPU client itself (bertjax.engine.host_memory).
    machine = report.start("step_times", argv)
    if not records:
        raise SystemExit("the command took no training step (a finished run resumes to its end)")
    by_width = collections.defaultdict(list)
    for record in records:
        by_width[record["width"]].append(record)
    steady = [r for r in records if not r["first"]]
    steady_seconds = sum(r["seconds"] for r in steady)
    print(f"\n{len(records)} training steps, {len(by_width)} widths; the command: {wall:.1f} s")
    header = "width  steps  steady median  first call"
    if args.torch_model:
        header += "  torch, the median step's batch  torch / bertjax"
    print(header)
    figures: dict[str, Any] = {"steps": len(records), "command s": wall, "widths": {}}
    for width in sorted(by_width):
        rows = by_width[width]
        first = next(r for r in rows if r["first"])
        later = [r["seconds"] for r in rows if not r["first"]]
        median = float(np.median(later)) if later else float("nan")
        line = f"{width:5d}  {len(rows):5d}  {median:11.3f} s  {first['seconds']:8.2f} s"
        figures["widths"][width] = {
            "steps": len(rows),
            "median s": median,
            "first s": first["seconds"],
        }
        if args.torch_model:
            # The batch of the median steady step (the first, where the width has no other).
            typical = min(rows[1:] or rows, key=lambda r: abs(r["seconds"] - median))
            torch_seconds = torch_step_seconds(
                args.torch_model, typical["lengths"], args.torch_rounds
            )
            line += f"  {torch_seconds:20.3f} s  {torch_seconds / median:14.2f}x"
            figures["widths"][width]["torch s"] = torch_seconds
        print(line)
    cores = sum(r["cpu"] for r in steady) / max(steady_seconds, 1e-9)
    firsts = sum(r["seconds"] for r in records if r["first"])
    print(
        f"steady steps {steady_seconds:.1f} s ({cores:.2f} cores busy), first calls "
        f"{firsts:.1f} s, outside the steps {wall - steady_seconds - firsts:.1f} s"
    )
    figures |= {"steady s": steady_seconds, "cores busy": cores, "first calls s": firsts}
    args.finetune_flags = flags
    report.finish("step_times", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
