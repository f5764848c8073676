"""Where a fine-tuning train step's time goes on a CPU, from XLA's own profile.

    python benchmarks/cpu_step.py [--model bert|modernbert] [--batch 32] [--width 256]
        [--micro_batches 8] [--matmul_dtype bfloat16] [--steps 3] [--trace_dir DIR]

A sequence classifier's train step (BERT at MiniLM's shape, L6/H384/A12, or ModernBERT
L6/H256/A4: benchmarks/compile_step.py's models) on `--batch` rows of random tokens, real
lengths drawn from half to all of `--width`, taken as `--micro_batches` micro-batches as
finetune.py's `--config.grad_accum_steps` does. After two untimed steps it times `--steps`,
then traces as many more with jax's profiler and sums what XLA's CPU runtime ran, by kind:

- products in a library (YNNPACK or XNNPACK fusions: XLA's bfloat16 and most float32 dots),
- products in Eigen (XLA's own dot thunks),
- loops (`while`: blocked attention's pass over its blocks, optimizer loops), counted
  without the operations inside them, which are counted by their own kind,
- copies and transposes (fusions rooted in a copy or a transpose),
- other fusions and operations (elementwise work, reductions, softmax, norms, gathers).

Times are each operation's own time, summed over the runtime's threads (an operation split
across both cores counts once, on the thread that ran it), per step; "of the step" divides
by the timed step's wall time, so the shares add up to more than 100 % where two operations
ran at once and to less where the cores waited. The trace is kept with --trace_dir (open its
perfetto_trace.json.gz at ui.perfetto.dev).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import pathlib
import re
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from compile_step import MODELS  # noqa: E402

from bertjax.capability import HeadSpec  # noqa: E402
from bertjax.engine import optim  # noqa: E402
from bertjax.finetune.objective import build_finetuning  # noqa: E402

MODEL_NAMES = {"bert": "BERT L6/H384", "modernbert": "ModernBERT L6/H256"}
KINDS = (
    "products in a library",
    "products in Eigen",
    "loops",
    "copies and transposes",
    "other fusions and operations",
)
# XLA's CPU runtime names its threads so; the profile's other threads are Python's and jax's.
_RUNTIME_THREADS = ("tf_XLAEigen", "tf_XLAPjRtCpuClient")
# Events that are the runtime's bookkeeping, not an operation of the program.
_BOOKKEEPING = re.compile(r"^(ThunkExecutor|ThreadpoolListener|SlinkyThreadPool|end: )")


def kind_of(name: str) -> str:
    """The kind of work an XLA CPU thunk does, from its name ("ynn_fusion.12", "while.3")."""
    if name.startswith(("ynn_", "xnn_")):
        return KINDS[0]
    if name.startswith(("dot", "convolution")):
        return KINDS[1]
    if name.startswith("while"):
        return KINDS[2]
    if name.startswith(("copy", "transpose")):
        return KINDS[3]
    return KINDS[4]


def own_times(events: list[dict]) -> dict[str, float]:
    """Microseconds of each kind, each operation's own time (its nested operations' time
    taken out), from a perfetto trace's complete ("X") events of the runtime's threads."""
    names = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            names[(event["pid"], event["tid"])] = event["args"]["name"]
    per_thread = collections.defaultdict(list)
    for event in events:
        thread = names.get((event.get("pid"), event.get("tid")), "")
        if (
            event.get("ph") == "X"
            and thread.startswith(_RUNTIME_THREADS)
            and not _BOOKKEEPING.match(event["name"])
        ):
            per_thread[thread].append((event["ts"], -event["dur"], event["name"]))
    totals = dict.fromkeys(KINDS, 0.0)
    for spans in per_thread.values():
        spans.sort()  # by start, the longer (enclosing) first
        open_spans: list[list] = []  # [end, kind, own time so far]
        for start, negative_duration, name in spans:
            while open_spans and open_spans[-1][0] <= start:
                _, kind, own = open_spans.pop()
                totals[kind] += own
            duration = -negative_duration
            if open_spans:
                open_spans[-1][2] -= duration  # the enclosing operation's own time
            open_spans.append([start + duration, kind_of(name), duration])
        for _, kind, own in open_spans:
            totals[kind] += own
    return totals


def micro_batches(args, rng) -> list[dict[str, np.ndarray]]:
    rows = args.batch // args.micro_batches
    out = []
    for _ in range(args.micro_batches):
        lengths = rng.integers(args.width // 2, args.width + 1, rows)
        mask = (np.arange(args.width)[None] < lengths[:, None]).astype(np.int32)
        out.append(
            {
                "input_ids": rng.integers(5, 1000, (rows, args.width)).astype(np.int32) * mask,
                "input_mask": mask,
                "segment_ids": np.zeros_like(mask),
                "labels": rng.integers(0, 2, rows).astype(np.int32),
                "weights": np.ones(rows, np.float32),
            }
        )
    return out


def profile(args) -> dict:
    config = MODELS[MODEL_NAMES[args.model]]
    if args.matmul_dtype != "float32":
        config = dataclasses.replace(config, matmul_dtype=args.matmul_dtype)
    ft = build_finetuning(
        config,
        HeadSpec("classification", ("no", "yes")),
        optim.OptimizerSettings(learning_rate=2e-5, warmup_steps=0, total_steps=100),
        mesh_shape=(1, 1, 1),
        grad_accum_steps=args.micro_batches,
        micro_batch_size=args.batch // args.micro_batches,
        max_seq_length=args.width,
        token_capacity=1.0,
        devices=jax.devices()[:1],
    )
    batches = micro_batches(args, np.random.default_rng(args.seed))
    if args.micro_batches == 1:
        batches = batches[0]  # one batch: the plain train step, as finetune.py takes it
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="bertjax-cpu-step-")
    with jax.set_mesh(ft.mesh):
        state = ft.state.init(jax.random.key(args.seed))

        def steps(count: int, first: int) -> float:
            nonlocal state
            start = time.perf_counter()
            for i in range(first, first + count):
                state, _ = ft.steps.take_step(state, batches, jax.random.key(i))
            jax.block_until_ready(state)
            return (time.perf_counter() - start) / count

        steps(2, 0)  # compiles
        seconds = [steps(1, 2 + i) for i in range(args.steps)]
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            steps(args.steps, 100)
    traces = pathlib.Path(trace_dir).rglob("perfetto_trace.json.gz")
    trace = max(traces, key=lambda p: p.stat().st_mtime)  # this run's, if the directory is kept
    with gzip.open(trace) as f:
        loaded = json.load(f)
    events = loaded["traceEvents"] if isinstance(loaded, dict) else loaded
    totals = own_times(events)
    return {
        "step_s": statistics.median(seconds),
        "ms_per_step": {k: v / 1e3 / args.steps for k, v in totals.items()},
        "trace": str(trace),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODEL_NAMES), default="bert")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--micro_batches", type=int, default=8)
    parser.add_argument("--matmul_dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace_dir", default="", help="keep the profile here")
    args = parser.parse_args(argv)
    if args.batch % args.micro_batches:
        parser.error(f"--batch {args.batch} is not a multiple of --micro_batches")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = profile(args)
    step_ms = 1e3 * result["step_s"]
    print(
        f"{MODEL_NAMES[args.model]}, {args.batch} x {args.width} as {args.micro_batches} "
        f"micro-batches, {args.matmul_dtype} products: {step_ms:.1f} ms a step "
        f"(median of {args.steps})"
    )
    print("| work | ms a step | of the step |")
    print("|---|---|---|")
    for kind, ms in result["ms_per_step"].items():
        print(f"| {kind} | {ms:.1f} | {100 * ms / step_ms:.0f} % |")
    print(f"trace: {result['trace']}")
    return result


if __name__ == "__main__":
    main()
