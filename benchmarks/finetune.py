"""Fine-tuning throughput: bertjax's epoch and prediction against transformers'
BertForSequenceClassification.

    python benchmarks/finetune.py                        # BERT-small (L4/H512/A8), B32, S128
    python benchmarks/finetune.py --examples 4096 --preset base --dtype bfloat16  # accelerators
    python benchmarks/finetune.py --tsv MRPC/dev.tsv --init_from MODEL_DIR --examples 408
    python benchmarks/finetune.py --tsv RTE/dev.tsv --init_from MODEL_DIR \
        --text_columns sentence1,sentence2 --label_column label

Times whole epochs of sentence-pair classification (google's recipe: AdamW with BERT's decay
mask, warmup then linear decay, clipping at 1.0, dropout 0.1, max_seq_length 128) on the same
examples on both sides. By default they are synthetic: random token ids, [CLS] A [SEP] B [SEP]
with each text's length drawn uniformly from --text_lengths (the default, 8 to 40 pieces, is
about MRPC's and RTE's), two labels, and the model is a --preset with random weights.
--init_from DIR (a Hugging Face BERT directory, e.g. a MiniLM) gives both sides its
architecture, weights and vocabulary (the classifier starts fresh); --tsv FILE (needs
--init_from for the vocabulary) trains on a GLUE-style TSV file with a header instead: the
file's first --examples rows, --text_columns (one text or a pair) and --label_column, read
with quoting off (MRPC's quotes are text) and encoded as finetune.py encodes them
(bertjax.tasks.labels.data: [CLS] A [SEP] B [SEP], pairs cut longest-first), labels in the order
finetune.py gives them. The examples' real lengths are printed (percentiles).

bertjax runs the epoch as finetune.py does (host batches from the epoch's permutation,
assembled into global arrays, the jitted and donated train step) four ways: padded to
max_seq_length; cut to length buckets (config.length_bucket, finetune.py's default: each
batch to the smallest multiple of 32 positions that holds its longest example); bucketed with
token packing as well, finetune.py's default (config.token_capacity 0: packed slots just
enough for the fullest batch of the run); and grouped: each batch run as --micro_batches
micro-batches grouped by length (config.group_by_length: the batch sorted by length, cut into
equal micro-batches, each to its own length bucket, gradients summed into one update). On
every bertjax side the classifier's last encoder layer runs at [CLS] alone, as in finetune.py
(the pooled output reads nothing else).
transformers runs with torch's AdamW and get_linear_schedule_with_warmup three ways: on the
same padded batches (as its run_glue.py does by default, --pad_to_max_length True); padded to
each batch's longest example (DataCollatorWithPadding, --pad_to_max_length False); and grouped:
each batch sorted by length, split into --micro_batches slices, each padded to its longest,
each slice's loss weighted by its share of the batch and back-propagated, one optimizer step.

Prediction (the examples' class probabilities): bertjax as the fine-tuning loop evaluates
(finetune.evaluation.run_eval: batches grouped by length, cut to buckets of 32), transformers in
torch.no_grad padded to max_seq_length, padded to each batch's longest in input order
(dynamic), and the same after sorting the examples by length (grouped).

Compilation and torch's first steps are excluded: each side runs one untimed epoch and one
untimed prediction pass first. Shared machines are noisy: the epochs and prediction passes
run in rounds (every side once per round), ratios are taken within each round and their
median is printed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
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

from bertjax.capability import HeadSpec  # noqa: E402
from bertjax.encoders.bert.config import PRESETS, BertConfig  # noqa: E402
from bertjax.engine import optim  # noqa: E402
from bertjax.finetune import batches as batches_lib  # noqa: E402
from bertjax.finetune import data as task_data  # noqa: E402
from bertjax.finetune import evaluation, warm_start  # noqa: E402
from bertjax.finetune import widths as widths_lib  # noqa: E402
from bertjax.finetune.objective import build_finetuning  # noqa: E402
from bertjax.finetune.task import Examples  # noqa: E402
from bertjax.tasks.labels import data as label_data  # noqa: E402
from bertjax.tasks.labels import model as label_heads  # noqa: E402

try:  # the reference is optional: torch and transformers live in the `hf` extra
    import torch
    import transformers
except ImportError:  # pragma: no cover - depends on the environment
    torch = None
    transformers = None

FIRST_REAL_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK]
CLS_ID, SEP_ID = 2, 3
SYNTHETIC_HEAD = HeadSpec(label_heads.CLASSIFICATION, ("0", "1"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument(
        "--examples", type=int, default=128, help="training examples per epoch (--tsv: at most)"
    )
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
    parser.add_argument(
        "--tsv",
        default="",
        help="a GLUE-style TSV file with a header: train on its first --examples rows instead "
        "of synthetic pairs; needs --init_from for the vocabulary",
    )
    parser.add_argument(
        "--text_columns",
        default="#1 String,#2 String",
        help="--tsv: the text column(s), comma-separated: one text or a pair (default MRPC's)",
    )
    parser.add_argument(
        "--label_column", default="Quality", help="--tsv: the label column (default MRPC's)"
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
    args = parser.parse_args(argv)
    if args.tsv and not args.init_from:
        parser.error("--tsv needs --init_from (the vocabulary that encodes the texts)")
    for name in ("examples", "batch_size", "max_seq_length", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    if args.micro_batches < 1 or args.batch_size % args.micro_batches:
        parser.error(f"--micro_batches={args.micro_batches} must divide --batch_size")
    if args.length_bucket < 0:
        parser.error(f"--length_bucket={args.length_bucket} is invalid: must be >= 0")
    if args.examples < args.batch_size:
        parser.error(f"--examples={args.examples} must be at least --batch_size={args.batch_size}")
    args.text_columns = tuple(name.strip() for name in args.text_columns.split(","))
    if len(args.text_columns) not in (1, 2) or not all(args.text_columns):
        parser.error(
            f"--text_columns={','.join(args.text_columns)!r} is invalid: give one column or two"
        )
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


def synthetic_examples(args: argparse.Namespace) -> Examples:
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
    return Examples("train", "synthetic", features, [str(i) for i in range(n)], True)


def real_examples(args: argparse.Namespace, tokenizer) -> tuple[Examples, HeadSpec]:
    """The TSV file's first --examples rows, encoded as finetune.py encodes a split, and the
    head of the labels in the whole file (finetune.py's order: numbers numerically)."""
    with open(args.tsv, encoding="utf-8", newline="") as f:
        # GLUE's TSV files do not quote: a quote character is text (MRPC's are unbalanced).
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise SystemExit(f"{args.tsv} is empty")
    header = [name.strip() for name in rows[0]]
    columns = [*args.text_columns, args.label_column]
    missing = [name for name in columns if name not in header]
    if missing:
        raise SystemExit(f"{args.tsv}: no column(s) {missing}; the header has {header}")
    at = [header.index(name) for name in columns]
    records = []
    for line, row in enumerate(rows[1:], start=2):  # QUOTE_NONE: one row per line
        if not any(field.strip() for field in row):
            continue
        if len(row) <= max(at):
            raise SystemExit(f"{args.tsv} line {line}: {len(row)} field(s), too few")
        texts = tuple(row[k] for k in at[:-1])
        records.append(task_data.Record(line, str(len(records)), texts, row[at[-1]].strip()))
    whole = task_data.Split("train", args.tsv, records, True)
    head = label_data.head_for(label_heads.CLASSIFICATION, whole)
    split = dataclasses.replace(whole, records=records[: args.examples])
    return label_data.encode(split, head, tokenizer, args.max_seq_length), head


def model_config(args: argparse.Namespace, source) -> BertConfig:
    if source is not None:
        return dataclasses.replace(source.config, dtype=args.dtype)
    return BertConfig.preset(args.preset, vocab_size=args.vocab_size, dtype=args.dtype)


class Bertjax:
    """An epoch as finetune.py runs it: host batches, global arrays, the jitted step; and the
    loop's evaluation.

    `micro_batches` > 1: each batch as length-grouped micro-batches (group_by_length);
    otherwise one batch cut to `length_bucket`, token-packed to `token_capacity`.
    """

    def __init__(
        self,
        args,
        examples,
        head: HeadSpec,
        optimizer,
        token_capacity: float,
        length_bucket: int,
        micro_batches: int = 1,
        source=None,
    ):
        self.examples, self.batch_size = examples, args.batch_size
        self.length_bucket, self.micro_batches = length_bucket, micro_batches
        self.ft = build_finetuning(
            model_config(args, source),
            head,
            optimizer,
            mesh_shape=(-1, 1, 1),
            grad_accum_steps=micro_batches,
            micro_batch_size=args.batch_size // micro_batches,
            max_seq_length=args.max_seq_length,
            token_capacity=token_capacity,
        )
        with jax.set_mesh(self.ft.mesh):
            self.state = self.ft.state.init(jax.random.key(args.seed))
            if source is not None:  # the encoder's real weights, a fresh classifier
                params, _, _ = warm_start.initial_params(source, self.ft, self.state.params)
                self.state = self.state.replace(params=params)
        self.rng = jax.random.key(args.seed + 1)
        self.epoch = 0
        self.packed = 0.0

    def run_epoch(self) -> float:
        """Trains one epoch; its loss (the last step's)."""
        order = batches_lib.epoch_order(0, self.epoch, len(self.examples))
        metrics = None
        with jax.set_mesh(self.ft.mesh):
            for index in range(len(self.examples) // self.batch_size):
                if self.micro_batches > 1:
                    local = batches_lib.train_micro_batches(
                        self.examples,
                        order,
                        index,
                        self.batch_size,
                        self.micro_batches,
                        self.length_bucket,
                    )
                else:
                    local = batches_lib.train_batch(
                        self.examples, order, index, self.batch_size, self.length_bucket
                    )
                self.state, metrics = self.ft.steps.take_step(self.state, local, self.rng)
        self.epoch += 1
        self.packed = float(metrics.get("train/packed", 0.0))
        return float(metrics["train/loss"])  # waits for the device

    def predict(self) -> np.ndarray:
        """The loop's evaluation: examples grouped by length, cut to buckets of 32."""
        with jax.set_mesh(self.ft.mesh):
            _, outputs = evaluation.run_eval(
                self.ft, self.state.params, self.examples, self.batch_size
            )
        return outputs["probabilities"]


class Transformers:
    """transformers' BertForSequenceClassification with torch's AdamW and linear schedule."""

    # padded: every batch at max_seq_length; dynamic: each batch padded to its longest, in
    # the epoch's order; grouped: each batch sorted by length and run as micro_batches slices,
    # each padded to its longest, gradients summed (the same update as one batch).
    MODES = ("padded", "dynamic", "grouped")

    def __init__(
        self, args, examples, num_labels: int, optimizer: optim.OptimizerSettings, mode: str
    ):
        torch.manual_seed(args.seed)
        torch.set_num_threads(os.cpu_count() or 1)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if args.init_from:
            model = transformers.BertForSequenceClassification.from_pretrained(
                args.init_from, num_labels=num_labels
            )
        else:
            config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
            hf_config = transformers.BertConfig(
                vocab_size=config.vocab_size,
                hidden_size=config.hidden_size,
                num_hidden_layers=config.num_layers,
                num_attention_heads=config.num_heads,
                intermediate_size=config.intermediate_size,
                num_labels=num_labels,
            )
            model = transformers.BertForSequenceClassification(hf_config)
        self.model = model.to(self.device)
        self.mode, self.micro_batches = mode, args.micro_batches
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
        self.examples, self.batch_size = examples, args.batch_size
        self.epoch = 0

    def _batch(self, rows: np.ndarray, dynamic: bool) -> dict:
        features = self.examples.features
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
        lengths = self.examples.features["input_mask"][rows].sum(axis=1)
        return np.array_split(rows[np.argsort(lengths, kind="stable")], self.micro_batches)

    def run_epoch(self) -> float:
        self.model.train()
        order = batches_lib.epoch_order(0, self.epoch, len(self.examples))
        loss = None
        for index in range(len(self.examples) // self.batch_size):
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            self.optimizer.zero_grad(set_to_none=True)
            for part in self._slices(rows):
                batch = self._batch(part, self.mode != "padded")
                labels = self.examples.features["labels"][part].astype(np.int64)
                batch["labels"] = torch.from_numpy(labels).to(self.device)
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
        return float(loss.detach())  # synchronises a GPU

    def predict(self) -> list[np.ndarray]:
        """No-grad forward passes; grouped: the examples sorted by length first."""
        self.model.eval()
        out = []
        order = np.arange(len(self.examples))
        if self.mode == "grouped":
            lengths = self.examples.features["input_mask"].sum(axis=1)
            order = np.argsort(lengths, kind="stable")
        with torch.no_grad():
            for first in range(0, len(self.examples), self.batch_size):
                rows = order[first : first + self.batch_size]
                with torch.autocast(
                    self.device.type, dtype=self.autocast, enabled=bool(self.autocast)
                ):
                    logits = self.model(**self._batch(rows, self.mode != "padded")).logits
                out.append(logits.float().softmax(dim=-1).cpu().numpy())
        return out


def _no_decay(name: str) -> bool:
    return "bias" in name or "LayerNorm" in name


def versions() -> str:
    parts = [f"python {platform.python_version()}", f"jax {jax.__version__}"]
    parts += [f"flax {flax.__version__}", f"optax {optax.__version__}"]
    if torch is not None:
        parts += [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    return ", ".join(parts)


def _timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def _ratios(rates: dict[str, list[float]], ours: list[str], theirs: list[str]) -> None:
    for a in ours:
        for b in theirs:
            ratio = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
            print(f"{a} / {b}: {ratio:.2f}x")


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Runs the benchmark, prints the tables and ratios; examples/s per side (training under
    the side's name, prediction under "... predict ...")."""
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
    source = warm_start.open_source(args.init_from) if args.init_from else None
    if args.tsv:
        examples, head = real_examples(args, source.tokenizer)
        if len(examples) < args.batch_size:
            raise SystemExit(
                f"{args.tsv} holds {len(examples)} examples, fewer than --batch_size="
                f"{args.batch_size}"
            )
        counts = np.bincount(examples.features["labels"], minlength=len(head.labels))
        print(
            f"examples: {len(examples)} from {args.tsv} ({', '.join(args.text_columns)}; "
            + ", ".join(f"label {k!r} {n}" for k, n in zip(head.labels, counts))
            + f"), {examples.full_rows} cut to {args.max_seq_length}"
        )
    else:
        examples, head = synthetic_examples(args), SYNTHETIC_HEAD
    lengths = examples.features["input_mask"].sum(axis=1)
    print(
        "pair lengths: "
        + ", ".join(f"p{q} {np.percentile(lengths, q):.0f}" for q in (10, 50, 90, 99))
        + f", max {lengths.max()}"
    )
    fill = float(examples.features["input_mask"].mean())
    steps_per_epoch = len(examples) // args.batch_size
    # As finetune.py chooses by default (token_capacity 0): the fullest batch of the run
    # (seed 0, every epoch timed or not) sets the packed slots.
    capacity = widths_lib.fitting_capacity(examples, (0,), args.rounds + 1, args.batch_size, 1, 1)
    total = steps_per_epoch * (args.rounds + 1)
    optimizer = optim.OptimizerSettings(
        learning_rate=2e-5, warmup_steps=int(0.1 * total), total_steps=total
    )
    config = model_config(args, source)
    print(
        f"model: {args.init_from or args.preset} (L{config.num_layers}/H{config.hidden_size}/"
        f"A{config.num_heads}, V{config.vocab_size}) + classifier ({len(head.labels)} labels), "
        f"{args.dtype} compute; {len(examples)} pairs per epoch, batch {args.batch_size} x "
        f"{args.max_seq_length}, {100 * fill:.1f} % of positions real, token_capacity "
        f"{capacity:.3f} when packing, {args.micro_batches} micro-batches when grouped by length"
    )

    bucket = args.length_bucket
    grouped = f"bertjax grouped x{args.micro_batches}"
    train = {
        "bertjax padded": Bertjax(args, examples, head, optimizer, 1.0, 0, source=source),
        "bertjax bucketed": Bertjax(args, examples, head, optimizer, 1.0, bucket, source=source),
        "bertjax bucketed+packed": Bertjax(
            args, examples, head, optimizer, capacity, bucket, source=source
        ),
        grouped: Bertjax(
            args, examples, head, optimizer, 1.0, bucket, args.micro_batches, source=source
        ),
    }
    ours = list(train)
    predict = {"bertjax predict": train[grouped]}
    if not args.no_reference and torch is not None:
        for mode in Transformers.MODES:
            side = Transformers(args, examples, len(head.labels), optimizer, mode)
            train[f"transformers {mode}"] = side
            predict[f"transformers predict {mode}"] = side
    elif not args.no_reference:
        print("transformers reference skipped: torch/transformers are not installed")
    for name, side in train.items():
        print(f"{name}: first epoch (compile / warm-up) {_timed(side.run_epoch)[0]:.1f} s")
    for name, side in predict.items():
        print(f"{name}: first pass (compile / warm-up) {_timed(side.predict)[0]:.1f} s")

    train_rates: dict[str, list[float]] = {name: [] for name in train}
    predict_rates: dict[str, list[float]] = {name: [] for name in predict}
    for round_index in range(args.rounds):
        for name, side in train.items():
            seconds, loss = _timed(side.run_epoch)
            if not np.isfinite(loss):
                raise FloatingPointError(f"{name}: non-finite loss {loss}")
            train_rates[name].append(steps_per_epoch * args.batch_size / seconds)
        for name, side in predict.items():
            predict_rates[name].append(len(examples) / _timed(side.predict)[0])
        for phase, rates in (("training", train_rates), ("prediction", predict_rates)):
            print(
                f"round {round_index + 1}/{args.rounds} {phase}: "
                + ", ".join(f"{name} {r[-1]:.2f}" for name, r in rates.items())
                + " examples/s",
                flush=True,
            )
    print()
    width = max(len(name) for name in (*train, *predict)) + 2
    print(f"{'training':<{width}}{'examples/s':>12}{'epoch (s)':>12}")
    for name, values in train_rates.items():
        median = statistics.median(values)
        print(f"{name:<{width}}{median:>12.2f}{steps_per_epoch * args.batch_size / median:>12.1f}")
    print(f"{'prediction':<{width}}{'examples/s':>12}{'pass (s)':>12}")
    for name, values in predict_rates.items():
        median = statistics.median(values)
        print(f"{name:<{width}}{median:>12.2f}{len(examples) / median:>12.1f}")
    packed = train["bertjax bucketed+packed"].packed
    print(f"bertjax bucketed+packed: {100 * packed:.0f} % of steps fit the packed slots")
    if len(train) > len(ours):
        print()
        _ratios(train_rates, ours, [f"transformers {mode}" for mode in Transformers.MODES])
        _ratios(
            predict_rates,
            ["bertjax predict"],
            [f"transformers predict {mode}" for mode in Transformers.MODES],
        )
    result = {name: statistics.median(values) for name, values in train_rates.items()}
    result.update({name: statistics.median(values) for name, values in predict_rates.items()})
    return result


if __name__ == "__main__":
    main()
