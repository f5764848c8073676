"""benchmarks.step_times: a fine-tuning command's steps timed width by width, in a process
of its own as a user runs it."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from tests.helpers.corpora import write_topic_csv
from tests.helpers.xla_env import subprocess_env

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # one short fine-tuning run: about 15 s
def test_every_training_step_is_timed_under_its_width(pretrained_run, tmp_path):
    init_from, topics = pretrained_run
    write_topic_csv(tmp_path / "train.csv", topics, 48, seed=1)
    write_topic_csv(tmp_path / "dev.csv", topics, 8, seed=2)
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.step_times",
            "--",
            f"--workdir={tmp_path / 'run'}",
            f"--config.init_from={init_from}",
            "--config.task=classification",
            f"--config.data.train={tmp_path / 'train.csv'}",
            f"--config.data.validation={tmp_path / 'dev.csv'}",
            "--config.num_epochs=2",
            "--config.batch_size=8",
            "--config.data.max_seq_length=32",
            "--config.length_bucket=4",
            "--config.mesh_shape=(1,1,1)",
            "--compilation_cache=off",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(1),
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    out = process.stdout
    total = re.search(r"(\d+) training steps, (\d+) widths; the command: [\d.]+ s", out)
    steps, widths = map(int, total.groups())
    assert steps == 2 * (48 // 8)
    rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+([\d.]+|nan) s\s+([\d.]+) s$", out, re.MULTILINE)
    assert len(rows) == widths >= 1
    assert sum(int(count) for _, count, _, _ in rows) == steps
    assert all(int(width) % 4 == 0 and int(width) <= 32 for width, _, _, _ in rows)
    found = re.search(
        r"steady steps ([\d.]+) s \(([\d.]+) cores busy\), first calls ([\d.]+) s", out
    )
    steady, cores, firsts = map(float, found.groups())
    assert steady > 0 and firsts > 0 and cores > 0
    (row,) = [
        json.loads(line[len("result: ") :])
        for line in out.splitlines()
        if line.startswith("result: ")
    ]
    assert row["benchmark"] == "step_times" and row["figures"]["steps"] == steps
    assert sum(w["steps"] for w in row["figures"]["widths"].values()) == steps
