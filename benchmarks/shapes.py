"""Programs against padding: how many distinct shapes a fine-tuning run compiles, and what
share of the positions it computes are padding, for realistic length distributions.

    python -m benchmarks.shapes                     # SQuAD windows, reviews, GLUE pairs
    python -m benchmarks.shapes --overheads 0,0.05,0.1 --epochs 3

No model runs: the batches are the ones finetune.py would make (finetune.batches'
train_micro_batches, train_batch and eval_batches, on a CPU's rows per call), and each shape
they hold is one compiled program. The policies side by side:
- "every bucket": every batch cut to the smallest multiple of the length bucket that holds it
  (training: multiples of --length_bucket, evaluation: of a quarter of it);
- "finetune.py's default": the run's widths chosen from its lengths (finetune.widths
  .training_widths / evaluation_widths): +2 % positions over every bucket for training, a
  width added only while it saves more positions than a program costs
  (finetune.widths.TRAIN_PROGRAM_POSITIONS), and +5 % for evaluation;
- "fewest widths +X %": the fewest widths within X % more positions than every bucket,
  whatever a program costs (--overheads).

Lengths (tokens with [CLS] and [SEP]), drawn from quantiles of public data:
- squad: SQuAD v1.1-shaped windows at max_seq_length 384, doc stride 128 (questions about 6
  to 20 pieces, paragraphs lognormal around 135 pieces, p90 about 240), as run_squad cuts them;
- reviews: drug reviews at 512 (p10/p50/p90/max 32/106/170/461);
- glue: MNLI-like pairs at 128 (p10/p50/p90/max 20/38/62/128)
(benchmarks.harness.fixtures.LENGTH_QUANTILES for the last two).
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.harness import fixtures, report
from bertjax.finetune import batches as batches_lib
from bertjax.finetune import widths
from bertjax.finetune.task import Examples

# (max_seq_length, batch size, micro-batches) of each shape of lengths.
SHAPES = {
    "squad": (384, 32, 8),  # the README's CPU setting: grad_accum_steps=8
    "reviews": (512, 32, 4),
    "glue": (128, 32, 1),
}


def squad_lengths(count: int, rng: np.random.Generator, seq: int = 384) -> np.ndarray:
    """Window lengths as run_squad cuts paragraphs: each window holds [CLS] q [SEP] c [SEP]
    with c at most seq - q - 3 pieces, windows starting every 128 pieces of the paragraph."""
    out = []
    while len(out) < count:
        question = int(rng.integers(6, 21))
        paragraph = int(np.clip(rng.lognormal(np.log(135), 0.45), 20, 900))
        budget = seq - question - 3
        start = 0
        while True:
            piece = min(budget, paragraph - start)
            out.append(question + piece + 3)
            if start + piece >= paragraph:
                break
            start += 128
    return np.asarray(out[:count])


def examples(lengths: np.ndarray, seq: int) -> Examples:
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    features = {"input_ids": mask, "input_mask": mask, "segment_ids": np.zeros_like(mask)}
    return Examples("split", "synthetic", features, [""] * len(lengths), True)


def training(train: Examples, args, batch_size: int, micro: int, widths) -> tuple[int, float]:
    """(programs, padding share) of a run's training batches."""
    shapes, positions = set(), 0
    real = 0
    steps = len(train) // batch_size
    for seed in range(args.seeds):
        for epoch in range(args.epochs):
            order = batches_lib.epoch_order(seed, epoch, len(train))
            for index in range(steps):
                if micro > 1:
                    batches = batches_lib.train_micro_batches(
                        train, order, index, batch_size, micro, args.length_bucket, widths
                    )
                else:
                    batches = [
                        batches_lib.train_batch(
                            train, order, index, batch_size, args.length_bucket, widths
                        )
                    ]
                for batch in batches:
                    rows, width = batch["input_ids"].shape
                    shapes.add(width)  # the grouped step's micro-batch index is traced
                    positions += rows * width
                    real += int(batch["input_mask"].sum())
    return len(shapes), 1 - real / positions


def evaluation(split: Examples, args, widths) -> tuple[int, float]:
    """(programs, padding share) of evaluating a split on a CPU."""
    bucket = batches_lib.eval_length_bucket(args.length_bucket)
    shapes, positions, real = set(), 0, 0
    for _, batch in batches_lib.eval_batches(split, args.eval_batch_size, bucket, 1, "cpu", widths):
        shapes.add(batch["input_ids"].shape)
        positions += batch["input_ids"].size
        real += int((batch["input_mask"].sum(axis=1) * batch["weights"]).sum())
    return len(shapes), 1 - real / positions


def main(argv: list[str] | None = None) -> list[dict]:
    """Prints, per length shape and policy, programs and padding share; returns the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="squad,reviews,glue")
    parser.add_argument("--train", type=int, default=2000, help="training examples")
    parser.add_argument("--eval", type=int, default=1000, help="evaluation examples")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--length_bucket", type=int, default=32)
    parser.add_argument("--eval_batch_size", type=int, default=32)
    parser.add_argument("--overheads", default="0,0.02,0.05,0.1,0.2")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    machine = report.start("shapes", argv)
    overheads = [float(x) for x in args.overheads.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    header = f"{'shape':<9}{'policy':<24}{'train programs':>15}{'padding':>9}"
    print(header + f"{'eval programs':>15}{'padding':>9}")
    for name in args.shapes.split(","):
        seq, batch_size, micro = SHAPES[name]
        if name == "squad":
            draw = lambda n, seq=seq: squad_lengths(n, rng, seq)  # noqa: E731
        else:
            draw = lambda n, name=name: fixtures.quantile_lengths(name, n, rng)  # noqa: E731
        train, split = examples(draw(args.train), seq), examples(draw(args.eval), seq)
        lengths = train.features["input_mask"].sum(axis=1)
        print(
            f"{name}: max {seq}, batch {batch_size} as {micro} micro-batches, lengths "
            + "/".join(f"{np.percentile(lengths, q):.0f}" for q in (10, 50, 90))
            + f" (p10/p50/p90), max {lengths.max()}"
        )
        seeds = tuple(range(args.seeds))
        policies = [
            ("every bucket", None, None),
            (
                "finetune.py's default",
                widths.training_widths(
                    train, seeds, args.epochs, batch_size, micro, args.length_bucket
                ),
                widths.evaluation_widths([split], args.length_bucket),
            ),
        ]
        for overhead in overheads:
            policies.append(
                (
                    f"fewest widths +{100 * overhead:g} %",
                    widths.training_widths(
                        train,
                        tuple(range(args.seeds)),
                        args.epochs,
                        batch_size,
                        micro,
                        args.length_bucket,
                        overhead,
                        program_positions=0,  # the overhead alone, whatever programs cost
                    ),
                    widths.evaluation_widths([split], args.length_bucket, overhead),
                )
            )
        for policy, train_widths, eval_widths in policies:
            t_programs, t_padding = training(train, args, batch_size, micro, train_widths)
            e_programs, e_padding = evaluation(split, args, eval_widths)
            print(
                f"{'':<9}{policy:<24}{t_programs:>15}{100 * t_padding:>8.1f}%"
                f"{e_programs:>15}{100 * e_padding:>8.1f}%"
            )
            rows.append(
                {
                    "shape": name,
                    "policy": policy,
                    "train_programs": t_programs,
                    "train_padding": t_padding,
                    "eval_programs": e_programs,
                    "eval_padding": e_padding,
                }
            )
    report.finish("shapes", args, {"rows": rows}, machine)
    return rows


if __name__ == "__main__":
    main()
