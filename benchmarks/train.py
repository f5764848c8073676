"""Training throughput: bertjax's train step against transformers' BertForPreTraining.

    python -m benchmarks.train                                   # BERT-small, fp32, B16, S128
    python -m benchmarks.train --config configs/base.py --dtype bfloat16 --batch_size 256
    python -m benchmarks.train --config configs/base.py --dtype bfloat16 --batch_size 256 \
        --attention_dropout 0 --no_reference     # GPU/TPU: lets the fused kernels run

Prints step time, sequences/s, tokens/s, achieved model FLOP/s and MFU (against the
device's data-sheet peak when bertjax.engine.perf knows it, and against the matmul rate this
run measures on the same machine), for bertjax's jitted train step on the present backend
and, when torch and transformers are installed, for `transformers.BertForPreTraining` trained
by the harness's torch loop (AdamW with BERT's decay mask, clipping as the config) on the
same sizes and batches. Both sides use the same model-FLOP count
(bertjax.engine.perf.training_flops_per_sequence, MLM head on the predicted positions only),
so transformers' extra work -- it runs the vocabulary projection on every position -- is not
credited to it. bertjax skips padding (config.token_capacity, set just above the synthetic
batches' fill; --token_capacity 1 turns it off), while the FLOP count stays per padded
sequence on both sides: with packing the MFU columns measure throughput, not utilisation.

Timing (benchmarks.harness.timing): each side runs --warmup untimed calls of --steps steps
(the first compiles), then --rounds rounds run every side's --steps steps in turn and a
matmul probe; ratios and matmul fractions are taken within each round, then their median.
Sequences are synthetic (benchmarks.harness.fixtures.pretraining_batch): random token ids,
lengths uniform in [S/2, S], two segments, `num_predictions` masked positions among the real
tokens.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from benchmarks.harness import commands, fixtures, report, timing
from bertjax.engine import perf, steps
from bertjax.pretrain.objective import build_pretraining
from bertjax.pretrain.settings import PretrainSettings

try:  # the reference is optional: torch and transformers live in the `hf` extra
    from benchmarks.harness import reference
except ImportError:  # pragma: no cover - depends on the environment
    reference = None

DTYPES = ("float32", "bfloat16")
BATCHES = 4  # distinct synthetic batches, cycled


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        default=str(commands.REPO / "configs" / "small.py"),
        help="training config file (configs/*.py) giving the model and optimizer",
    )
    parser.add_argument("--batch_size", type=int, default=16, help="global batch size")
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument(
        "--num_predictions", type=int, default=20, help="masked positions per sequence"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="compute dtype (parameters stay float32)"
    )
    parser.add_argument("--steps", type=int, default=5, help="steps per timed call")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed calls of --steps steps (the first compiles)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per side")
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument(
        "--mesh_shape",
        default="",
        help="data,fsdp,tensor sizes, e.g. 4,2,1 (default: every device data-parallel)",
    )
    parser.add_argument(
        "--attention_impl",
        default=None,
        choices=("auto", "xla", "cudnn", "splash"),
        help="override config.model.attention_impl",
    )
    parser.add_argument(
        "--attention_dropout",
        type=float,
        default=None,
        help="override config.model.attention_dropout (0 lets the fused cuDNN/splash kernels run)",
    )
    parser.add_argument(
        "--token_capacity",
        type=float,
        default=None,
        help="config.token_capacity: the fraction of token slots the encoder computes "
        "(1 = no token packing; default: just above the synthetic batches' fill)",
    )
    parser.add_argument(
        "--no_reference", action="store_true", help="skip the transformers reference"
    )
    parser.add_argument(
        "--matmul_size",
        type=int,
        default=0,
        help="side of the square matmul probe (0: 1024 on CPU, 8192 on accelerators)",
    )
    parser.add_argument("--seed", type=int, default=0)
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    for name in ("batch_size", "seq_len", "steps", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    for name in ("warmup", "num_predictions", "matmul_size"):
        if getattr(args, name) < 0:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 0")
    if args.token_capacity is not None and not 0 < args.token_capacity <= 1:
        parser.error(f"--token_capacity={args.token_capacity} is invalid: must be in (0, 1]")
    if args.num_predictions > args.seq_len // 2 - 2:
        parser.error(
            f"--num_predictions={args.num_predictions} is invalid: must be <= seq_len/2 - 2 "
            f"= {args.seq_len // 2 - 2} so that every synthetic sequence has that many tokens"
        )
    if args.mesh_shape:
        try:
            args.mesh_shape = tuple(int(s) for s in args.mesh_shape.split(","))
        except ValueError:
            parser.error(
                f"--mesh_shape={args.mesh_shape!r} is invalid: give three integers like 4,2,1"
            )
    else:
        args.mesh_shape = (-1, 1, 1)
    return args


def model_config(args: argparse.Namespace, token_capacity: float):
    """The config file's get_config(), overridden by the command-line sizes."""
    config = fixtures.recipe(args.config)
    config.model.dtype = args.dtype
    config.model.vocab_size = args.vocab_size
    if args.attention_impl:
        config.model.attention_impl = args.attention_impl
    if args.attention_dropout is not None:
        config.model.attention_dropout = args.attention_dropout
    config.batch_size = args.batch_size
    config.grad_accum_steps = 1
    config.token_capacity = token_capacity
    config.data.max_seq_length = args.seq_len
    config.data.max_predictions_per_seq = args.num_predictions
    config.mesh_shape = args.mesh_shape
    config.seed = args.seed
    return config


class Ours:
    """bertjax's jitted, sharded train step on device-resident batches."""

    def __init__(self, settings: PretrainSettings, batches: list[dict[str, np.ndarray]]):
        self.model_config = settings.model
        self.setup = build_pretraining(settings, self.model_config)
        self.batches = [steps.global_batch(b, self.setup.batch_sharding, 1) for b in batches]
        self.rng = jax.random.key(settings.run.seed + 1)
        with jax.set_mesh(self.setup.mesh):
            self.state = self.setup.state.init(jax.random.key(settings.run.seed))
        self.next = itertools.cycle(self.batches)

    def run(self, count: int) -> dict:
        """`count` steps; the last step's metrics."""
        metrics = None
        with jax.set_mesh(self.setup.mesh):
            for _ in range(count):
                self.state, metrics = self.setup.train_step(self.state, next(self.next), self.rng)
        return metrics


class Theirs:
    """transformers' BertForPreTraining on the same batches, trained by the harness's loop."""

    def __init__(self, model_config, optimizer, batches: list[dict[str, np.ndarray]], args):
        reference.torch.manual_seed(args.seed)
        reference.use_threads()
        self.model = reference.transformers.BertForPreTraining(
            reference.bert_config(model_config)
        ).to(reference.device())
        self.optimizer = reference.adamw(self.model, optimizer)
        self.max_grad_norm = optimizer.max_grad_norm
        self.autocast = reference.torch.bfloat16 if args.dtype == "bfloat16" else None
        self.next = itertools.cycle([self.inputs(b) for b in batches])

    @staticmethod
    def inputs(batch: dict[str, np.ndarray]) -> dict[str, Any]:
        # transformers' MLM loss takes a [B, S] label tensor, -100 where nothing is predicted.
        labels = np.full(batch["input_ids"].shape, -100, np.int64)
        rows = np.arange(labels.shape[0])[:, None]
        labels[rows, batch["masked_lm_positions"]] = batch["masked_lm_ids"]
        extra = {"labels": labels, "next_sentence_labels": batch["next_sentence_labels"]}
        names = {**reference.INPUT_NAMES, "labels": "labels"}
        names["next_sentence_labels"] = "next_sentence_label"
        return reference.tensors({**batch, **extra}, names=names)

    def run(self, count: int) -> float:
        return reference.train(
            self.model,
            (next(self.next) for _ in range(count)),
            self.optimizer,
            max_grad_norm=self.max_grad_norm,
            autocast=self.autocast,
        )


def format_rate(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def print_table(
    timings: dict[str, timing.Timing],
    columns: dict[str, Callable[[str, timing.Timing], str]],
) -> None:
    header = f"{'':<26}" + "".join(f"{name:>16}" for name in timings)
    print(header)
    print("-" * len(header))
    for label, value in columns.items():
        print(f"{label:<26}" + "".join(f"{value(n, t):>16}" for n, t in timings.items()))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark, prints the report and returns its row's figures."""
    args = parse_args(argv)
    machine = report.start("train", argv)
    rng = np.random.default_rng(args.seed)
    batches = [
        fixtures.pretraining_batch(
            rng, args.batch_size, args.seq_len, args.num_predictions, args.vocab_size
        )
        for _ in range(BATCHES)
    ]
    real_tokens = np.mean([b["input_mask"].sum(axis=1).mean() for b in batches])
    # The fill of the fullest batch (whole-batch, which on one device is what packing needs),
    # as a user would read it off train/packed or the data; rounded up to 1/32.
    fill = max(float(b["input_mask"].mean()) for b in batches)
    token_capacity = args.token_capacity or min(1.0, float(np.ceil(fill * 32) / 32))
    config = model_config(args, token_capacity)
    settings = PretrainSettings.from_config(config)

    ours = Ours(settings, batches)
    model = ours.model_config
    flops_per_seq = perf.training_flops_per_sequence(model, args.seq_len, args.num_predictions)
    print(
        f"model: {config.model.preset} (L{model.num_layers}/H{model.hidden_size}/"
        f"A{model.num_heads}, V{model.vocab_size}), {args.dtype} compute, "
        f"attention_impl={model.attention_impl}, mesh {dict(ours.setup.mesh.shape)}"
    )
    print(
        f"batch {args.batch_size} x seq {args.seq_len}, {args.num_predictions} predictions, "
        f"{real_tokens:.1f} real tokens per sequence on average (fullest batch "
        f"{100 * fill:.1f} %), token_capacity {config.token_capacity:g}; optimizer "
        f"{config.optimizer.name}; {format_rate(flops_per_seq, 'FLOP')} model FLOPs per sequence"
    )
    sides: dict[str, Callable[[], Any]] = {"bertjax": lambda: ours.run(args.steps)}
    devices = {"bertjax": jax.device_count()}
    if not args.no_reference:
        if reference is None:
            print("transformers reference skipped: torch/transformers are not installed")
        else:
            if settings.optimizer.name != "adamw":
                print(f"note: config optimizer is {settings.optimizer.name}; the reference: AdamW")
            theirs = Theirs(model, settings.optimizer, batches, args)
            print(
                f"reference: transformers BertForPreTraining on {reference.device()}, "
                f"attention {theirs.model.config._attn_implementation}, AdamW, "
                f"{reference.torch.get_num_threads()} torch threads"
            )
            sides["transformers"] = lambda: theirs.run(args.steps)
            devices["transformers"] = 1

    on_cpu = jax.default_backend() == "cpu"
    probe_size = args.matmul_size or (1024 if on_cpu else 8192)
    matmul_rates: list[float] = []

    def after_round(index: int, seconds: dict[str, float]) -> None:
        # The machine's matmul rate in the same round: the sides' fractions of it.
        matmul_rates.append(
            perf.measure_matmul_flops(args.dtype, probe_size, repeats=20 if on_cpu else 50)
        )
        print(
            f"round {index + 1}/{args.rounds}: "
            + ", ".join(f"{n} {1e3 * s / args.steps:.1f} ms/step" for n, s in seconds.items())
            + f", matmul {format_rate(matmul_rates[-1], 'FLOP/s')}",
            flush=True,
        )

    timings = timing.time_rounds(
        sides,
        rounds=args.rounds,
        warmup=args.warmup,
        cpu_clock=time.process_time,
        on_round=after_round,
    )
    for name, found in timings.items():
        if found.first is not None:
            print(f"{name}: first call of {args.steps} steps (compiles) {found.first:.1f} s")
    last = ours.run(1)  # the metrics of one more step: the loss and whether it packed
    loss, packed = float(last["train/loss"]), float(last.get("train/packed", 0.0))
    if not np.isfinite(loss):
        raise FloatingPointError(f"bertjax train step gave a non-finite loss {loss}")

    def per_second(name: str, seconds: float) -> float:
        return args.batch_size * args.steps / seconds  # sequences

    fractions = {
        name: [
            per_second(name, s) * flops_per_seq / (m * devices[name])
            for s, m in zip(found.rounds, matmul_rates)
        ]
        for name, found in timings.items()
    }
    peak = perf.peak_flops_per_device(jax.devices()[0].device_kind, args.dtype)
    print()
    print(
        f"medians over {args.rounds} rounds of {args.steps} steps; matmul probe "
        f"({probe_size}^3 {args.dtype}, one device): "
        f"{format_rate(statistics.median(matmul_rates), 'FLOP/s')}; data-sheet peak: "
        + (format_rate(peak, "FLOP/s") if peak else f"unknown for {jax.devices()[0].device_kind}")
    )

    def mfu(name: str, found: timing.Timing) -> float | None:
        rate = per_second(name, found.median) * flops_per_seq
        return rate / (peak * devices[name]) if peak else None

    print_table(
        timings,
        {
            "devices": lambda n, t: str(devices[n]),
            "step time": lambda n, t: f"{1e3 * t.median / args.steps:.1f} ms",
            "CPU time per step": lambda n, t: f"{statistics.median(t.cpu) / args.steps:.2f} s",
            "sequences/s": lambda n, t: f"{per_second(n, t.median):.2f}",
            "tokens/s": lambda n, t: f"{per_second(n, t.median) * args.seq_len:.1f}",
            "model FLOP/s": lambda n, t: format_rate(
                per_second(n, t.median) * flops_per_seq, "FLOP/s"
            ),
            "MFU (data-sheet peak)": lambda n, t: (
                "n/a" if mfu(n, t) is None else f"{100 * mfu(n, t):.1f} %"
            ),
            "of measured matmul rate": lambda n, t: (
                f"{100 * statistics.median(fractions[n]):.1f} %"
            ),
        },
    )
    print(
        f"bertjax token packing: {'on' if packed else 'off'} in the step after the timed ones "
        f"(token_capacity {config.token_capacity:g})"
    )
    ours_timing = timings["bertjax"]
    figures: dict[str, Any] = {
        "step_s": ours_timing.median / args.steps,
        "tokens_per_sec": per_second("bertjax", ours_timing.median) * args.seq_len,
        "fraction_of_matmul": statistics.median(fractions["bertjax"]),
        "mfu": mfu("bertjax", ours_timing),
        "bertjax": ours_timing.figures(),
    }
    print(
        "\nbertjax fraction of the measured matmul rate, per round: "
        + ", ".join(f"{100 * f:.1f} %" for f in fractions["bertjax"])
        + f" (median {100 * figures['fraction_of_matmul']:.1f} %)"
    )
    if "transformers" in timings:
        figures["transformers"] = timings["transformers"].figures()
        figures["speedup_vs_transformers"] = timing.ratio(timings["transformers"], ours_timing)
        print(f"bertjax / transformers tokens/s: {figures['speedup_vs_transformers']:.2f}x")
    report.finish("train", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
