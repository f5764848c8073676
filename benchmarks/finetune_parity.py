"""Does fine-tuning learn as well as transformers? A regression task with a known noise level.

    python -m benchmarks.finetune_parity                       # random L2/H128 model, lr 5e-4
    python -m benchmarks.finetune_parity --init_from path/to/hf-bert --lr 2e-5  # real weights

Sentence pairs of random words from a word-level vocabulary; the target is 5 x the share of
"marker" words among the pair's words, plus Gaussian noise of --noise (so no model can reach a
dev MSE below noise**2, and a perfect model's Spearman is known from the data). Both sides
start from the same weights (a random BERT, benchmarks.harness.fixtures.random_bert_directory,
or --init_from) and
train with google's recipe (AdamW with BERT's decay mask, eps 1e-6, weight decay 0.01,
clipping at 1.0, 10% warmup then linear decay, dropout 0.1, batch 32, max_seq_length 128):
bertjax through finetune.py's own loop (length buckets, packing, the [CLS]-only last layer,
the best epoch by Spearman), transformers' BertForSequenceClassification(num_labels=1) through
the harness's torch loop with the same settings and the best epoch by Spearman. Each seed draws its
own head (as google initialises one, written into the start so both sides read the same) and
data order (bertjax's permutation of each epoch, used by the torch loop too); only the dropout
draws differ, so the first two columns should show the same distribution of outcomes. The
third column starts bertjax from the same head with its bias at the training targets' mean,
which is what finetune.py gives a fresh regression head (config.regression_bias_init).
"""  # noqa: E501

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
from typing import Any

import numpy as np

from benchmarks.harness import fixtures, reference, report
from bertjax.capability import ENCODER, HeadSpec
from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine.optim import OptimizerSettings
from bertjax.finetune import batches, loop
from bertjax.finetune.metrics import spearman
from bertjax.finetune.settings import FinetuneSettings
from bertjax.tasks.labels import model as label_heads
from bertjax.text.directory import load_tokenizer
from configs import finetune as finetune_config

BATCH_SIZE, MAX_SEQ_LENGTH, WARMUP_FRACTION = 32, 128, 0.1
REGRESSION_HEAD = HeadSpec(label_heads.REGRESSION, ("score",))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--init_from", default="", help="an HF BERT directory with vocab")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train", type=int, default=1000, help="training pairs")
    parser.add_argument("--dev", type=int, default=300, help="dev pairs")
    parser.add_argument("--noise", type=float, default=0.5, help="std of the target noise")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--work_dir", default="", help="default: a temporary directory")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    return args


def synthetic_pairs(words: list[str], n: int, noise: float, rng: np.random.Generator):
    """(a, b, score) rows: score = 5 x share of marker words (words[:20]) + noise."""
    markers, others = words[:20], words[20:]
    rows = []
    for _ in range(n):
        length = int(rng.integers(8, 30))
        share = rng.uniform()
        picked = np.where(
            rng.uniform(size=length) < share,
            rng.choice(markers, length),
            rng.choice(others, length),
        )
        score = 5.0 * float(np.isin(picked, markers).mean()) + rng.normal(0.0, noise)
        cut = length // 2
        rows.append((" ".join(picked[:cut]), " ".join(picked[cut:]), round(score, 4)))
    return rows


def write_csv(path: str, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence1", "sentence2", "label"])
        writer.writerows(rows)


def random_start(directory: str) -> None:
    """A random BERT (google's initialisation) and a word vocabulary, exported for both."""
    config = BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_layers=2,
        num_heads=2,
        intermediate_size=512,
        max_position_embeddings=MAX_SEQ_LENGTH,
    )
    fixtures.random_bert_directory(directory, config, seed=0)


def seeded_start(start: str, seed: int, directory: str, bias: float = 0.0) -> str:
    """`start` with a regression head drawn for `seed` as google initialises one (truncated
    normal at initializer_range, zero bias, or `bias`): both sides begin from the same head."""
    config, params, _ = bert_hf.load_with_report(start)
    rng = np.random.default_rng(seed)
    kernel = rng.normal(0.0, config.initializer_range, (config.hidden_size, 1))
    while np.any(np.abs(kernel) > 2 * config.initializer_range):  # truncate at 2 std
        redraw = np.abs(kernel) > 2 * config.initializer_range
        kernel[redraw] = rng.normal(0.0, config.initializer_range, int(redraw.sum()))
    params = {
        ENCODER: params[ENCODER],
        "classifier": {"kernel": kernel.astype(np.float32), "bias": np.full(1, bias, np.float32)},
    }
    os.makedirs(directory, exist_ok=True)
    bert_hf.save(config, params, directory, load_tokenizer(start), head=REGRESSION_HEAD)
    return directory


def run_bertjax(args, start: str, data: str, seed: int, bias: str) -> tuple[float, float]:
    config = finetune_config.get_config()
    config.init_from = start
    config.task = "regression"
    config.data.train = os.path.join(data, "train.csv")
    config.data.validation = os.path.join(data, "dev.csv")
    config.data.text_fields = "sentence1,sentence2"
    config.data.max_seq_length = MAX_SEQ_LENGTH
    config.optimizer.learning_rate = args.lr
    config.num_epochs = args.epochs
    config.batch_size = BATCH_SIZE
    config.seeds = (seed,)
    config.metric = "spearman"
    summary = loop.finetune(
        FinetuneSettings.from_config(config), os.path.join(data, f"bertjax_{bias}_{seed}")
    )
    scores = summary["seeds"][0]["best"]["scores"]
    return scores["eval/spearman"], scores["eval/mse"]


def run_transformers(args, start: str, train, dev, seed: int) -> tuple[float, float]:
    torch, transformers = reference.torch, reference.transformers
    torch.manual_seed(seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(start)
    model = transformers.BertForSequenceClassification.from_pretrained(
        start, attn_implementation="eager"
    )
    steps_per_epoch = len(train) // BATCH_SIZE
    total = steps_per_epoch * args.epochs
    settings = OptimizerSettings(
        learning_rate=args.lr,
        warmup_steps=round(WARMUP_FRACTION * total),
        total_steps=total,
        weight_decay=0.01,
        eps=1e-6,
    )
    optimizer = reference.adamw(model, settings)
    schedule = reference.linear_schedule(optimizer, settings)

    def inputs(rows):
        return tokenizer(
            [r[0] for r in rows],
            [r[1] for r in rows],
            padding=True,
            truncation=True,
            max_length=MAX_SEQ_LENGTH,
            return_tensors="pt",
        )

    gold = np.array([r[2] for r in dev])
    best = None

    def batch(order, step):
        rows = [train[i] for i in order[step * BATCH_SIZE : (step + 1) * BATCH_SIZE]]
        return {**inputs(rows), "labels": torch.tensor([r[2] for r in rows])}

    for epoch in range(args.epochs):
        order = batches.epoch_order(seed, epoch, len(train))  # bertjax's order of the epoch
        epoch_steps = (batch(order, step) for step in range(steps_per_epoch))
        reference.train(model, epoch_steps, optimizer, schedule=schedule, max_grad_norm=1.0)
        model.eval()
        with torch.no_grad():
            predictions = np.concatenate(
                [
                    model(**inputs(dev[i : i + 64])).logits[:, 0].numpy()
                    for i in range(0, len(dev), 64)
                ]
            )
        result = (spearman(predictions, gold), float(np.mean((predictions - gold) ** 2)))
        if best is None or result[0] > best[0]:
            best = result
    return best


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = report.start("finetune_parity", argv)
    work = args.work_dir or tempfile.mkdtemp(prefix="finetune_parity_")
    os.makedirs(work, exist_ok=True)
    start = args.init_from
    if not start:
        start = os.path.join(work, "start")
        os.makedirs(start, exist_ok=True)
        random_start(start)
    words = [w for w in load_tokenizer(start).hf_tokenizer().get_vocab() if w.isalnum()]
    words = sorted(words)[: max(200, len(words) // 10)]
    rng = np.random.default_rng(0)
    train = synthetic_pairs(words, args.train, args.noise, rng)
    dev = synthetic_pairs(words, args.dev, args.noise, rng)
    write_csv(os.path.join(work, "train.csv"), train)
    write_csv(os.path.join(work, "dev.csv"), dev)
    gold = np.array([r[2] for r in dev])
    print(
        f"dev: variance of the scores {np.var(gold):.3f}, noise floor of the MSE "
        f"{args.noise**2:.3f}; recipe lr {args.lr}, {args.epochs} epochs, batch {BATCH_SIZE}"
    )
    mean = float(np.mean([r[2] for r in train]))
    rows = []
    for seed in args.seeds:
        # A head read from init_from is kept as it is: the zero-bias start is google's and
        # transformers' fresh head; the mean-bias start is what finetune.py now gives a fresh
        # regression head (config.regression_bias_init="mean").
        zero = seeded_start(start, seed, os.path.join(work, f"start_{seed}"))
        at_mean = seeded_start(start, seed, os.path.join(work, f"start_mean_{seed}"), mean)
        rows.append(
            (
                seed,
                run_transformers(args, zero, train, dev, seed),
                run_bertjax(args, zero, work, seed, "zero"),
                run_bertjax(args, at_mean, work, seed, "mean"),
            )
        )
    columns = ("transformers (bias 0)", "bertjax (bias 0)", "bertjax (bias at the mean)")
    print("\n| seed | " + " | ".join(f"{c} Spearman / MSE" for c in columns) + " |")
    print("|---|---|---|---|")
    for seed, *results in rows:
        print(f"| {seed} | " + " | ".join(f"{r[0]:.4f} / {r[1]:.4f}" for r in results) + " |")
    medians = [
        (statistics.median(r[k][0] for r in rows), statistics.median(r[k][1] for r in rows))
        for k in (1, 2, 3)
    ]
    print("| median | " + " | ".join(f"{s:.4f} / {m:.4f}" for s, m in medians) + " |")
    figures = {
        column: {"spearman": spearman_, "mse": mse}
        for column, (spearman_, mse) in zip(columns, medians)
    }
    report.finish("finetune_parity", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
