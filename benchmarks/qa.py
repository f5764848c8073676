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

Compilation and torch's first steps are excluded: bertjax compiles its step and evaluation
at every width a run can meet (each length bucket) before timing, as a long run would have
after its first steps, and every side runs one untimed epoch and prediction pass. Rounds run
every side once; ratios are taken within each round and their median printed.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from bertjax import optim, perf, steps  # noqa: E402
from bertjax.capability import HeadSpec  # noqa: E402
from bertjax.finetune import loop  # noqa: E402
from bertjax.finetune.objective import build_finetuning  # noqa: E402
from bertjax.finetune.task import Examples  # noqa: E402
from bertjax.model import PRESETS, BertConfig  # noqa: E402
from bertjax.tasks.qa import model as qa_model  # noqa: E402
from bertjax.tasks.qa import squad  # noqa: E402
from bertjax.tasks.qa import task as qa_task  # noqa: E402

try:  # the reference is optional: torch and transformers live in the `hf` extra
    import torch
    import transformers
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
    transformers = None

FIRST_REAL_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK]
CLS_ID, SEP_ID = 2, 3
HEAD = HeadSpec(qa_model.TASK, qa_model.HEAD_LABELS)


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
    parser.add_argument(
        "--windows", type=int, default=64, help="training windows per epoch (--squad: at most)"
    )
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=384)
    parser.add_argument("--question_lengths", default="6,20")
    parser.add_argument("--context_lengths", default="100,250")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--rounds", type=int, default=2, help="timed passes per side")
    parser.add_argument("--no_reference", action="store_true", help="skip transformers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--squad",
        default="",
        help="a SQuAD JSON file: train on its real windows (run_squad's doc_stride 128) "
        "instead of synthetic ones; needs --init_from for the vocabulary",
    )
    parser.add_argument(
        "--init_from",
        default="",
        help="a Hugging Face BERT directory (e.g. a MiniLM): its architecture, weights and "
        "vocabulary on both sides (overrides --preset and --vocab_size)",
    )
    parser.add_argument(
        "--micro_batches",
        type=int,
        default=4,
        help="micro-batches grouped by length per batch (both sides' length-grouped runs)",
    )
    parser.add_argument(
        "--grouped_only",
        action="store_true",
        help="only the length-grouped sides (bertjax and transformers): one bertjax side's "
        "programs instead of three, and a third of the time",
    )
    args = parser.parse_args(argv)
    if args.squad and not args.init_from:
        parser.error("--squad needs --init_from (the vocabulary that cuts the windows)")
    if args.micro_batches < 1 or args.batch_size % args.micro_batches:
        parser.error(f"--micro_batches={args.micro_batches} must divide --batch_size")
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


def real_windows(args: argparse.Namespace, tokenizer) -> Examples:
    """The training windows finetune.py cuts from a SQuAD file (max_seq_length, stride 128)."""
    settings = squad.QASettings(max_seq_length=args.max_seq_length)
    windows, _ = qa_task.encode_split("train", args.squad, tokenizer, settings, training=True)
    count = min(args.windows, len(windows))  # the file's first windows, in order
    features = {name: array[:count] for name, array in windows.features.items()}
    return Examples("train", args.squad, features, [str(i) for i in range(count)], True)


def model_config(args: argparse.Namespace, source) -> BertConfig:
    if source is not None:
        return dataclasses.replace(source.config, dtype=args.dtype)
    return BertConfig.preset(args.preset, vocab_size=args.vocab_size, dtype=args.dtype)


class Bertjax:
    """A question_answering epoch as finetune.py runs it, and the loop's evaluation.

    `micro_batches` > 1: each batch as length-grouped micro-batches (group_by_length);
    otherwise one batch cut to `length_bucket`, token-packed to `token_capacity`.
    """

    def __init__(
        self,
        args,
        windows,
        optimizer,
        token_capacity: float,
        length_bucket: int,
        micro_batches: int = 1,
        source=None,
    ):
        self.windows, self.batch_size, self.length_bucket = windows, args.batch_size, length_bucket
        self.micro_batches = micro_batches
        self.ft = build_finetuning(
            model_config(args, source),
            HEAD,
            optimizer,
            mesh_shape=(-1, 1, 1),
            grad_accum_steps=micro_batches,
            micro_batch_size=args.batch_size // micro_batches,
            max_seq_length=args.max_seq_length,
            token_capacity=token_capacity,
        )
        with jax.set_mesh(self.ft.mesh):
            self.state = self.ft.state.init(jax.random.key(args.seed))
            if source is not None:  # the encoder's real weights, a fresh qa_outputs head
                params, _, _ = loop.initial_params(source, self.ft, self.state.params)
                self.state = self.state.replace(params=params)
        self.rng = jax.random.key(args.seed + 1)
        self.epoch = 0

    def compile_widths(self) -> None:
        """Compiles the train step and the evaluation at every width a run can meet.

        A run meets each width once and keeps its program, so a long run's steady state pays no
        compilation; an epoch of a few steps would meet new widths in the timed rounds. The
        steps run on a throwaway state.
        """
        features = self.windows.features
        seq = features["input_mask"].shape[1]
        rows = self.batch_size // self.micro_batches
        with jax.set_mesh(self.ft.mesh):
            state = self.ft.state.init(jax.random.key(0))
            for width in range(self.length_bucket or seq, seq + 1, self.length_bucket or seq):
                micro = {
                    k: v[:rows, :width] if v.ndim == 2 else v[:rows] for k, v in features.items()
                }
                micro["weights"] = np.ones(rows, np.float32)
                batch = [micro] * self.micro_batches if self.micro_batches > 1 else micro
                state, metrics = self.ft.steps.take_step(state, batch, self.rng)
            jax.block_until_ready(metrics)
            step = loop.eval_length_bucket(32)  # predict() runs run_eval's default bucket
            for width in range(step, seq + 1, step):  # run_eval's widths and rows per call
                rows = perf.rows_per_call(width, self.batch_size)
                batch = {
                    k: v[:rows, :width] if v.ndim == 2 else v[:rows] for k, v in features.items()
                }
                batch["weights"] = np.ones(rows, np.float32)
                global_batch = steps.global_batch(batch, self.ft.batch_sharding, 1)
                jax.block_until_ready(self.ft.eval_step(state.params, global_batch))

    def run_epoch(self) -> float:
        order = loop.epoch_order(0, self.epoch, len(self.windows))
        metrics = None
        with jax.set_mesh(self.ft.mesh):
            for index in range(len(self.windows) // self.batch_size):
                if self.micro_batches > 1:
                    local = loop.train_micro_batches(
                        self.windows,
                        order,
                        index,
                        self.batch_size,
                        self.micro_batches,
                        self.length_bucket,
                    )
                else:
                    local = loop.train_batch(
                        self.windows, order, index, self.batch_size, self.length_bucket
                    )
                self.state, metrics = self.ft.steps.take_step(self.state, local, self.rng)
        self.epoch += 1
        return float(metrics["train/loss"])  # waits for the device

    def predict(self) -> np.ndarray:
        """The loop's evaluation: windows grouped by length, cut to buckets of 32."""
        with jax.set_mesh(self.ft.mesh):
            _, outputs = loop.run_eval(self.ft, self.state.params, self.windows, self.batch_size)
        return outputs["start_logits"]


class Transformers:
    """transformers' BertForQuestionAnswering with torch's AdamW and linear schedule."""

    # padded: every batch at max_seq_length; dynamic: each batch padded to its longest, in
    # the epoch's order; grouped: each batch sorted by length and run as micro_batches slices,
    # each padded to its longest, gradients summed (the same update as one batch).
    MODES = ("padded", "dynamic", "grouped")

    def __init__(self, args, windows, optimizer: optim.OptimizerSettings, mode: str):
        torch.manual_seed(args.seed)
        torch.set_num_threads(os.cpu_count() or 1)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if args.init_from:
            model = transformers.BertForQuestionAnswering.from_pretrained(args.init_from)
        else:
            config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
            hf_config = transformers.BertConfig(
                vocab_size=config.vocab_size,
                hidden_size=config.hidden_size,
                num_hidden_layers=config.num_layers,
                num_attention_heads=config.num_heads,
                intermediate_size=config.intermediate_size,
                max_position_embeddings=max(512, args.max_seq_length),
            )
            model = transformers.BertForQuestionAnswering(hf_config)
        self.model = model.to(self.device)
        self.mode, self.micro_batches = mode, args.micro_batches
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
        self.windows, self.batch_size = windows, args.batch_size
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

    def _slices(self, rows: np.ndarray) -> list[np.ndarray]:
        if self.mode != "grouped":
            return [rows]
        lengths = self.windows.features["input_mask"][rows].sum(axis=1)
        return np.array_split(rows[np.argsort(lengths, kind="stable")], self.micro_batches)

    def run_epoch(self) -> float:
        self.model.train()
        order = loop.epoch_order(0, self.epoch, len(self.windows))
        loss = None
        for index in range(len(self.windows) // self.batch_size):
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            self.optimizer.zero_grad(set_to_none=True)
            for part in self._slices(rows):
                batch = self._batch(part, self.mode != "padded")
                for name in ("start_positions", "end_positions"):
                    positions = self.windows.features[name][part].astype(np.int64)
                    batch[name] = torch.from_numpy(positions).to(self.device)
                with torch.autocast(
                    self.device.type, dtype=self.autocast, enabled=bool(self.autocast)
                ):
                    # The slice's mean loss, weighted to its share of the batch.
                    loss = self.model(**batch).loss * (len(part) / len(rows))
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.schedule.step()
        self.epoch += 1
        return float(loss.detach())

    def predict(self) -> np.ndarray:
        """No-grad forward passes; grouped: the windows sorted by length first."""
        self.model.eval()
        out = []
        order = np.arange(len(self.windows))
        if self.mode == "grouped":
            lengths = self.windows.features["input_mask"].sum(axis=1)
            order = np.argsort(lengths, kind="stable")
        with torch.no_grad():
            for first in range(0, len(self.windows), self.batch_size):
                rows = order[first : first + self.batch_size]
                with torch.autocast(
                    self.device.type, dtype=self.autocast, enabled=bool(self.autocast)
                ):
                    logits = self.model(**self._batch(rows, self.mode != "padded")).start_logits
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
    source = loop.open_source(args.init_from) if args.init_from else None
    if args.squad:
        windows = real_windows(args, source.tokenizer)
        print(f"windows: {len(windows)} from {args.squad}")
    else:
        windows = synthetic_windows(args)
    lengths = windows.features["input_mask"].sum(axis=1)
    print(
        "window lengths: "
        + ", ".join(f"p{q} {np.percentile(lengths, q):.0f}" for q in (10, 50, 90, 99))
        + f", max {lengths.max()}"
    )
    steps_per_epoch = len(windows) // args.batch_size
    capacity = loop.fitting_capacity(windows, (0,), args.rounds + 1, args.batch_size, 1, 1)
    total = steps_per_epoch * (args.rounds + 1)
    optimizer = optim.OptimizerSettings(
        learning_rate=3e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    config = model_config(args, source)
    name = args.init_from or args.preset
    fill = float(windows.features["input_mask"].mean())
    print(
        f"model: {name} (L{config.num_layers}/H{config.hidden_size}/A{config.num_heads}, "
        f"V{config.vocab_size}) + qa_outputs, {args.dtype} compute; {len(windows)} windows, "
        f"batch {args.batch_size} x {args.max_seq_length}, {100 * fill:.1f} % of positions "
        f"real, token_capacity {capacity:.3f} when packing, {args.micro_batches} micro-batches "
        "when grouped by length"
    )
    grouped = f"bertjax grouped x{args.micro_batches}"
    train = {}
    if not args.grouped_only:
        train["bertjax padded"] = Bertjax(args, windows, optimizer, 1.0, 0, source=source)
        train["bertjax bucketed+packed"] = Bertjax(
            args, windows, optimizer, capacity, 32, source=source
        )
    train[grouped] = Bertjax(args, windows, optimizer, 1.0, 32, args.micro_batches, source)
    predict = {"bertjax predict": train[grouped]}
    modes = ("grouped",) if args.grouped_only else Transformers.MODES
    if not args.no_reference and torch is not None:
        for mode in modes:
            train[f"transformers {mode}"] = Transformers(args, windows, optimizer, mode)
            predict[f"transformers predict {mode}"] = train[f"transformers {mode}"]
    elif not args.no_reference:
        print("transformers reference skipped: torch/transformers are not installed")
    for name, side in train.items():
        if isinstance(side, Bertjax):
            print(f"{name}: compiling every width {_timed(side.compile_widths):.1f} s")
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
    if "transformers grouped" in train:
        print()
        ours = [name for name in train if name.startswith("bertjax")]
        _ratios(train_rates, ours, [f"transformers {mode}" for mode in modes])
        _ratios(
            predict_rates, ["bertjax predict"], [f"transformers predict {mode}" for mode in modes]
        )
    result = {f"train {k}": statistics.median(v) for k, v in train_rates.items()}
    result.update({f"predict {k}": statistics.median(v) for k, v in predict_rates.items()})
    return result


if __name__ == "__main__":
    main()
