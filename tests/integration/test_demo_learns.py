"""The demo recipes learn: BERT's leaves the unigram plateau within a fixed number of steps,
ModernBERT's ends well above the unigram baseline.

`python train.py` with configs/tiny.py, as a new user runs it on the demo corpus: eval MLM
accuracy must reach EXIT_RATIO x the unigram baseline (always predicting the commonest masked
piece) by step MAX_STEPS of the recipe's own schedule. The run is stopped with SIGTERM once it
has (or at MAX_STEPS), so only the steps needed are paid for. Steps are counted, never
seconds. The demo corpus is the interpreter's own documentation, so it differs between Python
versions. Measured: on Python 3.11.7's the recipe reaches it at step 125 (0.087 against a
threshold of 0.074), on 3.11.2's at step 150 (0.072 at step 125, 0.092 at 150, against
0.078); the previous recipe (google's initializer_range and dropout) was at 0.059 at step 125
on 3.11.7's and reached it at step 200. docs/training.md ("The tiny recipe's choices") gives
what each choice of the recipe measured.

configs/modernbert_tiny.py runs wholly as the recipe says (250 steps, evaluated at steps 125
and 250) until eval MLM accuracy reaches the issue's bar of 2.5x the baseline, which it must by
its last step; the summary it prints when stopped is read. Measured (one core, 0.0518
baseline): 0.1299 (2.5x) at step 125, 0.1423 at 150, 0.1856 at 200 and 0.2149 (4.1x) at 250
(evaluating more often leaves training unchanged). Stopping at the bar at step 125 takes 57 s
alone on two cores (62 s when it also evaluated every 25 steps); the whole run took 167 s on one.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from bertjax.data import read_manifest
from bertjax.data.baseline import unigram_baseline
from bertjax.engine.rundir import DATA_DIR
from bertjax.pretrain import loop as pretrain_loop
from bertjax.pretrain.settings import PretrainSettings
from configs import modernbert_tiny, tiny
from tests.helpers.xla_env import QUICK_COMPILES

REPO = pathlib.Path(__file__).resolve().parents[2]
EVAL_EVERY = 25
EVAL_BATCHES = 8  # 256 held-out sequences, about 4,800 masked-LM targets
EXIT_RATIO = 1.5
MAX_STEPS = 150


def eval_accuracies(metrics_file: pathlib.Path) -> dict[int, float]:
    if not metrics_file.is_file():
        return {}
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return {r["step"]: r["eval/mlm_accuracy"] for r in records if "eval/mlm_accuracy" in r}


def laptop_env() -> dict[str, str]:
    """One CPU device, as `python train.py` runs on a laptop (conftest simulates eight), and
    compiled as a user's would be: none of the suite's quick-compile settings."""
    env = {k: v for k, v in os.environ.items() if k not in QUICK_COMPILES}
    env.update({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.timeout(600)  # up to MAX_STEPS steps of the recipe, as a user runs them
def test_the_demo_recipe_leaves_the_unigram_plateau_within_a_fixed_number_of_steps(
    tmp_path, demo_run
):
    settings = PretrainSettings.from_config(tiny.get_config())
    workdir = tmp_path / "run"
    # What train.py prepares in its work directory: the shared short default run prepared it
    # with the recipe's data settings and seed (conftest.py); this run reads it from there.
    data_dir = demo_run[0] / DATA_DIR
    manifest = read_manifest(data_dir)
    assert (manifest["max_seq_length"], manifest["vocab_size"]) == (
        settings.data.max_seq_length,
        settings.data.vocab_size,
    )
    assert manifest["settings"]["seed"] == settings.run.seed
    assert manifest["settings"]["dupe_factor"] == settings.data.dupe_factor
    assert manifest["settings"]["eval_fraction"] == settings.data.eval_fraction
    baseline = unigram_baseline(
        data_dir,
        batch_size=settings.run.micro_batch_size,
        masking=settings.data.masking,
        seed=settings.run.seed,
        max_batches=EVAL_BATCHES,
    )
    overrides = {
        "eval_every_steps": EVAL_EVERY,
        "eval_batches": EVAL_BATCHES,
        "log_every_steps": EVAL_EVERY,
        "checkpoint_every_steps": 1_000_000,
    }
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "--config",
        str(REPO / "configs" / "tiny.py"),
    ]
    command += ["--workdir", str(workdir), f"--config.data.dir={data_dir}"]
    command += [f"--config.{key}={value}" for key, value in overrides.items()]
    threshold = EXIT_RATIO * baseline.accuracy
    process = subprocess.Popen(
        command, env=laptop_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        # Left alone, the run ends by itself at the recipe's num_train_steps.
        while process.poll() is None:
            accuracies = eval_accuracies(workdir / "metrics.jsonl")
            if (
                any(a >= threshold for a in accuracies.values())
                or max(accuracies, default=0) >= MAX_STEPS
            ):
                break
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # the trainer saves and exits cleanly
        output, _ = process.communicate()
    assert process.returncode == 0, output[-3000:]
    accuracies = eval_accuracies(workdir / "metrics.jsonl")
    assert accuracies, f"train.py logged no evaluation:\n{output[-3000:]}"
    exit_step = min((s for s, a in accuracies.items() if a >= threshold), default=None)
    curve = {s: round(a, 4) for s, a in sorted(accuracies.items())}
    assert exit_step is not None and exit_step <= MAX_STEPS, (
        f"eval MLM accuracy {curve} never reached {EXIT_RATIO} x the unigram baseline "
        f"{baseline.accuracy:.4f} (always {baseline.piece!r}) by step {MAX_STEPS}"
    )


MODERN_RATIO = 2.5


@pytest.mark.timeout(600)  # 125 steps of the recipe at least, as a user runs them
def test_the_modernbert_demo_reaches_well_above_the_unigram_baseline(tmp_path, demo_data):
    """`python train.py --config configs/modernbert_tiny.py` as a user runs it (its schedule,
    evaluations and eval batches, on the demo corpus prepared as the command prepares it:
    conftest.py's demo_data): eval MLM accuracy must reach MODERN_RATIO x the unigram baseline
    by the recipe's last step. The run is stopped with SIGTERM once it has, and the summary it
    prints then shows that accuracy and baseline."""
    settings = PretrainSettings.from_config(modernbert_tiny.get_config())
    total_steps = settings.run.num_train_steps
    data_dir = demo_data("modernbert_tiny")
    baseline = pretrain_loop.eval_baselines(settings, data_dir)["eval/mlm_accuracy"]
    workdir = tmp_path / "run"
    command = [sys.executable, str(REPO / "train.py"), "--config"]
    command += [str(REPO / "configs" / "modernbert_tiny.py"), "--workdir", str(workdir)]
    command += [f"--config.data.dir={data_dir}", "--config.checkpoint_every_steps=1000000"]
    process = subprocess.Popen(
        command, env=laptop_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        # Left alone, the run ends by itself at the recipe's num_train_steps.
        while process.poll() is None:
            accuracies = eval_accuracies(workdir / "metrics.jsonl")
            if any(a >= MODERN_RATIO * baseline for a in accuracies.values()):
                break
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # the trainer saves and exits cleanly
        try:
            output, _ = process.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
    assert process.returncode == 0, output[-3000:]
    accuracies = eval_accuracies(workdir / "metrics.jsonl")
    assert accuracies, f"train.py logged no evaluation:\n{output[-3000:]}"
    curve = {s: round(a, 4) for s, a in sorted(accuracies.items())}
    exit_step = min(
        (s for s, a in accuracies.items() if a >= MODERN_RATIO * baseline), default=None
    )
    assert exit_step is not None and exit_step <= total_steps, (
        f"eval MLM accuracy {curve} never reached {MODERN_RATIO} x the unigram baseline "
        f"{baseline:.4f} by step {total_steps}"
    )
    print(f"eval MLM accuracy {curve}; unigram baseline {baseline:.4f}")
    # The summary printed at the stop: the last evaluation, next to the same baseline.
    line = next((line for line in output.splitlines() if "eval/mlm_accuracy:" in line), "")
    match = re.search(r"eval/mlm_accuracy:\s+([\d.]+)\s+\(baseline ([\d.]+), ", line)
    assert match, output[-3000:]
    last = accuracies[max(accuracies)]
    assert (float(match[1]), float(match[2])) == (round(last, 4), round(baseline, 4)), line
