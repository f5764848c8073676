"""Where a fine-tuning train step's time goes on a CPU, from XLA's own profile.

    python -m benchmarks.cpu_step [--model bert|modernbert] [--batch 32] [--width 256]
        [--micro_batches 8] [--matmul_dtype bfloat16] [--steps 3] [--trace_dir DIR]

A sequence classifier's train step (BERT at MiniLM's shape, L6/H384/A12, or ModernBERT
L6/H256/A4) on `--batch` rows of random tokens, real lengths drawn from half to all of
`--width`, taken as `--micro_batches` micro-batches as finetune.py's
`--config.grad_accum_steps` does. After two untimed steps it times `--steps` one step at a
time (benchmarks.harness.timing, median), then traces as many more with jax's profiler and
sums what XLA's CPU runtime ran, by kind:

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
import tempfile
from typing import Any

import jax
import numpy as np

from benchmarks.harness import fixtures, report, timing
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.encoders.modernbert.config import ModernBertConfig
from bertjax.engine import optim
from bertjax.finetune.objective import build_finetuning

MODELS = {
    "BERT L6/H384": BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_layers=6,
        num_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    ),
    "ModernBERT L6/H256": ModernBertConfig(
        vocab_size=50368,
        hidden_size=256,
        intermediate_size=384,
        num_layers=6,
        num_heads=4,
        local_attention=128,
        dtype="float32",
    ),
}
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
        ids = fixtures.token_rows(
            rng, lengths, 1000, fixtures.CLS_ID, fixtures.SEP_ID, fixtures.FIRST_REAL_ID
        )
        batch = fixtures.padded(ids, args.width)
        out.append(
            {
                "input_ids": batch["input_ids"],
                "input_mask": batch["attention_mask"],
                "segment_ids": np.zeros_like(batch["input_ids"]),
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
        taken = 0

        def step():
            nonlocal state, taken
            state, _ = ft.steps.take_step(state, batches, jax.random.key(taken))
            taken += 1
            return state

        # Two untimed steps (the first compiles), then --steps timed one at a time.
        timed = timing.time_call(step, rounds=args.steps, warmup=2)
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(args.steps):
                step()
            jax.block_until_ready(state)
    traces = pathlib.Path(trace_dir).rglob("perfetto_trace.json.gz")
    trace = max(traces, key=lambda p: p.stat().st_mtime)  # this run's, if the directory is kept
    with gzip.open(trace) as f:
        loaded = json.load(f)
    events = loaded["traceEvents"] if isinstance(loaded, dict) else loaded
    totals = own_times(events)
    return {
        "step_s": timed.median,
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
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.batch % args.micro_batches:
        parser.error(f"--batch {args.batch} is not a multiple of --micro_batches")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = report.start("cpu_step", argv)
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
    report.finish("cpu_step", args, result, machine)
    return result


if __name__ == "__main__":
    main()
