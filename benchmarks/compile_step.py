"""What compiling a packed fine-tuning train step costs, with and without its conditional.

    python benchmarks/compile_step.py [--rounds 3] [--batch 32] [--width 256]

A fine-tuning run whose token capacity comes from its data (`token_capacity=0`, the default)
knows that every batch fits the packed slots, so its train step packs without asking; told
nothing, the step chooses at run time between packing and not (a `lax.cond`), and its
program holds both gradients. This compiles both programs of one train step (a sequence
classifier on a batch of `--batch` x `--width` positions, packed into half of them) for a
BERT (MiniLM's shape, L6/H384/A12) and a ModernBERT (L6/H256/A4), alternating, jax's caches
cleared before each compile and the persistent compilation cache off, and prints the median
seconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bertjax.capability import HeadSpec  # noqa: E402
from bertjax.encoders.bert.config import BertConfig  # noqa: E402
from bertjax.encoders.modernbert.config import ModernBertConfig  # noqa: E402
from bertjax.engine import (  # noqa: E402
    optim,  # noqa: E402
    steps,  # noqa: E402
)
from bertjax.finetune.objective import build_finetuning  # noqa: E402

MODELS = {
    "BERT L6/H384": BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_layers=6,
        num_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    ),
    "ModernBERT L6/H256": ModernBertConfig(
        vocab_size=50368,
        hidden_size=256,
        intermediate_size=384,
        num_layers=6,
        num_heads=4,
        local_attention=128,
        dtype="float32",
    ),
}


def compile_seconds(config, every_batch_fits: bool, batch: int, width: int) -> float:
    """Seconds to lower and compile one train step (nothing is run)."""
    jax.clear_caches()
    optimizer = optim.OptimizerSettings(learning_rate=2e-5, warmup_steps=0, total_steps=10)
    ft = build_finetuning(
        config,
        HeadSpec("classification", ("no", "yes")),
        optimizer,
        mesh_shape=(1, 1, 1),
        grad_accum_steps=1,
        micro_batch_size=batch,
        max_seq_length=width,
        token_capacity=0.5,
        every_batch_fits=every_batch_fits,
        devices=jax.devices()[:1],
    )
    rows = np.zeros((batch, width), np.int32)
    abstract = {
        "input_ids": rows,
        "input_mask": rows,
        "segment_ids": rows,
        "labels": np.zeros((batch,), np.int32),
        "weights": np.ones((batch,), np.float32),
    }
    with jax.set_mesh(ft.mesh):
        state = jax.eval_shape(ft.state.init, jax.random.key(0))
        global_batch = jax.eval_shape(lambda: steps.global_batch(abstract, ft.batch_sharding, 1))
        start = time.perf_counter()
        ft.train_step.lower(state, global_batch, jax.random.key(1)).compile()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    print("| model | with the conditional s | packed only s | ratio |")
    print("|---|---|---|---|")
    for name, config in MODELS.items():
        seconds = {False: [], True: []}
        for _ in range(args.rounds):
            for fits in (False, True):
                seconds[fits].append(compile_seconds(config, fits, args.batch, args.width))
        both, packed = (statistics.median(seconds[f]) for f in (False, True))
        print(f"| {name} | {both:.1f} | {packed:.1f} | {both / packed:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
