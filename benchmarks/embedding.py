"""Embedding throughput: Model.embed of an embedding model beside sentence-transformers' encode,
and contrastive training steps beside sentence-transformers' fit.

    python -m benchmarks.embedding [--sentences 4000] [--batch_size 32] [--layers 4]
        [--train_steps 30] [--rounds 3]

One model of random weights (H256, A4, `--layers` layers, mean pooling, normalised), written
as a sentence-transformers directory by bertjax.tasks.embed.hf.save and read by
`SentenceTransformer(path)`: the same weights, tokenizer and settings on both sides. The
texts are random words of a WordPiece vocabulary, 2 to 100 words long (cut at
max_seq_length 128). Both sides batch `--batch_size` texts sorted by length. The outputs are
checked to agree within 1e-4; times are medians of `--rounds` rounds of both sides in turn
after a warm-up call each (benchmarks.harness.timing; bertjax's first call, which compiles
each length bucket, is printed separately).

Training: (anchor, positive) pairs cut from the same random texts, in-batch negatives with
scale 20 (sentence-transformers' MultipleNegativesRankingLoss), AdamW, `--batch_size` pairs
a step, from the same weights. bertjax: the jitted train step of
bertjax.tasks.embed.objective.build_embedding_training, batches padded to 64 positions, timed
over `--train_steps` steps after a compiling one. sentence-transformers: `fit` (which needs
the `datasets` package, not among this project's dependencies: install it to time training)
run for 2 and for 2 + `--train_steps` steps; the difference of the two wall times is the
steps' time, so its set-up cost is left out as ours is.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import pathlib
import tempfile
from typing import Any

import jax
import numpy as np

from benchmarks.harness import fixtures, report, timing
from bertjax import Model
from bertjax.capability import ENCODER
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine import optim
from bertjax.tasks.embed import hf as sbert
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed import objective as training
from bertjax.tasks.embed.model import EmbeddingSpec
from bertjax.tasks.embed.task import head_for

TOLERANCE = 1e-4
VOCAB = 2000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per side")
    parser.add_argument("--train_steps", type=int, default=30, help="0: no training")
    report.add_json_flag(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report.use_cpu()
    from sentence_transformers import SentenceTransformer

    machine = report.start("embedding", argv)

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        num_layers=args.layers,
        num_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    spec = EmbeddingSpec("mean", normalize=True, max_seq_length=128)
    rng = np.random.default_rng(0)
    texts = [
        " ".join(f"w{k}" for k in rng.integers(0, VOCAB - 5, rng.integers(2, 101)))
        for _ in range(args.sentences)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = fixtures.word_vocabulary(pathlib.Path(tmp) / "vocab.txt", VOCAB)
        params = {ENCODER: fixtures.random_params(config, seed=1)[ENCODER]}
        sbert.save(pathlib.Path(tmp) / "model", config, params, tokenizer, spec)
        reference = SentenceTransformer(str(pathlib.Path(tmp) / "model"), device="cpu")

    model = Model(config, params, tokenizer, head=head_for(spec), batch_size=args.batch_size)

    def ours():
        return model.embed(texts)

    def theirs():
        return reference.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)

    difference = float(np.max(np.abs(ours() - theirs())))
    print(
        f"{args.sentences} texts, L{args.layers}/H256, batch {args.batch_size}, "
        f"{jax.devices()[0].platform}; largest difference {difference:.2e}"
    )
    if difference > TOLERANCE:
        raise SystemExit(f"outputs differ by {difference:.2e} > {TOLERANCE}")
    # The comparison's calls above were both sides' warm-up (bertjax's compiled its buckets).
    found = timing.time_rounds({"bertjax": ours, "theirs": theirs}, rounds=args.rounds, warmup=0)
    ratio = timing.ratio(found["theirs"], found["bertjax"])
    print(f"bertjax Model.embed: {found['bertjax'].rate(args.sentences):,.0f} sentences/s")
    print(f"sentence-transformers encode: {found['theirs'].rate(args.sentences):,.0f} sentences/s")
    print(f"ratio bertjax / sentence-transformers: {ratio:.2f}")
    figures: dict[str, Any] = {
        "embed sentences/s": found["bertjax"].rate(args.sentences),
        "encode sentences/s": found["theirs"].rate(args.sentences),
        "embed ratio": ratio,
        "max difference": difference,
    }
    if args.train_steps > 0 and importlib.util.find_spec("datasets") is None:
        print("training skipped: sentence-transformers' fit needs `datasets` (pip install it)")
    elif args.train_steps > 0:
        figures |= train_benchmark(args, config, spec, params, tokenizer, texts)
    report.finish("embedding", args, figures, machine)
    return figures


TRAIN_LENGTH = 64


def train_benchmark(args, config, spec, params, tokenizer, texts) -> dict[str, float]:
    """Training examples/s of both libraries on the same pairs (see the module docstring)."""
    from sentence_transformers import InputExample, SentenceTransformer, losses
    from torch.utils.data import DataLoader

    rows = args.batch_size
    steps_count = args.train_steps + 1
    words = [t.split() for t in texts[: rows * (steps_count + 2)]]
    # A pair: the text's first half and its second half (texts of 2+ words).
    pairs = [(" ".join(w[: len(w) // 2 + 1]), " ".join(w[len(w) // 2 :])) for w in words]
    spec = dataclasses.replace(spec, max_seq_length=TRAIN_LENGTH)
    optimizer = optim.OptimizerSettings(
        learning_rate=2e-5, warmup_steps=0, total_steps=steps_count, weight_decay=0.01
    )
    run = training.build_embedding_training(
        config, spec, training.LossSettings(), optimizer, mesh_shape=(-1, 1, 1)
    )
    batches = []
    for step in range(steps_count):
        part = pairs[step * rows : (step + 1) * rows]
        sides = [
            embedding.pad_inputs(embedding.token_ids(tokenizer, side, TRAIN_LENGTH), TRAIN_LENGTH)
            for side in zip(*part)
        ]
        batch = {n: np.stack([sides[0][n], sides[1][n]], axis=1) for n in sides[0]}  # [b, 2, s]
        batch["weights"] = np.ones(rows, np.float32)
        batches.append(batch)
    with jax.set_mesh(run.mesh):
        state = run.state.init(jax.random.key(0))
        state = state.replace(params={ENCODER: jax.device_put(params[ENCODER])})
        steps = iter(batches)

        def take(count: int):
            nonlocal state
            metrics = None
            for batch in (next(steps) for _ in range(count)):
                state, metrics = run.train_step(state, batch, jax.random.key(1))
            return metrics

        # One call of the first step (it compiles), then one of the rest: each batch once.
        warm = timing.time_call(lambda: take(1), rounds=1, warmup=0).median
        ours = timing.time_call(lambda: take(args.train_steps), rounds=1, warmup=0).median
        ours /= args.train_steps

    with tempfile.TemporaryDirectory() as tmp:
        sbert.save(pathlib.Path(tmp) / "model", config, params, tokenizer, spec)

        def fit(steps: int) -> float:
            model = SentenceTransformer(str(pathlib.Path(tmp) / "model"), device="cpu")
            examples = [InputExample(texts=list(p)) for p in pairs[: steps * rows]]
            loader = DataLoader(examples, batch_size=rows, shuffle=False)
            loss = losses.MultipleNegativesRankingLoss(model, scale=20.0)
            return timing.time_call(
                lambda: model.fit(
                    train_objectives=[(loader, loss)],
                    epochs=1,
                    warmup_steps=0,
                    optimizer_params={"lr": 2e-5},
                    show_progress_bar=False,
                ),
                rounds=1,
                warmup=0,
            ).median

        theirs = (fit(2 + args.train_steps) - fit(2)) / args.train_steps
    print(
        f"training, {rows} pairs a step, {TRAIN_LENGTH} positions: bertjax "
        f"{rows / ours:,.0f} examples/s (first step, compiling: {warm:.1f} s); "
        f"sentence-transformers fit {rows / theirs:,.0f} examples/s; "
        f"ratio bertjax / sentence-transformers: {theirs / ours:.2f}"
    )
    return {
        "train examples/s": rows / ours,
        "fit examples/s": rows / theirs,
        "train ratio": theirs / ours,
    }


if __name__ == "__main__":
    main()
