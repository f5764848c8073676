"""Embedding throughput: bertjax.embedding.embed_texts beside sentence-transformers' encode.

    python benchmarks/embedding.py [--sentences 4000] [--batch_size 32] [--layers 4]

One model of random weights (H256, A4, `--layers` layers, mean pooling, normalised), written
as a sentence-transformers directory by bertjax.sbert.save and read by
`SentenceTransformer(path)`: the same weights, tokenizer and settings on both sides. The
texts are random words of a WordPiece vocabulary, 2 to 100 words long (cut at
max_seq_length 128). Both sides batch `--batch_size` texts sorted by length. The outputs are
checked to agree within 1e-4; times are the best of `--repeats` calls after a warm-up call
(bertjax's first call, which compiles each length bucket, is printed separately).
"""

from __future__ import annotations

import argparse
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

from bertjax import embedding, sbert  # noqa: E402
from bertjax.embedding import EmbeddingSpec  # noqa: E402
from bertjax.model import BertConfig  # noqa: E402
from bertjax.tokenizer import WordPieceTokenizer  # noqa: E402

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

    def ours():
        return embedding.embed_texts(config, params, tokenizer, spec, texts, args.batch_size)

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
        f"bertjax embed_texts: {args.sentences / ours_time:,.0f} sentences/s "
        f"(first call, compiling: {first:.1f} s)"
    )
    print(f"sentence-transformers encode: {args.sentences / theirs_time:,.0f} sentences/s")
    print(f"ratio bertjax / sentence-transformers: {theirs_time / ours_time:.2f}")
    if difference > TOLERANCE:
        raise SystemExit(f"outputs differ by {difference:.2e} > {TOLERANCE}")


if __name__ == "__main__":
    main()
