"""Embedding throughput: Model.embed of an embedding model beside sentence-transformers' encode,
and contrastive training steps beside sentence-transformers' fit.

    python benchmarks/embedding.py [--sentences 4000] [--batch_size 32] [--layers 4]
        [--train_steps 30]

One model of random weights (H256, A4, `--layers` layers, mean pooling, normalised), written
as a sentence-transformers directory by bertjax.tasks.embed.hf.save and read by
`SentenceTransformer(path)`: the same weights, tokenizer and settings on both sides. The
texts are random words of a WordPiece vocabulary, 2 to 100 words long (cut at
max_seq_length 128). Both sides batch `--batch_size` texts sorted by length. The outputs are
checked to agree within 1e-4; times are the best of `--repeats` calls after a warm-up call
(bertjax's first call, which compiles each length bucket, is printed separately).

Training: (anchor, positive) pairs cut from the same random texts, in-batch negatives with
scale 20 (sentence-transformers' MultipleNegativesRankingLoss), AdamW, `--batch_size` pairs
a step, from the same weights. bertjax: the jitted train step of
bertjax.tasks.embed.objective.build_embedding_training, batches padded to 64 positions, timed
over `--train_steps` steps after a compiling one. sentence-transformers: `fit` (which needs
the `datasets` package) run for 2 and for 2 + `--train_steps` steps; the difference of the
two wall times is the steps' time, so its set-up cost is left out as ours is.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bertjax import Model  # noqa: E402
from bertjax.capability import ENCODER  # noqa: E402
from bertjax.encoders.bert.config import BertConfig  # noqa: E402
from bertjax.engine import optim  # noqa: E402
from bertjax.tasks.embed import hf as sbert
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed import objective as training
from bertjax.tasks.embed.model import EmbeddingSpec  # noqa: E402
from bertjax.tasks.embed.task import head_for  # noqa: E402
from bertjax.text.tokenizer import WordPieceTokenizer  # noqa: E402

TOLERANCE = 1e-4
VOCAB = 2000


def random_params(config: BertConfig, seed: int):
    """Every encoder parameter random (std 0.05, LayerNorm scales near 1)."""
    model = embedding.BiEncoder(config)
    abstract = jax.eval_shape(lambda: embedding.init_params(model, jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        noise = rng.normal(0, 0.05, leaf.shape).astype(np.float32)
        return 1.0 + noise if path[-1].key == "scale" else noise

    return jax.tree.map_with_path(fill, nn.meta.unbox(abstract))


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train_steps", type=int, default=30)
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

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
        vocab = pathlib.Path(tmp) / "vocab.txt"
        words = [f"w{i}" for i in range(VOCAB - 5)]
        vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
        tokenizer = WordPieceTokenizer.from_vocab(vocab)
        params = random_params(config, seed=1)
        sbert.save(pathlib.Path(tmp) / "model", config, params, tokenizer, spec)
        reference = SentenceTransformer(str(pathlib.Path(tmp) / "model"), device="cpu")

    model = Model(config, params, tokenizer, head=head_for(spec), batch_size=args.batch_size)

    def ours():
        return model.embed(texts)

    def theirs():
        return reference.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)

    start = time.perf_counter()
    ours_out = ours()
    first = time.perf_counter() - start
    theirs_out = theirs()
    difference = float(np.max(np.abs(ours_out - theirs_out)))
    ours_time = best_time(ours, args.repeats)
    theirs_time = best_time(theirs, args.repeats)
    print(
        f"{args.sentences} texts, L{args.layers}/H256, batch {args.batch_size}, "
        f"{jax.devices()[0].platform}; largest difference {difference:.2e}"
    )
    print(
        f"bertjax Model.embed: {args.sentences / ours_time:,.0f} sentences/s "
        f"(first call, compiling: {first:.1f} s)"
    )
    print(f"sentence-transformers encode: {args.sentences / theirs_time:,.0f} sentences/s")
    print(f"ratio bertjax / sentence-transformers: {theirs_time / ours_time:.2f}")
    if difference > TOLERANCE:
        raise SystemExit(f"outputs differ by {difference:.2e} > {TOLERANCE}")
    if args.train_steps > 0:
        train_benchmark(args, config, spec, params, tokenizer, texts)


TRAIN_LENGTH = 64


def train_benchmark(args, config, spec, params, tokenizer, texts) -> None:
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
        start = time.perf_counter()
        state, metrics = run.train_step(state, batches[0], jax.random.key(1))
        jax.block_until_ready(metrics)
        compile_time = time.perf_counter() - start
        start = time.perf_counter()
        for batch in batches[1:]:
            state, metrics = run.train_step(state, batch, jax.random.key(1))
        jax.block_until_ready(metrics)
        ours = (time.perf_counter() - start) / args.train_steps

    with tempfile.TemporaryDirectory() as tmp:
        sbert.save(pathlib.Path(tmp) / "model", config, params, tokenizer, spec)

        def fit(steps: int) -> float:
            model = SentenceTransformer(str(pathlib.Path(tmp) / "model"), device="cpu")
            examples = [InputExample(texts=list(p)) for p in pairs[: steps * rows]]
            loader = DataLoader(examples, batch_size=rows, shuffle=False)
            loss = losses.MultipleNegativesRankingLoss(model, scale=20.0)
            start = time.perf_counter()
            model.fit(
                train_objectives=[(loader, loss)],
                epochs=1,
                warmup_steps=0,
                optimizer_params={"lr": 2e-5},
                show_progress_bar=False,
            )
            return time.perf_counter() - start

        theirs = (fit(2 + args.train_steps) - fit(2)) / args.train_steps
    print(
        f"training, {rows} pairs a step, {TRAIN_LENGTH} positions: bertjax "
        f"{rows / ours:,.0f} examples/s (first step, compiling: {compile_time:.1f} s); "
        f"sentence-transformers fit {rows / theirs:,.0f} examples/s; "
        f"ratio bertjax / sentence-transformers: {theirs / ours:.2f}"
    )


if __name__ == "__main__":
    main()
