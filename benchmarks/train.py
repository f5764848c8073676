"""Training throughput: bertjax's train step against transformers' BertForPreTraining.

    python benchmarks/train.py                                   # BERT-small, fp32, B16, S128
    python benchmarks/train.py --config configs/base.py --dtype bfloat16 --batch_size 256
    python benchmarks/train.py --config configs/base.py --dtype bfloat16 --batch_size 256 \
        --attention_dropout 0 --no_reference     # GPU/TPU: lets the fused kernels run

Prints step time, sequences/s, tokens/s, achieved model FLOP/s and MFU (against the
device's data-sheet peak when bertjax.engine.perf knows it, and against the matmul rate this run
measures on the same machine), for bertjax's jitted train step on the present backend and,
when torch and transformers are installed, for `transformers.BertForPreTraining` trained
with AdamW on the same sizes and batches. Both sides use the same model-FLOP count
(bertjax.engine.perf.training_flops_per_sequence, MLM head on the predicted positions only), so
transformers' extra work -- it runs the vocabulary projection on every position -- is not
credited to it. bertjax skips padding (config.token_capacity, set just above the synthetic
batches' fill; --token_capacity 1 turns it off), while the FLOP count stays per padded
sequence on both sides: with packing the MFU columns measure throughput, not utilisation.

Shared machines are noisy: the measurement runs in rounds (ours, reference, matmul probe,
repeated) and the ratios are taken within each round, then their median is quoted.
Sequences are synthetic: random token ids, lengths uniform in [S/2, S], two segments,
`num_predictions` masked positions among the real tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import flax
import jax
import numpy as np
import optax

# The script runs from a checkout: make `bertjax` and `configs` importable from the root.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from bertjax.engine import (  # noqa: E402
    perf,  # noqa: E402
    steps,  # noqa: E402
)
from bertjax.pretrain.objective import build_pretraining  # noqa: E402
from bertjax.pretrain.settings import PretrainSettings  # noqa: E402

try:  # the reference is optional: torch and transformers live in the `hf` extra
    import torch
    import transformers
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
    transformers = None

DTYPES = ("float32", "bfloat16")
FIRST_REAL_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK] in bertjax tokenizers


@dataclasses.dataclass(frozen=True)
class Timing:
    """One timed run of `steps` training steps."""

    name: str
    seconds: float
    cpu_seconds: float  # this process's CPU time: how much of the machine the run got
    steps: int
    batch_size: int
    seq_len: int
    flops_per_sequence: float
    devices: int  # the FLOP rate is over this many devices

    @property
    def step_time(self) -> float:
        return self.seconds / self.steps

    @property
    def sequences_per_sec(self) -> float:
        return self.batch_size / self.step_time

    @property
    def tokens_per_sec(self) -> float:
        return self.sequences_per_sec * self.seq_len

    @property
    def flops_per_sec(self) -> float:
        return self.sequences_per_sec * self.flops_per_sequence


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        default=os.path.join(_REPO, "configs", "small.py"),
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
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed steps before timing (after compiling)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (ours, reference, matmul probe); ratios are medians over rounds",
    )
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
    args = parser.parse_args(argv)
    for name in ("batch_size", "seq_len", "steps", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    for name in ("warmup", "num_predictions", "matmul_size"):
        if getattr(args, name) < 0:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 0")
    if args.token_capacity is not None and not 0 < args.token_capacity <= 1:
        parser.error(f"--token_capacity={args.token_capacity} is invalid: must be in (0, 1]")
    if args.num_predictions > args.seq_len // 2 - 1:
        parser.error(
            f"--num_predictions={args.num_predictions} is invalid: must be < seq_len/2 - 1 "
            f"= {args.seq_len // 2 - 1} so that every synthetic sequence has that many tokens"
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


def load_config(path: str, args: argparse.Namespace, token_capacity: float):
    """The config file's get_config(), overridden by the command-line sizes."""
    if not os.path.isfile(path):
        raise SystemExit(f"--config={path!r}: no such file")
    spec = importlib.util.spec_from_file_location("benchmark_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
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


# ----------------------------------------------------------------------------- batches


def synthetic_batch(
    rng: np.random.Generator, batch_size: int, seq_len: int, num_predictions: int, vocab_size: int
) -> dict[str, np.ndarray]:
    """A pretraining batch in google's feature layout with realistic padding."""
    input_ids = np.zeros((batch_size, seq_len), np.int32)
    input_mask = np.zeros((batch_size, seq_len), np.int32)
    segment_ids = np.zeros((batch_size, seq_len), np.int32)
    positions = np.zeros((batch_size, num_predictions), np.int32)
    for row in range(batch_size):
        length = int(rng.integers(seq_len // 2, seq_len + 1))
        input_ids[row, :length] = rng.integers(FIRST_REAL_ID, vocab_size, length)
        input_mask[row, :length] = 1
        segment_ids[row, int(rng.integers(2, length - 1)) : length] = 1
        # Predictions among the real tokens after [CLS], sorted as google's masking does.
        positions[row] = np.sort(rng.choice(np.arange(1, length), num_predictions, replace=False))
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(
            FIRST_REAL_ID, vocab_size, (batch_size, num_predictions)
        ).astype(np.int32),
        "masked_lm_weights": np.ones((batch_size, num_predictions), np.float32),
        "next_sentence_labels": rng.integers(0, 2, batch_size).astype(np.int32),
    }


# ----------------------------------------------------------------------------- runners


def time_steps(
    step: Callable[[int], Any], finish: Callable[[Any], None], steps: int
) -> tuple[float, float]:
    """(wall, CPU) seconds for `steps` calls of step(i), waiting for the last result at the end."""
    start, cpu_start = time.perf_counter(), time.process_time()
    out = None
    for i in range(steps):
        out = step(i)
    finish(out)
    return time.perf_counter() - start, time.process_time() - cpu_start


class OursRunner:
    """bertjax's jitted, sharded train step on synthetic device-resident batches."""

    def __init__(self, settings: PretrainSettings, batches: list[dict[str, np.ndarray]]):
        self.model_config = settings.model
        self.setup = build_pretraining(settings, self.model_config)
        self.batches = [steps.global_batch(b, self.setup.batch_sharding, 1) for b in batches]
        self.rng = jax.random.key(settings.run.seed + 1)
        with jax.set_mesh(self.setup.mesh):
            self.state = self.setup.state.init(jax.random.key(settings.run.seed))

    def step(self, i: int):
        with jax.set_mesh(self.setup.mesh):
            self.state, metrics = self.setup.train_step(
                self.state, self.batches[i % len(self.batches)], self.rng
            )
        return metrics

    def finish(self, metrics) -> None:
        jax.block_until_ready(metrics)
        # The share of the last step's micro-batches that ran with token packing.
        self.packed = float(metrics.get("train/packed", 0.0))
        loss = float(metrics["train/loss"])
        if not np.isfinite(loss):
            raise FloatingPointError(f"bertjax train step gave a non-finite loss {loss}")


class ReferenceRunner:
    """transformers' BertForPreTraining with torch AdamW, on the same batches."""

    def __init__(
        self, model_config, opt_config, batches: list[dict[str, np.ndarray]], dtype: str, seed: int
    ):
        torch.manual_seed(seed)
        torch.set_num_threads(os.cpu_count() or 1)
        hf_config = transformers.BertConfig(
            vocab_size=model_config.vocab_size,
            hidden_size=model_config.hidden_size,
            num_hidden_layers=model_config.num_layers,
            num_attention_heads=model_config.num_heads,
            intermediate_size=model_config.intermediate_size,
            hidden_act="gelu" if model_config.hidden_act == "gelu" else "gelu_pytorch_tanh",
            hidden_dropout_prob=model_config.hidden_dropout,
            attention_probs_dropout_prob=model_config.attention_dropout,
            max_position_embeddings=model_config.max_position_embeddings,
            type_vocab_size=model_config.type_vocab_size,
            layer_norm_eps=model_config.layer_norm_eps,
            initializer_range=model_config.initializer_range,
        )
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = transformers.BertForPreTraining(hf_config).to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=opt_config.learning_rate,
            betas=(opt_config.b1, opt_config.b2),
            eps=opt_config.eps,
            weight_decay=opt_config.weight_decay,
        )
        self.max_grad_norm = opt_config.max_grad_norm
        self.autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None
        self.batches = [self._to_torch(b) for b in batches]

    def _to_torch(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        # transformers' MLM loss takes a [B, S] label tensor, -100 where nothing is predicted.
        labels = np.full(batch["input_ids"].shape, -100, np.int64)
        rows = np.arange(labels.shape[0])[:, None]
        labels[rows, batch["masked_lm_positions"]] = batch["masked_lm_ids"]

        def as_long(x):
            return torch.from_numpy(np.asarray(x, np.int64)).to(self.device)

        return {
            "input_ids": as_long(batch["input_ids"]),
            "attention_mask": as_long(batch["input_mask"]),
            "token_type_ids": as_long(batch["segment_ids"]),
            "labels": as_long(labels),
            "next_sentence_label": as_long(batch["next_sentence_labels"]),
        }

    def step(self, i: int):
        batch = self.batches[i % len(self.batches)]
        self.optimizer.zero_grad(set_to_none=True)
        if self.autocast_dtype is not None:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                loss = self.model(**batch).loss
        else:
            loss = self.model(**batch).loss
        loss.backward()
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return loss.detach()

    def finish(self, loss) -> None:
        value = float(loss)  # synchronises a GPU
        if not np.isfinite(value):
            raise FloatingPointError(f"transformers train step gave a non-finite loss {value}")


# ----------------------------------------------------------------------------- report


def versions() -> str:
    parts = [
        f"python {platform.python_version()}",
        f"jax {jax.__version__}",
        f"flax {flax.__version__}",
        f"optax {optax.__version__}",
        f"numpy {np.__version__}",
    ]
    if torch is not None:
        parts += [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    return ", ".join(parts)


def format_rate(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def median_timing(timings: list[Timing]) -> Timing:
    """The round with the median step time."""
    ordered = sorted(timings, key=lambda t: t.seconds)
    return ordered[(len(ordered) - 1) // 2]


def print_table(rows: list[Timing], peak: float | None, matmul_fraction: dict[str, float]) -> None:
    header = f"{'':<26}" + "".join(f"{t.name:>16}" for t in rows)
    lines = [header, "-" * len(header)]

    def line(label: str, fn: Callable[[Timing], str]) -> None:
        lines.append(f"{label:<26}" + "".join(f"{fn(t):>16}" for t in rows))

    line("devices", lambda t: str(t.devices))
    line("step time", lambda t: f"{t.step_time * 1e3:.1f} ms")
    line("CPU time per step", lambda t: f"{t.cpu_seconds / t.steps:.2f} s")
    line("sequences/s", lambda t: f"{t.sequences_per_sec:.2f}")
    line("tokens/s", lambda t: f"{t.tokens_per_sec:.1f}")
    line("model FLOP/s", lambda t: format_rate(t.flops_per_sec, "FLOP/s"))
    line(
        "MFU (data-sheet peak)",
        lambda t: f"{100 * t.flops_per_sec / (peak * t.devices):.1f} %" if peak else "n/a",
    )
    line("of measured matmul rate", lambda t: f"{100 * matmul_fraction[t.name]:.1f} %")
    print("\n".join(lines))


def matmul_probe_settings(args: argparse.Namespace) -> tuple[int, int]:
    """(size, repeats) of the matmul probe: big enough to be compute-bound on the backend."""
    on_cpu = jax.default_backend() == "cpu"
    size = args.matmul_size or (1024 if on_cpu else 8192)
    return size, 20 if on_cpu else 50


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark, prints the report and returns its headline figures."""
    args = parse_args(argv)
    command = [sys.executable, sys.argv[0]] + (sys.argv[1:] if argv is None else list(argv))
    print("command:", " ".join(shlex.quote(a) for a in command))
    device = jax.devices()[0]
    print(f"versions: {versions()}")
    print(
        f"backend: {jax.default_backend()}, {jax.device_count()} x {device.device_kind}, "
        f"{os.cpu_count()} CPU cores, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
    )
    if hasattr(os, "getloadavg"):
        print("load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))

    rng = np.random.default_rng(args.seed)
    batches = [
        synthetic_batch(rng, args.batch_size, args.seq_len, args.num_predictions, args.vocab_size)
        for _ in range(4)
    ]
    real_tokens = sum(int(b["input_mask"].sum()) for b in batches) / (
        len(batches) * args.batch_size
    )
    # The fill of the fullest batch (whole-batch, which on one device is what packing needs),
    # as a user would read it off train/packed or the data; rounded up to 1/32.
    fill = max(float(b["input_mask"].mean()) for b in batches)
    token_capacity = args.token_capacity or min(1.0, np.ceil(fill * 32) / 32)
    config = load_config(args.config, args, token_capacity)
    settings = PretrainSettings.from_config(config)

    ours = OursRunner(settings, batches)
    model_config = ours.model_config
    flops_per_seq = perf.training_flops_per_sequence(
        model_config, args.seq_len, args.num_predictions
    )
    print(
        f"model: {config.model.preset} (L{model_config.num_layers}/H{model_config.hidden_size}/"
        f"A{model_config.num_heads}, V{model_config.vocab_size}), {args.dtype} compute, "
        f"attention_impl={model_config.attention_impl}, mesh {dict(ours.setup.mesh.shape)}"
    )
    print(
        f"batch {args.batch_size} x seq {args.seq_len}, {args.num_predictions} predictions, "
        f"{real_tokens:.1f} real tokens per sequence on average "
        f"(fullest batch {100 * fill:.1f} %), "
        f"token_capacity {config.token_capacity:g}; "
        f"optimizer {config.optimizer.name}; "
        f"{format_rate(flops_per_seq, 'FLOP')} model FLOPs per sequence"
    )

    runners: list[tuple[str, Any, int]] = [("bertjax", ours, jax.device_count())]
    if not args.no_reference:
        if torch is None:
            print("transformers reference skipped: torch/transformers are not installed")
        else:
            opt_settings = settings.optimizer
            if opt_settings.name != "adamw":
                print(f"note: config optimizer is {opt_settings.name}; the reference uses AdamW")
            reference = ReferenceRunner(model_config, opt_settings, batches, args.dtype, args.seed)
            print(
                f"reference: transformers BertForPreTraining on {reference.device}, "
                f"attention {reference.model.config._attn_implementation}, AdamW, "
                f"{torch.get_num_threads()} torch threads"
            )
            runners.append(("transformers", reference, 1))

    # Compile and warm up, then time in rounds so that load changes hit every side alike.
    for name, runner, _ in runners:
        seconds, _ = time_steps(runner.step, runner.finish, 1 + args.warmup)
        print(f"{name}: first {1 + args.warmup} steps (compile + warm-up) {seconds:.1f} s")
    probe_size, probe_repeats = matmul_probe_settings(args)
    timings: dict[str, list[Timing]] = {name: [] for name, _, _ in runners}
    matmul_rates: list[float] = []
    for round_index in range(args.rounds):
        for name, runner, devices in runners:
            seconds, cpu_seconds = time_steps(runner.step, runner.finish, args.steps)
            timings[name].append(
                Timing(
                    name,
                    seconds,
                    cpu_seconds,
                    args.steps,
                    args.batch_size,
                    args.seq_len,
                    flops_per_seq,
                    devices,
                )
            )
        matmul_rates.append(
            perf.measure_matmul_flops(args.dtype, probe_size, repeats=probe_repeats)
        )
        print(
            f"round {round_index + 1}/{args.rounds}: "
            + ", ".join(
                f"{name} {timings[name][-1].step_time * 1e3:.1f} ms/step" for name, _, _ in runners
            )
            + f", matmul {format_rate(matmul_rates[-1], 'FLOP/s')}",
            flush=True,
        )

    # Fractions and ratios are taken within each round (same load), then their median.
    fractions = {
        name: [t.flops_per_sec / (m * t.devices) for t, m in zip(ts, matmul_rates)]
        for name, ts in timings.items()
    }
    matmul_fraction = {name: statistics.median(f) for name, f in fractions.items()}
    peak = perf.peak_flops_per_device(device.device_kind, args.dtype)
    rows = [median_timing(timings[name]) for name, _, _ in runners]
    print()
    print(
        f"medians over {args.rounds} rounds of {args.steps} steps; matmul probe "
        f"({probe_size}^3 {args.dtype}, one device): "
        f"{format_rate(statistics.median(matmul_rates), 'FLOP/s')}; "
        "data-sheet peak: "
        + (format_rate(peak, "FLOP/s") if peak else f"unknown for {device.device_kind}")
    )
    print_table(rows, peak, matmul_fraction)
    print(
        f"bertjax token packing: {'on' if ours.packed else 'off'} in the last timed step "
        f"(token_capacity {config.token_capacity:g})"
    )

    ours_row = rows[0]
    result: dict[str, Any] = {
        "tokens_per_sec": ours_row.tokens_per_sec,
        "fraction_of_matmul": matmul_fraction["bertjax"],
        "mfu": ours_row.flops_per_sec / (peak * ours_row.devices) if peak else None,
    }
    print(
        "\nbertjax fraction of the measured matmul rate, per round: "
        + ", ".join(f"{100 * f:.1f} %" for f in fractions["bertjax"])
        + f" (median {100 * result['fraction_of_matmul']:.1f} %)"
    )
    if "transformers" in timings:
        ratios = [
            r.seconds / o.seconds for o, r in zip(timings["bertjax"], timings["transformers"])
        ]
        result["speedup_vs_transformers"] = statistics.median(ratios)
        print(
            "bertjax / transformers tokens/s, per round: "
            + ", ".join(f"{r:.2f}x" for r in ratios)
            + f" (median {result['speedup_vs_transformers']:.2f}x)"
        )
    return result


if __name__ == "__main__":
    main()
