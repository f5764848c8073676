"""Programs against padding: how many distinct shapes a fine-tuning run compiles, and what
share of the positions it computes are padding, for realistic length distributions.

    python benchmarks/shapes.py                     # SQuAD windows, reviews, GLUE pairs
    python benchmarks/shapes.py --overheads 0,0.05,0.1 --epochs 3

No model runs: the batches are the ones finetune.py would make (finetune.batches'
train_micro_batches, train_batch and eval_batches, on a CPU's rows per call), and each shape
they hold is one compiled program. Two policies side by side:
- "each bucket (before)": every batch cut to the smallest multiple of the length bucket that
  holds it (training: multiples of --length_bucket, evaluation: of a quarter of it), with the
  micro-batch's index static in the grouped step as before (one program per index and width);
- "fewest widths +X %": the run's widths chosen from its lengths (finetune.widths
  .training_widths / evaluation_widths) within X % more positions than each bucket, the
  micro-batch's index traced (one program per width); finetune.py's default takes +2 % for
  training, a width added only while it saves more positions than a program costs
  (finetune.widths.TRAIN_PROGRAM_POSITIONS), and +5 % for evaluation.

Lengths (tokens with [CLS] and [SEP]), drawn from quantiles of public data:
- squad: SQuAD v1.1-shaped windows at max_seq_length 384, doc stride 128 (questions about 6
  to 20 pieces, paragraphs lognormal around 135 pieces, p90 about 240), as run_squad cuts them;
- reviews: drug reviews at 512 (p10/p50/p90/max 32/106/170/461, the issue's measurement);
- glue: MNLI-like pairs at 128 (p10/p50/p90/max 20/38/62/128).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from bertjax.finetune import batches as batches_lib  # noqa: E402
from bertjax.finetune import widths as widths_lib  # noqa: E402
from bertjax.finetune.task import Examples  # noqa: E402

# (max_seq_length, batch size, micro-batches, quantile points (p, tokens)) of each shape.
QUANTILES = {
    "reviews": (512, 32, 4, [(0, 8), (0.1, 32), (0.5, 106), (0.9, 170), (0.99, 320), (1, 461)]),
    "glue": (128, 32, 1, [(0, 6), (0.1, 20), (0.5, 38), (0.9, 62), (0.99, 90), (1, 128)]),
}
SQUAD = (384, 32, 8)  # the README's CPU setting: grad_accum_steps=8


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


def quantile_lengths(points, count: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths whose quantile function goes through `points` (linear between them)."""
    p, tokens = zip(*points)
    return np.round(np.interp(rng.random(count), p, tokens)).astype(np.int64)


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
                for k, batch in enumerate(batches):
                    rows, width = batch["input_ids"].shape
                    # Before: the grouped step's micro-batch index was static.
                    shapes.add((k if widths is None and micro > 1 else 0, width))
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
    args = parser.parse_args(argv)
    overheads = [float(x) for x in args.overheads.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    header = f"{'shape':<9}{'policy':<24}{'train programs':>15}{'padding':>9}"
    print(header + f"{'eval programs':>15}{'padding':>9}")
    for name in args.shapes.split(","):
        if name == "squad":
            seq, batch_size, micro = SQUAD
            draw = lambda n, seq=seq: squad_lengths(n, rng, seq)  # noqa: E731
        else:
            seq, batch_size, micro, points = QUANTILES[name]
            draw = lambda n, points=points: quantile_lengths(points, n, rng)  # noqa: E731
        train, split = examples(draw(args.train), seq), examples(draw(args.eval), seq)
        lengths = train.features["input_mask"].sum(axis=1)
        print(
            f"{name}: max {seq}, batch {batch_size} as {micro} micro-batches, lengths "
            + "/".join(f"{np.percentile(lengths, q):.0f}" for q in (10, 50, 90))
            + f" (p10/p50/p90), max {lengths.max()}"
        )
        seeds = tuple(range(args.seeds))
        policies = [
            ("each bucket (before)", None, None),
            (
                "finetune.py's default",
                widths_lib.training_widths(
                    train, seeds, args.epochs, batch_size, micro, args.length_bucket
                ),
                widths_lib.evaluation_widths([split], args.length_bucket),
            ),
        ]
        for overhead in overheads:
            policies.append(
                (
                    f"fewest widths +{100 * overhead:g} %",
                    widths_lib.training_widths(
                        train,
                        tuple(range(args.seeds)),
                        args.epochs,
                        batch_size,
                        micro,
                        args.length_bucket,
                        overhead,
                        program_positions=0,  # the overhead alone, whatever programs cost
                    ),
                    widths_lib.evaluation_widths([split], args.length_bucket, overhead),
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
    return rows


if __name__ == "__main__":
    main()
