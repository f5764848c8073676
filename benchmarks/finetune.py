"""Fine-tuning throughput: bertjax's epoch against transformers' BertForSequenceClassification.

    python benchmarks/finetune.py                        # BERT-small (L4/H512/A8), B32, S128
    python benchmarks/finetune.py --examples 4096 --preset base --dtype bfloat16  # accelerators

Times whole epochs of sentence-pair classification (google's recipe: AdamW with BERT's decay
mask, warmup then linear decay, clipping at 1.0, dropout 0.1, max_seq_length 128) on the same
synthetic examples on both sides: random token ids, [CLS] A [SEP] B [SEP] with each text's
length drawn uniformly from --text_lengths (the default, 8 to 40 pieces, is about MRPC's and
RTE's), two labels. bertjax runs the epoch as finetune.py does (host batches from the epoch's
permutation, assembled into global arrays, the jitted and donated train step) three ways:
padded to max_seq_length; cut to length buckets (config.length_bucket, finetune.py's default:
each batch to the smallest multiple of 32 positions that holds its longest example); and
bucketed with token packing as well, finetune.py's default (config.token_capacity 0: packed
slots just enough for the fullest batch of the run). On every bertjax side the classifier's
last encoder layer runs at [CLS] alone, as in finetune.py (the pooled output reads nothing
else).
transformers runs with torch's AdamW and get_linear_schedule_with_warmup, once on the
same padded batches (as its run_glue.py does by default, --pad_to_max_length True) and once
padded to each batch's longest example (DataCollatorWithPadding, --pad_to_max_length False).

Compilation and torch's first steps are excluded: each side runs one untimed epoch first.
Shared machines are noisy: the epochs run in rounds (every side once per round), ratios are
taken within each round and their median is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time

import flax
import jax
import numpy as np
import optax

# The script runs from a checkout: make `bertjax` importable from the root.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from bertjax import heads, optim, steps  # noqa: E402
from bertjax.capability import HeadSpec  # noqa: E402
from bertjax.finetune import data as task_data  # noqa: E402
from bertjax.finetune import loop  # noqa: E402
from bertjax.finetune.objective import build_finetuning  # noqa: E402
from bertjax.model import PRESETS, BertConfig  # noqa: E402

try:  # the reference is optional: torch and transformers live in the `hf` extra
    import torch
    import transformers
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
    transformers = None

FIRST_REAL_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK]
CLS_ID, SEP_ID = 2, 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--examples", type=int, default=128, help="training examples per epoch")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument(
        "--text_lengths",
        default="8,40",
        help="min,max pieces of each text of a pair (uniform); the default is about MRPC's",
    )
    parser.add_argument(
        "--length_bucket", type=int, default=32, help="config.length_bucket of the bucketed sides"
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per side")
    parser.add_argument("--no_reference", action="store_true", help="skip transformers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("examples", "batch_size", "max_seq_length", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    if args.length_bucket < 0:
        parser.error(f"--length_bucket={args.length_bucket} is invalid: must be >= 0")
    if args.examples < args.batch_size:
        parser.error(f"--examples={args.examples} must be at least --batch_size={args.batch_size}")
    try:
        low, high = (int(x) for x in args.text_lengths.split(","))
    except ValueError:
        parser.error(f"--text_lengths={args.text_lengths!r} is invalid: give min,max like 8,40")
    if not 1 <= low <= high or 2 * high + 3 > args.max_seq_length:
        parser.error(
            f"--text_lengths={args.text_lengths!r} is invalid: need 1 <= min <= max and "
            f"2 * max + 3 <= --max_seq_length={args.max_seq_length}"
        )
    args.text_lengths = (low, high)
    return args


def synthetic_examples(args: argparse.Namespace) -> task_data.Examples:
    """Sentence pairs [CLS] A [SEP] B [SEP] of random ids, padded to max_seq_length."""
    rng = np.random.default_rng(args.seed)
    n, length = args.examples, args.max_seq_length
    input_ids = np.zeros((n, length), np.int32)
    input_mask = np.zeros((n, length), np.int32)
    segment_ids = np.zeros((n, length), np.int32)
    low, high = args.text_lengths
    for row in range(n):
        a, b = (int(x) for x in rng.integers(low, high + 1, size=2))
        ids = [CLS_ID, *rng.integers(FIRST_REAL_ID, args.vocab_size, a), SEP_ID]
        ids += [*rng.integers(FIRST_REAL_ID, args.vocab_size, b), SEP_ID]
        input_ids[row, : len(ids)] = ids
        input_mask[row, : len(ids)] = 1
        segment_ids[row, a + 2 : len(ids)] = 1
    features = {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "labels": rng.integers(0, 2, n).astype(np.int32),
    }
    return task_data.Examples("train", "synthetic", features, [str(i) for i in range(n)], True)


class Bertjax:
    """An epoch as finetune.py runs it: host batches, global arrays, the jitted step."""

    def __init__(self, args, examples, optimizer, token_capacity: float, length_bucket: int):
        self.examples, self.batch_size = examples, args.batch_size
        self.length_bucket = length_bucket
        config = BertConfig.preset(args.preset, vocab_size=args.vocab_size, dtype=args.dtype)
        head = HeadSpec(heads.CLASSIFICATION, ("0", "1"))
        self.ft = build_finetuning(
            config,
            head,
            optimizer,
            mesh_shape=(-1, 1, 1),
            grad_accum_steps=1,
            micro_batch_size=args.batch_size,
            max_seq_length=args.max_seq_length,
            token_capacity=token_capacity,
        )
        with jax.set_mesh(self.ft.mesh):
            self.state = self.ft.state.init(jax.random.key(args.seed))
        self.rng = jax.random.key(args.seed + 1)
        self.epoch = 0

    def run_epoch(self) -> float:
        """Trains one epoch; its loss (the last step's)."""
        order = loop.epoch_order(0, self.epoch, len(self.examples))
        metrics = None
        with jax.set_mesh(self.ft.mesh):
            for index in range(len(self.examples) // self.batch_size):
                local = loop.train_batch(
                    self.examples, order, index, self.batch_size, self.length_bucket
                )
                batch = steps.global_batch(local, self.ft.batch_sharding, jax.process_count())
                self.state, metrics = self.ft.train_step(self.state, batch, self.rng)
        self.epoch += 1
        self.packed = float(metrics.get("train/packed", 0.0))
        return float(metrics["train/loss"])  # waits for the device


class Transformers:
    """transformers' BertForSequenceClassification with torch's AdamW and linear schedule."""

    def __init__(self, args, examples, optimizer: optim.OptimizerSettings, dynamic: bool):
        torch.manual_seed(args.seed)
        torch.set_num_threads(os.cpu_count() or 1)
        config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
        hf_config = transformers.BertConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            intermediate_size=config.intermediate_size,
            num_labels=2,
        )
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = transformers.BertForSequenceClassification(hf_config).to(self.device)
        self.model.train()
        # google's recipe: no weight decay on biases and LayerNorm, as BERT's decay mask.
        decay = [p for n, p in self.model.named_parameters() if not _no_decay(n)]
        rest = [p for n, p in self.model.named_parameters() if _no_decay(n)]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": optimizer.weight_decay},
                {"params": rest, "weight_decay": 0.0},
            ],
            lr=optimizer.learning_rate,
            betas=(optimizer.b1, optimizer.b2),
            eps=optimizer.eps,
        )
        self.schedule = transformers.get_linear_schedule_with_warmup(
            self.optimizer, optimizer.warmup_steps, optimizer.total_steps
        )
        self.autocast = torch.bfloat16 if args.dtype == "bfloat16" else None
        self.examples, self.batch_size, self.dynamic = examples, args.batch_size, dynamic
        self.epoch = 0

    def run_epoch(self) -> float:
        order = loop.epoch_order(0, self.epoch, len(self.examples))
        features = self.examples.features
        loss = None
        for index in range(len(self.examples) // self.batch_size):
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            width = int(features["input_mask"][rows].sum(axis=1).max()) if self.dynamic else None
            batch = {
                name: torch.from_numpy(features[key][rows][:, :width].astype(np.int64))
                for name, key in (
                    ("input_ids", "input_ids"),
                    ("attention_mask", "input_mask"),
                    ("token_type_ids", "segment_ids"),
                )
            }
            batch["labels"] = torch.from_numpy(features["labels"][rows].astype(np.int64))
            batch = {name: tensor.to(self.device) for name, tensor in batch.items()}
            self.optimizer.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=self.autocast, enabled=bool(self.autocast)):
                loss = self.model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.schedule.step()
        self.epoch += 1
        return float(loss.detach())  # synchronises a GPU


def _no_decay(name: str) -> bool:
    return "bias" in name or "LayerNorm" in name


def versions() -> str:
    parts = [f"python {platform.python_version()}", f"jax {jax.__version__}"]
    parts += [f"flax {flax.__version__}", f"optax {optax.__version__}"]
    if torch is not None:
        parts += [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Runs the benchmark, prints the table and returns examples/s per side."""
    args = parse_args(argv)
    command = [sys.executable, sys.argv[0]] + (sys.argv[1:] if argv is None else list(argv))
    print("command:", " ".join(shlex.quote(a) for a in command))
    print(f"versions: {versions()}")
    print(
        f"backend: {jax.default_backend()}, {jax.device_count()} x {jax.devices()[0].device_kind},"
        f" {os.cpu_count()} CPU cores"
    )
    if hasattr(os, "getloadavg"):
        print("load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    examples = synthetic_examples(args)
    mask = examples.features["input_mask"]
    fill = float(mask.mean())
    steps_per_epoch = len(examples) // args.batch_size
    # As finetune.py chooses by default (token_capacity 0): the fullest batch of the run
    # (seed 0, every epoch timed or not) sets the packed slots.
    capacity = loop.fitting_capacity(examples, (0,), args.rounds + 1, args.batch_size, 1, 1)
    total = steps_per_epoch * (args.rounds + 1)
    optimizer = optim.OptimizerSettings(
        learning_rate=2e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    model = PRESETS[args.preset]
    print(
        f"model: {args.preset} (L{model['num_layers']}/H{model['hidden_size']}/"
        f"A{model['num_heads']}, V{args.vocab_size}) + classifier, {args.dtype} compute; "
        f"{args.examples} pairs per epoch, batch {args.batch_size} x {args.max_seq_length}, "
        f"{100 * fill:.1f} % of positions real, token_capacity {capacity:.3f} when packing"
    )

    sides = {
        "bertjax padded": Bertjax(args, examples, optimizer, 1.0, 0),
        "bertjax bucketed": Bertjax(args, examples, optimizer, 1.0, args.length_bucket),
        "bertjax bucketed+packed": Bertjax(args, examples, optimizer, capacity, args.length_bucket),
    }
    if not args.no_reference and torch is not None:
        sides["transformers padded"] = Transformers(args, examples, optimizer, dynamic=False)
        sides["transformers dynamic"] = Transformers(args, examples, optimizer, dynamic=True)
    elif not args.no_reference:
        print("transformers reference skipped: torch/transformers are not installed")
    for name, side in sides.items():
        start = time.perf_counter()
        side.run_epoch()
        print(f"{name}: first epoch (compile / warm-up) {time.perf_counter() - start:.1f} s")

    rates: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(args.rounds):
        for name, side in sides.items():
            start = time.perf_counter()
            loss = side.run_epoch()
            seconds = time.perf_counter() - start
            if not np.isfinite(loss):
                raise FloatingPointError(f"{name}: non-finite loss {loss}")
            rates[name].append(steps_per_epoch * args.batch_size / seconds)
        print(
            f"round {round_index + 1}/{args.rounds}: "
            + ", ".join(f"{name} {r[-1]:.2f} examples/s" for name, r in rates.items()),
            flush=True,
        )
    print()
    width = max(len(name) for name in sides) + 2
    print(f"{'':<{width}}{'examples/s':>12}{'epoch (s)':>12}")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<{width}}{median:>12.2f}{args.examples / median:>12.1f}")
    packed = sides["bertjax bucketed+packed"].packed
    print(f"bertjax bucketed+packed: {100 * packed:.0f} % of steps fit the packed slots")
    if len(sides) > 3:
        print()
        for ours in ("bertjax padded", "bertjax bucketed", "bertjax bucketed+packed"):
            for theirs in ("transformers padded", "transformers dynamic"):
                ratio = statistics.median(a / b for a, b in zip(rates[ours], rates[theirs]))
                print(f"{ours} / {theirs}: {ratio:.2f}x")
    return {name: statistics.median(values) for name, values in rates.items()}


if __name__ == "__main__":
    main()
