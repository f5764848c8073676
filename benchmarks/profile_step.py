"""Where a pretraining step's time goes on an accelerator, and what its program holds.

    python -m benchmarks.profile_step --out profile                  # GPU or TPU: < 8 min
    python -m benchmarks.profile_step --out profile --lower_only --full   # any host: programs
    python -m benchmarks.profile_step --out profile                  # CPU: the tiny models

On a GPU or TPU one call profiles BERT-base at 128 tokens (configs/base.py: batch 256 of
google's padded sentence pairs, the device's fused attention: cuDNN on an NVIDIA GPU, splash
on a TPU) and ModernBERT-base at 1,024 (configs/modernbert_base.py: batch 32 of packed
documents, its recipe's 30 % masking; cuDNN cannot serve documents, so on a GPU its
attention is xla's), in benchmarks.accelerator's settings (bf16 compute, attention dropout
0, token packing off, synthetic batches). For each workload:

1. The real train step (bertjax.engine.steps) is lowered and compiled once. Its optimised HLO
   (train_step.hlo.txt.gz) and its HLO before optimisation with metadata
   (train_step.lowered.hlo.txt.gz) are written, and what the program holds is printed
   (benchmarks.harness.hlo.program_findings): the optimizer update's kernels,
   conditionals and loops, float32 activations, layout changes in attention, the masked-LM
   head's rows, the program's size.
2. Unless --lower_only: the train state is initialised, --warmup steps run, --steps steps are
   timed (ms a step and MFU, counted as benchmarks.accelerator counts them), then
   --trace_steps more are traced by jax.profiler (plugins/profile/<run>/*.trace.json.gz, and
   perfetto_trace.json.gz for ui.perfetto.dev; no Python tracing, which would slow the
   host). Every step is taken as bertjax.engine.loop takes it: the host batch put on the
   device by the step (steps.Steps.take_step), the previous step's non-finite flag read
   back, so the trace holds a real run's input copies and host gaps.
3. The steady step's breakdown is printed (benchmarks.harness.profile.breakdown): seconds
   and shares of matmuls, attention, elementwise fusions, reductions, gathers and scatters,
   the optimizer update, layout changes, collectives, input transfer and the rest; the
   device's idle time inside the step (and right before the optimizer update) and between
   steps; kernels per step, distinct fusions, the optimizer update's kernels; the
   instructions that took longest.
4. On an NVIDIA GPU (--graph_arm on elsewhere) the step is compiled once more with
   conditionals recorded into CUDA graphs (CONDITIONAL_IN_GRAPHS) and timed again: the
   conditional that skips a non-finite step's update otherwise copies its predicate to the
   host and waits for it in every step, and the same kernels run either way.

Each workload's files and its breakdown.json (findings, timing, breakdown) go to
<out>/<model>-<seq>-<layout>-<the attention that runs>/; --json appends the run's row
(benchmarks.harness.report). --budget_s (default 420) skips the second workload when the
first one's time says it would not finish within the budget; a workload that fails (out of
memory, a trace without the device's events) is reported and the next one runs.

While a profiler is active XLA runs a GPU program's thunks one by one rather than as
command buffers (CUDA graphs), unless XLA_FLAGS holds
--xla_enable_command_buffers_during_profiling=true: the traced step can hold launch gaps the
timed one does not; compare the traced step with "ms a step".

On a CPU (automatic) the tiny models run instead: BERT L2/H64/A2 and ModernBERT L4/H128/A4,
vocabulary 512, 128 tokens, batch 8 (their breakdown exercises the same code on XLA's CPU
thunks). --full takes the full-size models on a CPU too, with --lower_only only: compiling
them takes minutes there, and their findings are read from the CPU's optimised program (its
fusions are the CPU compiler's, not a GPU's).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
from typing import Any

import jax
import numpy as np

from benchmarks import accelerator
from benchmarks.harness import hlo, profile, report, timing
from bertjax.engine import loop, perf, steps
from bertjax.pretrain.objective import build_pretraining

# (model, sequence length, layout): the steps the accelerator benchmark found furthest from
# the device's peak, and their tiny stand-ins on a CPU.
FULL = (("base", 128, accelerator.PADDED), (accelerator.MODERN_BASE, 1024, accelerator.PACKED))
TINY = (
    (accelerator.TINY_MODEL, 128, accelerator.PADDED),
    (accelerator.MODERN_TINY, 128, accelerator.PACKED),
)
ATTENTION_CHOICES = ("auto", "xla", "cudnn", "splash")
# XLA's GPU command buffers (CUDA graphs) by default, and CONDITIONAL beside them: the
# conditional around the optimizer update then runs inside a graph instead of copying its
# predicate to the host and waiting for it. The same kernels run, so the same numbers; the
# step's time with it against without is what the wait costs.
CONDITIONAL_IN_GRAPHS = {
    "xla_gpu_enable_command_buffer": (
        "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,CONDITIONAL"
    )
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="directory for every workload's files")
    parser.add_argument(
        "--models",
        default="",
        help="comma-separated, of the workloads' models (default: both; see the docstring)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="the full-size models on a CPU (with --lower_only; automatic on a GPU or TPU)",
    )
    parser.add_argument(
        "--lower_only",
        action="store_true",
        help="compile the programs and print their findings, without running them",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        choices=ATTENTION_CHOICES,
        help="auto: the device's fused kernel where it serves the workload, else xla",
    )
    parser.add_argument(
        "--scan_layers",
        default="recipe",
        choices=("recipe", "on", "off"),
        help="the encoder's layers scanned or unrolled (default: as the recipe has them)",
    )
    parser.add_argument(
        "--graph_arm",
        default="auto",
        choices=("auto", "on", "off"),
        help="time the step once more compiled with CONDITIONAL_IN_GRAPHS (auto: on an NVIDIA "
        "GPU; elsewhere the option changes nothing)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--trace_steps", type=int, default=4, help="traced steps (>= 2)")
    parser.add_argument("--budget_s", type=float, default=420.0)
    parser.add_argument("--peak_flops", type=float, default=0.0, help="for MFU (see accelerator)")
    parser.add_argument("--seed", type=int, default=0)
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    for name, least in (("warmup", 0), ("steps", 1), ("trace_steps", 2)):
        if getattr(args, name) < least:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= {least}")
    if args.budget_s <= 0 or args.peak_flops < 0:
        parser.error("--budget_s must be > 0 and --peak_flops >= 0")
    on_cpu = jax.default_backend() == "cpu"
    if args.full and on_cpu and not args.lower_only:
        parser.error("--full on a CPU needs --lower_only: the full-size steps are not for a CPU")
    args.full = args.full or not on_cpu
    workloads = FULL if args.full else TINY
    names = tuple(m.strip() for m in args.models.split(",") if m.strip())
    valid = tuple(model for model, _, _ in workloads)
    for name in names:
        if name not in valid:
            parser.error(f"--models: {name!r} is not one of {valid}")
    args.workloads = tuple(w for w in workloads if not names or w[0] in names)
    if args.graph_arm == "auto":
        args.graph_arm = "on" if accelerator.fused_backend("cudnn")[0] else "off"
    return args


def attention_for(requested: str) -> str:
    """The backend asked of every workload: the device's fused kernel for "auto"."""
    if requested != "auto":
        return requested
    fused, _ = accelerator.fused_backend("auto")
    return fused or "xla"


def parameter_leaves(setup: steps.Steps) -> int:
    return len(jax.tree.leaves(setup.state.abstract.params))


def timed_steps(
    run: steps.Steps, state: steps.TrainState, batches, rng, count: int, first: int
) -> tuple[float, steps.TrainState]:
    """(seconds a step, state) over `count` steps taken by run_steps."""
    elapsed = timing.stopwatch()
    state = run_steps(run, state, batches, rng, count, first)
    return elapsed() / count, state


def run_steps(
    run: steps.Steps, state: steps.TrainState, batches, rng, count: int, first: int
) -> steps.TrainState:
    """`count` steps as bertjax.engine.loop takes them: each host batch put on the device by
    the step, and after each step the previous one's non-finite flag read back."""
    pending = []
    for i in range(count):
        state, metrics = run.take_step(state, batches[(first + i) % len(batches)], rng)
        pending.append(metrics)
        if len(pending) >= 2:
            loop.raise_if_nonfinite(pending[-2:-1], first + i)
    loop.raise_if_nonfinite(pending[-1:], first + count)  # waits for the last step
    return state


def profile_workload(
    model_name: str, seq_len: int, layout: str, args: argparse.Namespace, peak: float | None
) -> dict[str, Any]:
    """Compiles one workload's train step, writes and reads its program; unless
    --lower_only, times and traces its steps and breaks a steady one down."""
    # The accelerator benchmark's batches: 32k tokens, or 8 rows of a tiny model.
    rows = accelerator.TOKENS_PER_BATCH // seq_len if args.full else 8
    batch_size = accelerator.round_up_to_devices(rows)
    impl = attention_for(args.attention)
    settings = accelerator.make_settings(
        model_name, impl, batch_size, seq_len, accelerator.DTYPE, args.seed
    )
    if args.scan_layers != "recipe":
        scanned = dataclasses.replace(settings.model, scan_layers=args.scan_layers == "on")
        settings = dataclasses.replace(settings, model=scanned)
    model = settings.model
    setup = build_pretraining(settings, model)
    by_kind, why = accelerator.attention_by_layer_kind(
        model, batch_size, seq_len, setup.mesh, documents=layout == accelerator.PACKED
    )
    runs = ", ".join(f"{kind} layers {backend}" for kind, backend in by_kind.items())
    # Named after what runs: ModernBERT's packed rows ask cuDNN and run xla.
    backends = "+".join(sorted(set(by_kind.values())))
    name = f"{model_name}-{seq_len}-{layout}-{backends}" + (
        "" if args.scan_layers == "recipe" else ("-scanned" if model.scan_layers else "-unrolled")
    )
    directory = os.path.join(args.out, name)
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(args.seed + seq_len)
    predictions = accelerator.num_predictions(seq_len, model_name)
    batches = [
        accelerator.make_batch(layout, rng, batch_size, seq_len, model_name, model.vocab_size)
        for _ in range(2)
    ]
    print(
        f"\n== {name}: batch {batch_size}, attention asked {impl}: {runs}"
        + (f" ({why})" if why else ""),
        flush=True,
    )
    abstract_batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=setup.batch_sharding)
        for k, v in batches[0].items()
    }
    key = jax.random.key(args.seed + 1)
    elapsed = timing.stopwatch()
    with jax.set_mesh(setup.mesh):
        lowered = setup.train_step.lower(setup.state.abstract, abstract_batch, key)
        compiled = lowered.compile()
    compile_s = elapsed()
    optimised = compiled.as_text()
    before = lowered.as_text(dialect="hlo", debug_info=True)
    for filename, text in (
        ("train_step.hlo.txt.gz", optimised),
        ("train_step.lowered.hlo.txt.gz", before),
    ):
        with gzip.open(os.path.join(directory, filename), "wt") as f:
            f.write(text)
    shapes = hlo.Shapes(
        tokens=batch_size * seq_len,
        hidden=model.hidden_size,
        vocab=model.vocab_size,
        predictions=batch_size * predictions,
        parameter_leaves=parameter_leaves(setup),
    )
    findings = hlo.program_findings(optimised, before, shapes)
    print(f"compiled in {compile_s:.1f} s; the program:")
    print(hlo.format_findings(findings), flush=True)
    result: dict[str, Any] = {
        "workload": name,
        "model": model_name,
        "seq_len": seq_len,
        "layout": layout,
        "batch_size": batch_size,
        "attention": impl,
        "attention_by_layer_kind": by_kind,
        "compile_s": compile_s,
        "findings": findings,
    }
    if not args.lower_only:
        result.update(trace_workload(setup, lowered, compiled, batches, key, directory, args))
        flops = accelerator.training_flops(settings, seq_len, predictions)
        step_s = result["step_s"]
        result["mfu"] = batch_size * flops / step_s / peak if peak else None
        mfu = f"{result['mfu']:.1%}" if result["mfu"] else "n/a"
        traced = result["breakdown"]["step_s"] * 1e3 if result["breakdown"] else math.nan
        print(
            f"\n{step_s * 1e3:.2f} ms a step untraced (MFU {mfu}); the traced steady step "
            f"{traced:.2f} ms:"
        )
        print(result.pop("table"), flush=True)
        if "step_s_conditional_in_graphs" in result:
            print(
                f"with conditionals in CUDA graphs ({CONDITIONAL_IN_GRAPHS}): "
                f"{result['step_s_conditional_in_graphs'] * 1e3:.2f} ms a step untraced"
            )
        if "conditional_in_graphs_error" in result:
            print(f"conditionals in CUDA graphs: failed: {result['conditional_in_graphs_error']}")
    with open(os.path.join(directory, "breakdown.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


def trace_workload(
    setup: steps.Steps, lowered, compiled, batches, key, directory: str, args
) -> dict[str, Any]:
    """Initialises the state, warms up, times --steps steps, traces --trace_steps more and
    breaks the steady traced step down; with --graph_arm, times the step compiled with
    CONDITIONAL_IN_GRAPHS too."""
    run = dataclasses.replace(setup, train_step=compiled)
    state, init_s = accelerator.initial_state(setup, args.seed)
    out: dict[str, Any] = {"init_s": init_s}
    with jax.set_mesh(setup.mesh):
        state = run_steps(run, state, batches, key, args.warmup, 0)
        out["step_s"], state = timed_steps(run, state, batches, key, args.steps, args.warmup)

        def traced() -> None:
            nonlocal state
            state = run_steps(run, state, batches, key, args.trace_steps, 0)

        trace = profile.record(directory, traced)
        if args.graph_arm == "on":
            try:
                arm = dataclasses.replace(setup, train_step=lowered.compile(CONDITIONAL_IN_GRAPHS))
                state = run_steps(arm, state, batches, key, 1, 0)  # records the graphs
                seconds, state = timed_steps(arm, state, batches, key, args.steps, 1)
                out["step_s_conditional_in_graphs"] = seconds
            except Exception as e:  # an option this XLA does not take: say so, go on
                out["conditional_in_graphs_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    del state
    try:
        result = profile.breakdown(trace, compiled.as_text())
    except ValueError as e:  # a trace without the device's events (no device tracer)
        out.update(breakdown=None, table=f"no breakdown: {e}")
        return out
    out.update(breakdown=result.to_json(), table=result.table())
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Profiles each workload within the budget; prints and returns (and with --json,
    appends) the results."""
    args = parse_args(argv)
    machine = report.start("profile_step", argv)
    device = jax.devices()[0]
    peak = perf.peak_flops_per_device(
        device.device_kind, accelerator.DTYPE, args.peak_flops or None
    )
    total_peak = peak * jax.device_count() if peak else None
    budget = accelerator.Budget(args.budget_s)
    workloads, notes = [], []
    for model_name, seq_len, layout in args.workloads:
        if not budget.allows("workload"):
            notes.append(f"{model_name} at {seq_len}: skipped, over the {args.budget_s:g} s budget")
            continue
        elapsed = timing.stopwatch()
        try:
            workloads.append(profile_workload(model_name, seq_len, layout, args, total_peak))
        except Exception as e:  # e.g. out of memory: say so, go on to the next workload
            first = str(e).splitlines()[0] if str(e) else ""
            notes.append(f"{model_name} at {seq_len}: failed: {type(e).__name__}: {first}")
        budget.record("workload", elapsed())
    for note in notes:
        print(f"note: {note}")
    print(f"total {budget.elapsed():.0f} s")
    result = {"workloads": workloads, "notes": notes, "elapsed_s": budget.elapsed()}
    report.finish("profile_step", args, result, machine)
    return result


if __name__ == "__main__":
    main()
