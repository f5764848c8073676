"""Question-answering throughput: bertjax's QA training and prediction beside transformers'
BertForQuestionAnswering, on the same model and the same windows.

    python benchmarks/qa.py                       # BERT-small (L4/H512/A8), B32, S384
    python benchmarks/qa.py --preset base --windows 512 --dtype bfloat16   # accelerators

Windows are SQuAD-shaped ([CLS] question [SEP] context [SEP], run_squad.py's
max_seq_length 384): random ids, a question of --question_lengths pieces and a context of
--context_lengths pieces (the default, 100 to 250, is about SQuAD v1.1's paragraphs), an
answer span of 1 to 5 tokens inside the context. Training runs as finetune.py runs a
question_answering epoch (the task's objective built by build_finetuning, host batches from
the epoch's permutation, the jitted donated step with google's AdamW recipe), padded to
max_seq_length and with finetune.py's defaults (length buckets of 32 and token packing).
transformers trains with torch's AdamW and linear schedule, on the padded batches and on
batches padded to their longest window. Prediction: the windows' start and end logits,
bertjax as the fine-tuning loop evaluates (finetune.loop.run_eval), transformers in
torch.no_grad on the same padded batches.

Compilation and torch's first steps are excluded (one untimed pass per side). Rounds run
every side once; ratios are taken within each round and their median printed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

import jax
import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from benchmarks.finetune import _no_decay, versions  # noqa: E402
from bertjax import optim, steps  # noqa: E402
from bertjax.capability import HeadSpec  # noqa: E402
from bertjax.finetune import loop  # noqa: E402
from bertjax.finetune.objective import build_finetuning  # noqa: E402
from bertjax.finetune.task import Examples  # noqa: E402
from bertjax.model import PRESETS, BertConfig  # noqa: E402
from bertjax.tasks.qa import squad  # noqa: E402

try:  # the reference is optional: torch and transformers live in the `hf` extra
    import torch
    import transformers
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
    transformers = None

FIRST_REAL_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK]
CLS_ID, SEP_ID = 2, 3
HEAD = HeadSpec(squad.TASK, squad.HEAD_LABELS)


def _pair(text: str, name: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        parser.error(f"--{name}={text!r} is invalid: give min,max like 100,250")
    if not 1 <= low <= high:
        parser.error(f"--{name}={text!r} is invalid: need 1 <= min <= max")
    return low, high


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--windows", type=int, default=64, help="training windows per epoch")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=384)
    parser.add_argument("--question_lengths", default="6,20")
    parser.add_argument("--context_lengths", default="100,250")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--rounds", type=int, default=2, help="timed passes per side")
    parser.add_argument("--no_reference", action="store_true", help="skip transformers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("windows", "batch_size", "max_seq_length", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    if args.windows < args.batch_size:
        parser.error(f"--windows={args.windows} must be at least --batch_size={args.batch_size}")
    args.question_lengths = _pair(args.question_lengths, "question_lengths", parser)
    args.context_lengths = _pair(args.context_lengths, "context_lengths", parser)
    if args.question_lengths[1] + args.context_lengths[1] + 3 > args.max_seq_length:
        parser.error("the longest question and context must fit in --max_seq_length with 3 more")
    return args


def synthetic_windows(args: argparse.Namespace) -> Examples:
    """SQuAD-shaped windows of random ids with an answer span in each context."""
    rng = np.random.default_rng(args.seed)
    n, length = args.windows, args.max_seq_length
    features = {
        name: np.zeros((n, length), np.int32) for name in ("input_ids", "input_mask", "segment_ids")
    }
    starts, ends = np.zeros(n, np.int32), np.zeros(n, np.int32)
    for row in range(n):
        q = int(rng.integers(args.question_lengths[0], args.question_lengths[1] + 1))
        c = int(rng.integers(args.context_lengths[0], args.context_lengths[1] + 1))
        ids = [CLS_ID, *rng.integers(FIRST_REAL_ID, args.vocab_size, q), SEP_ID]
        context_start = len(ids)
        ids += [*rng.integers(FIRST_REAL_ID, args.vocab_size, c), SEP_ID]
        features["input_ids"][row, : len(ids)] = ids
        features["input_mask"][row, : len(ids)] = 1
        features["segment_ids"][row, context_start : len(ids)] = 1
        starts[row] = context_start + int(rng.integers(0, c - 4 if c > 5 else 1))
        ends[row] = min(starts[row] + int(rng.integers(0, 5)), context_start + c - 1)
    features["start_positions"], features["end_positions"] = starts, ends
    return Examples("train", "synthetic", features, [str(i) for i in range(n)], True)


class Bertjax:
    """A question_answering epoch as finetune.py runs it, and the loop's evaluation."""

    def __init__(self, args, windows, optimizer, token_capacity: float, length_bucket: int):
        self.windows, self.batch_size, self.length_bucket = windows, args.batch_size, length_bucket
        config = BertConfig.preset(args.preset, vocab_size=args.vocab_size, dtype=args.dtype)
        self.ft = build_finetuning(
            config,
            HEAD,
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
        order = loop.epoch_order(0, self.epoch, len(self.windows))
        metrics = None
        with jax.set_mesh(self.ft.mesh):
            for index in range(len(self.windows) // self.batch_size):
                local = loop.train_batch(
                    self.windows, order, index, self.batch_size, self.length_bucket
                )
                batch = steps.global_batch(local, self.ft.batch_sharding, jax.process_count())
                self.state, metrics = self.ft.train_step(self.state, batch, self.rng)
        self.epoch += 1
        return float(metrics["train/loss"])  # waits for the device

    def predict(self) -> np.ndarray:
        with jax.set_mesh(self.ft.mesh):
            _, outputs = loop.run_eval(self.ft, self.state.params, self.windows, self.batch_size)
        return outputs["start_logits"]


class Transformers:
    """transformers' BertForQuestionAnswering with torch's AdamW and linear schedule."""

    def __init__(self, args, windows, optimizer: optim.OptimizerSettings, dynamic: bool):
        torch.manual_seed(args.seed)
        torch.set_num_threads(os.cpu_count() or 1)
        config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
        hf_config = transformers.BertConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            intermediate_size=config.intermediate_size,
            max_position_embeddings=max(512, args.max_seq_length),
        )
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = transformers.BertForQuestionAnswering(hf_config).to(self.device)
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
        self.windows, self.batch_size, self.dynamic = windows, args.batch_size, dynamic
        self.epoch = 0

    def _batch(self, rows: np.ndarray, dynamic: bool) -> dict:
        features = self.windows.features
        width = int(features["input_mask"][rows].sum(axis=1).max()) if dynamic else None
        batch = {
            name: torch.from_numpy(features[key][rows][:, :width].astype(np.int64))
            for name, key in (
                ("input_ids", "input_ids"),
                ("attention_mask", "input_mask"),
                ("token_type_ids", "segment_ids"),
            )
        }
        return {name: tensor.to(self.device) for name, tensor in batch.items()}

    def run_epoch(self) -> float:
        self.model.train()
        order = loop.epoch_order(0, self.epoch, len(self.windows))
        loss = None
        for index in range(len(self.windows) // self.batch_size):
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            batch = self._batch(rows, self.dynamic)
            for name in ("start_positions", "end_positions"):
                positions = self.windows.features[name][rows].astype(np.int64)
                batch[name] = torch.from_numpy(positions).to(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=self.autocast, enabled=bool(self.autocast)):
                loss = self.model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.schedule.step()
        self.epoch += 1
        return float(loss.detach())

    def predict(self) -> np.ndarray:
        self.model.eval()
        out = []
        with torch.no_grad():
            for first in range(0, len(self.windows), self.batch_size):
                rows = np.arange(first, min(first + self.batch_size, len(self.windows)))
                with torch.autocast(
                    self.device.type, dtype=self.autocast, enabled=bool(self.autocast)
                ):
                    logits = self.model(**self._batch(rows, self.dynamic)).start_logits
                out.append(logits.float().cpu().numpy())
        return out


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _ratios(rates: dict[str, list[float]], ours: list[str], theirs: list[str]) -> None:
    for a in ours:
        for b in theirs:
            ratio = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
            print(f"{a} / {b}: {ratio:.2f}x")


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Runs the benchmark, prints the tables and ratios; windows/s per side and phase."""
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
    windows = synthetic_windows(args)
    steps_per_epoch = len(windows) // args.batch_size
    capacity = loop.fitting_capacity(windows, (0,), args.rounds + 1, args.batch_size, 1, 1)
    total = steps_per_epoch * (args.rounds + 1)
    optimizer = optim.OptimizerSettings(
        learning_rate=3e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    model = PRESETS[args.preset]
    fill = float(windows.features["input_mask"].mean())
    print(
        f"model: {args.preset} (L{model['num_layers']}/H{model['hidden_size']}/"
        f"A{model['num_heads']}, V{args.vocab_size}) + qa_outputs, {args.dtype} compute; "
        f"{args.windows} windows, batch {args.batch_size} x {args.max_seq_length}, "
        f"{100 * fill:.1f} % of positions real, token_capacity {capacity:.3f} when packing"
    )
    train = {
        "bertjax padded": Bertjax(args, windows, optimizer, 1.0, 0),
        "bertjax bucketed+packed": Bertjax(args, windows, optimizer, capacity, 32),
    }
    predict = {"bertjax predict": train["bertjax padded"]}
    if not args.no_reference and torch is not None:
        train["transformers padded"] = Transformers(args, windows, optimizer, dynamic=False)
        train["transformers dynamic"] = Transformers(args, windows, optimizer, dynamic=True)
        predict["transformers predict padded"] = train["transformers padded"]
        predict["transformers predict dynamic"] = train["transformers dynamic"]
    elif not args.no_reference:
        print("transformers reference skipped: torch/transformers are not installed")
    for name, side in train.items():
        print(f"{name}: first epoch (compile / warm-up) {_timed(side.run_epoch):.1f} s")
    for name, side in predict.items():
        print(f"{name}: first pass (compile / warm-up) {_timed(side.predict):.1f} s")

    train_rates = {name: [] for name in train}
    predict_rates = {name: [] for name in predict}
    for round_index in range(args.rounds):
        for name, side in train.items():
            train_rates[name].append(steps_per_epoch / _timed(side.run_epoch))
        for name, side in predict.items():
            predict_rates[name].append(len(windows) / _timed(side.predict))
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)
    print()
    width = max(len(name) for name in (*train, *predict)) + 2
    print(f"{'training':<{width}}{'steps/s':>10}{'windows/s':>12}")
    for name, values in train_rates.items():
        median = statistics.median(values)
        print(f"{name:<{width}}{median:>10.3f}{median * args.batch_size:>12.2f}")
    print(f"{'prediction':<{width}}{'':>10}{'windows/s':>12}")
    for name, values in predict_rates.items():
        print(f"{name:<{width}}{'':>10}{statistics.median(values):>12.2f}")
    if len(train) > 2:
        print()
        _ratios(
            train_rates,
            ["bertjax padded", "bertjax bucketed+packed"],
            ["transformers padded", "transformers dynamic"],
        )
        _ratios(
            predict_rates,
            ["bertjax predict"],
            ["transformers predict padded", "transformers predict dynamic"],
        )
    result = {f"train {k}": statistics.median(v) for k, v in train_rates.items()}
    result.update({f"predict {k}": statistics.median(v) for k, v in predict_rates.items()})
    return result


if __name__ == "__main__":
    main()
