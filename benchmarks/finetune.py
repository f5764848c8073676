"""Fine-tuning throughput: bertjax's epoch and prediction against transformers'
BertForSequenceClassification.

    python -m benchmarks.finetune                        # BERT-small (L4/H512/A8), B32, S128
    python -m benchmarks.finetune --examples 4096 --preset base --dtype bfloat16  # accelerators
    python -m benchmarks.finetune --tsv MRPC/dev.tsv --init_from MODEL_DIR --examples 408
    python -m benchmarks.finetune --tsv RTE/dev.tsv --init_from MODEL_DIR \
        --text_columns sentence1,sentence2 --label_column label

Times whole epochs of sentence-pair classification (google's recipe: AdamW with BERT's decay
mask, warmup then linear decay, clipping at 1.0, dropout 0.1, max_seq_length 128) on the same
examples on both sides. By default they are synthetic (benchmarks.harness.fixtures
.sentence_pairs: [CLS] A [SEP] B [SEP] of random ids, each text's length uniform in
--text_lengths, 8 to 40 pieces by default, about MRPC's and RTE's), two labels, and the model
is a --preset with random weights. --init_from DIR (a Hugging Face BERT directory, e.g. a
MiniLM) gives both sides its architecture, weights and vocabulary (the classifier starts
fresh); --tsv FILE (needs --init_from for the vocabulary) trains on a GLUE-style TSV file with
a header instead: the file's first --examples rows, --text_columns (one text or a pair) and
--label_column, read with quoting off (MRPC's quotes are text) and encoded as finetune.py
encodes them, labels in the order finetune.py gives them. The examples' real lengths are
printed (percentiles).

bertjax runs the epoch as finetune.py does (benchmarks.harness.finetuning) four ways: padded
to max_seq_length; cut to the run's widths (multiples of --length_bucket, finetune.py's
default); the same with token packing, finetune.py's default (config.token_capacity 0:
packed slots just enough for the fullest batch of the run); and grouped: each batch run as
--micro_batches micro-batches grouped by length (config.grad_accum_steps). transformers runs
in the harness's torch loop (benchmarks.harness.reference.TorchEpochs) three ways: padded to
max_seq_length (run_glue.py's default), padded to each batch's longest (dynamic), and grouped
(each batch sorted by length into --micro_batches slices, each padded to its longest).

Prediction (the examples' class probabilities): bertjax as the fine-tuning loop evaluates
(run_eval at the run's evaluation widths), transformers in torch.no_grad padded to
max_seq_length, padded to each batch's longest in input order (dynamic), and the same after
sorting the examples by length (grouped).

Timing (benchmarks.harness.timing): every side runs one untimed epoch and one untimed
prediction pass (compiling), then --rounds rounds of every side's epoch in turn, then of
every side's prediction; ratios are taken within each round and their median printed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from typing import Any

import numpy as np

from benchmarks.harness import finetuning, fixtures, report, timing
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import PRESETS, BertConfig
from bertjax.engine import optim
from bertjax.finetune import data as task_data
from bertjax.finetune import warm_start, widths
from bertjax.finetune.task import Examples
from bertjax.tasks.labels import data as label_data
from bertjax.tasks.labels import model as label_heads

try:  # the reference is optional: torch and transformers live in the `hf` extra
    from benchmarks.harness import reference
except ImportError:  # pragma: no cover - depends on the environment
    reference = None

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
        "--length_bucket", type=int, default=32, help="config.length_bucket of the cut sides"
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
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.tsv and not args.init_from:
        parser.error("--tsv needs --init_from (the vocabulary that encodes the texts)")
    for name in ("examples", "batch_size", "max_seq_length", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    if args.micro_batches < 1 or args.batch_size % args.micro_batches:
        parser.error(f"--micro_batches={args.micro_batches} must divide --batch_size")
    if args.length_bucket < 1:
        parser.error(f"--length_bucket={args.length_bucket} is invalid: must be >= 1")
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
    """Sentence pairs of random ids padded to max_seq_length, two random labels."""
    rng = np.random.default_rng(args.seed)
    features, _ = fixtures.sentence_pairs(
        rng,
        args.examples,
        args.max_seq_length,
        args.text_lengths,
        args.text_lengths,
        args.vocab_size,
    )
    features["labels"] = rng.integers(0, 2, args.examples).astype(np.int32)
    return Examples("train", "synthetic", features, [str(i) for i in range(args.examples)], True)


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


def torch_sides(args, examples, num_labels: int, optimizer) -> dict[str, Any]:
    """transformers' BertForSequenceClassification in the torch loop, each mode."""
    sides = {}
    for mode in reference.TorchEpochs.MODES:
        reference.torch.manual_seed(args.seed)
        if args.init_from:
            model = reference.transformers.BertForSequenceClassification.from_pretrained(
                args.init_from, num_labels=num_labels
            )
        else:
            config = BertConfig.preset(args.preset, vocab_size=args.vocab_size)
            model = reference.transformers.BertForSequenceClassification(
                reference.bert_config(config, num_labels=num_labels)
            )
        sides[f"transformers {mode}"] = reference.TorchEpochs(
            model,
            examples,
            optimizer,
            mode,
            batch_size=args.batch_size,
            micro_batches=args.micro_batches,
            targets=("labels",),
            autocast=reference.torch.bfloat16 if args.dtype == "bfloat16" else None,
        )
    return sides


def torch_probabilities(side) -> np.ndarray:
    """The side's class probabilities of every example, in order."""
    out = np.zeros((len(side.examples), side.model.config.num_labels), np.float32)
    for rows, output in side.forward():
        out[rows] = output.logits.float().softmax(dim=-1).cpu().numpy()
    return out


def print_rates(title: str, unit: str, rates: dict[str, timing.Timing], count: int) -> None:
    width = max(len(name) for name in rates) + 2
    print(f"{title:<{width}}{unit:>12}{'seconds':>12}")
    for name, found in rates.items():
        print(f"{name:<{width}}{found.rate(count):>12.2f}{found.median:>12.2f}")


def print_ratios(timings: dict[str, timing.Timing], ours: list[str], theirs: list[str]) -> dict:
    out = {}
    for a in ours:
        for b in theirs:
            out[f"{a} / {b}"] = timing.ratio(timings[b], timings[a])
            print(f"{a} / {b}: {out[f'{a} / {b}']:.2f}x")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark, prints the tables and ratios; returns the row's figures
    (examples/s per side: training under the side's name, prediction under "predict ...")."""
    args = parse_args(argv)
    machine = report.start("finetune", argv)
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
    epochs = args.rounds + 1  # the untimed first epoch and the rounds
    # As finetune.py chooses by default (token_capacity 0): the fullest batch of the run.
    capacity = widths.fitting_capacity(examples, (0,), epochs, args.batch_size, 1, 1)
    total = len(examples) // args.batch_size * epochs
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

    def ours(capacity: float, bucket: int, micro: int = 1) -> finetuning.Epochs:
        return finetuning.Epochs(
            config,
            head,
            examples,
            optimizer,
            batch_size=args.batch_size,
            epochs=epochs,
            seed=args.seed,
            token_capacity=capacity,
            length_bucket=bucket,
            micro_batches=micro,
            source=source,
        )

    bucket = args.length_bucket
    grouped = f"bertjax grouped x{args.micro_batches}"
    train: dict[str, Any] = {
        "bertjax padded": ours(1.0, 0),
        "bertjax cut": ours(1.0, bucket),
        "bertjax cut+packed": ours(capacity, bucket),
        grouped: ours(1.0, bucket, args.micro_batches),
    }
    print(f"widths of the cut sides: {train['bertjax cut'].widths()}")
    ours_names = list(train)
    predict: dict[str, Any] = {"predict bertjax": lambda: train[grouped].predict()}
    if not args.no_reference and reference is not None:
        reference.use_threads()
        for name, side in torch_sides(args, examples, len(head.labels), optimizer).items():
            train[name] = side
            predict[f"predict {name}"] = lambda side=side: torch_probabilities(side)
    elif not args.no_reference:
        print("transformers reference skipped: torch/transformers are not installed")

    def progress(phase: str):
        def line(index: int, seconds: dict[str, float]) -> None:
            print(
                f"round {index + 1}/{args.rounds} {phase}: "
                + ", ".join(f"{n} {s:.2f} s" for n, s in seconds.items()),
                flush=True,
            )

        return line

    steps_per_epoch = len(examples) // args.batch_size
    trained = timing.time_rounds(
        {name: side.run_epoch for name, side in train.items()},
        rounds=args.rounds,
        on_round=progress("training"),
    )
    predicted = timing.time_rounds(predict, rounds=args.rounds, on_round=progress("prediction"))
    for name, found in {**trained, **predicted}.items():
        print(f"{name}: first call (compile / warm-up) {found.first:.1f} s")
    print()
    print_rates("training", "examples/s", trained, steps_per_epoch * args.batch_size)
    print_rates("prediction", "examples/s", predicted, len(examples))
    packed = train["bertjax cut+packed"].packed
    print(f"bertjax cut+packed: the last step {'ran' if packed else 'did not run'} packed")
    figures: dict[str, Any] = {
        name: found.rate(steps_per_epoch * args.batch_size) for name, found in trained.items()
    }
    figures |= {name: found.rate(len(examples)) for name, found in predicted.items()}
    if len(train) > len(ours_names):
        print()
        modes = [f"transformers {mode}" for mode in reference.TorchEpochs.MODES]
        figures["training ratios"] = print_ratios(trained, ours_names, modes)
        figures["prediction ratios"] = print_ratios(
            predicted, ["predict bertjax"], [f"predict {m}" for m in modes]
        )
    report.finish("finetune", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
