"""Local disk beside gs:// (a GCS emulator started here): loader throughput, checkpoint times.

    python -m benchmarks.storage [--corpus_mb 8] [--batches 60] [--presets tiny base]

Starts fake-gcs-server on 127.0.0.1 (tests/helpers/gcs_emulator.py, the suite's emulator), then

  loader      a synthetic corpus prepared once (max_seq_length 128), copied to the bucket, and
              read by the loader (batch 256, shuffled, masked) from disk and from gs://, with
              the same prefetch threads (--threads): batches/s and MB/s of token bytes gathered.
  checkpoint  an Orbax CheckpointManager saving and restoring a parameter tree at BERT's shapes
              (tiny: the tests' model; base: BERT-base's 110M float32 parameters) into a local
              directory and into the bucket; seconds per save (until finished) and restore.

and prints a table with the ratios gs:// / local. The emulator serves from its own local
filesystem over HTTP on this machine, so the ratios measure the client path (requests,
range reads, uploads), not a data centre's network: a real bucket adds its latency.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
from typing import Any

# First: it sets the emulator's environment before gcsfs is imported.
from tests.helpers import gcs_emulator

# isort: split
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from benchmarks.harness import fixtures, report, timing
from bertjax.data import MaskingSettings, make_loader, prepare
from bertjax.encoders.bert.config import BertConfig
from bertjax.storage import fs

SEQ_LEN = 128
BATCH = 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus_mb", type=float, default=8.0, help="synthetic corpus size")
    parser.add_argument("--batches", type=int, default=60, help="loader batches timed")
    parser.add_argument("--threads", type=int, default=4, help="loader prefetch threads")
    parser.add_argument(
        "--presets", nargs="*", default=["tiny", "base"], help="tree sizes (none: loader only)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="checkpoint saves and restores")
    report.add_json_flag(parser)
    return parser.parse_args(argv)


def write_corpus(path: pathlib.Path, megabytes: float) -> None:
    """Random words in google's format (a sentence a line, blank line between documents)."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(3000)]
    with open(path, "w") as f:
        written = 0
        while written < megabytes * 1e6:
            for _ in range(rng.integers(3, 12)):
                line = " ".join(rng.choice(words, size=rng.integers(6, 24))) + ".\n"
                written += f.write(line)
            f.write("\n")


def upload(emulator, local: pathlib.Path, remote: str) -> None:
    for file in sorted(local.rglob("*")):
        if file.is_file():
            relative = file.relative_to(local).as_posix()
            emulator.fs.pipe_file(f"{remote[len('gs://') :]}/{relative}", file.read_bytes())
    emulator.fs.invalidate_cache()


def time_loader(data_dir, batches: int, threads: int) -> tuple[float, float]:
    """(batches/s, MB/s of token bytes) after a warm-up batch."""
    loader = make_loader(
        data_dir, batch_size=BATCH, seed=0, masking=MaskingSettings(), worker_count=threads
    )
    itemsize = 2  # uint16 tokens (vocabulary below 65536)
    tokens = 0

    def read() -> None:
        nonlocal tokens
        for _ in range(batches):
            tokens += int(next(loader)["input_mask"].sum())

    next(loader)  # the warm-up: the first batch opens the shards and starts the threads
    seconds = timing.time_call(read, rounds=1, warmup=0).median
    loader.close()
    return batches / seconds, tokens * itemsize / seconds / 1e6


def parameter_tree(preset: str):
    """Random float32 values at the shapes of BertForPreTraining's parameters."""
    params = fixtures.random_params(BertConfig.preset(preset), seed=0, std=0.02)
    return jax.tree.map(jnp.asarray, params)


def time_checkpoints(directory: str, tree, rounds: int) -> tuple[float, float]:
    """(median seconds per save until finished, per restore) with a fresh manager each time,
    a save and its restore in turn in each round."""
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
    )
    step = 0

    def save() -> None:
        nonlocal step
        step += 1
        manager = ocp.CheckpointManager(
            directory, options=ocp.CheckpointManagerOptions(max_to_keep=1)
        )
        manager.save(step, args=ocp.args.StandardSave(tree))
        manager.wait_until_finished()
        manager.close()

    def restore():
        with ocp.CheckpointManager(directory) as manager:
            restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
        first = jax.tree.leaves(tree)[0]
        assert np.array_equal(np.asarray(jax.tree.leaves(restored)[0]), np.asarray(first))
        return restored

    found = timing.time_rounds({"save": save, "restore": restore}, rounds=rounds, warmup=0)
    return found["save"].median, found["restore"].median


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = report.start("storage", argv)
    emulator = gcs_emulator.Emulator()
    rows: list[tuple[str, str, float, float]] = []  # (what, unit, local, gs://)
    try:
        bucket = emulator.bucket("bench")
        with tempfile.TemporaryDirectory(prefix="bertjax_storage_bench_") as tmp:
            root = pathlib.Path(tmp)
            write_corpus(root / "corpus.txt", args.corpus_mb)
            manifest = prepare(
                [str(root / "corpus.txt")],
                root / "data",
                max_seq_length=SEQ_LEN,
                vocab_size=2000,
                eval_fraction=0.01,
                workers=1,
                verbose=False,
            )
            upload(emulator, root / "data", f"{bucket}/data")
            train = manifest["splits"]["train"]
            print(
                f"data: {train['num_instances']} train instances in {len(train['shards'])} "
                f"shards, {train['num_tokens'] * 2 / 1e6:.1f} MB of tokens; batch {BATCH} x "
                f"{SEQ_LEN}, {args.threads} prefetch threads, {args.batches} batches"
            )
            local = time_loader(root / "data", args.batches, args.threads)
            remote = time_loader(f"{bucket}/data", args.batches, args.threads)
            rows.append(("loader", "batches/s", local[0], remote[0]))
            rows.append(("loader", "MB/s", local[1], remote[1]))

            for preset in args.presets:
                tree = parameter_tree(preset)
                megabytes = sum(x.nbytes for x in jax.tree.leaves(tree)) / 1e6
                what = f"checkpoint {preset} ({megabytes:.0f} MB)"
                local = time_checkpoints(str(root / f"ckpt-{preset}"), tree, args.rounds)
                remote = time_checkpoints(fs.join(bucket, f"ckpt-{preset}"), tree, args.rounds)
                rows.append((what, "save s", local[0], remote[0]))
                rows.append((what, "restore s", local[1], remote[1]))
    finally:
        emulator.stop()

    print(f"\n{'':28} {'':10} {'local':>10} {'gs://':>10} {'gs:/local':>10}")
    for what, unit, local, remote in rows:
        print(f"{what:28} {unit:10} {local:10.2f} {remote:10.2f} {remote / local:10.2f}")
    figures = {f"{what} {unit}": {"local": a, "gs://": b} for what, unit, a, b in rows}
    report.finish("storage", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
