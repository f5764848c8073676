"""The GLUE suite end to end on GLUE-shaped data from the one-layer pretrained run: every
task's metric recomputed from the written predictions, a killed suite resumed, the hub's
parquet layout, a submission, and a curve over pretraining checkpoints."""

import json
import pathlib
import zipfile

import glue_data
import numpy as np
import pytest

from bertjax.glue import suite
from bertjax.glue.settings import SuiteSettings
from configs import glue as glue_recipe

TASKS = ("sst2", "mrpc", "stsb", "mnli", "rte")


def suite_config(init_from, data_dir, **fields):
    """configs/glue.py with a tiny sweep sized for the one-layer model."""
    config = glue_recipe.get_config()
    config.init_from = str(init_from)
    config.data_dir = str(data_dir)
    config.seeds = (1,)
    config.sweep.learning_rate = (1e-3,)
    config.finetune.batch_size = 16
    config.finetune.eval_batch_size = 32
    config.finetune.num_epochs = 2
    config.finetune.log_every_steps = 5
    config.finetune.data.max_seq_length = 32
    config.update_from_flattened_dict(fields)
    return config


class Killed(Exception):
    """What stops the suite after its first run, as a kill would."""


@pytest.fixture(scope="module")
def download_suite(pretrained_run, tmp_path_factory):
    init_from, topics = pretrained_run
    root = tmp_path_factory.mktemp("glue")
    data = glue_data.write_download(root / "glue", topics, TASKS, train=32, dev=16, test=8)
    config = suite_config(init_from, data, tasks=",".join(TASKS), submission=True)
    config.per_task = {"rte": {"start_from": "mnli"}}
    settings = SuiteSettings.from_config(config)
    workdir = root / "suite"

    def kill(run):
        raise Killed(run.directory)

    with pytest.raises(Killed):
        suite.run_suite(settings, str(workdir), after_run=kill)
    first = sorted(workdir.glob("*/*/seed_1/result.json"))
    stamps = {p: p.stat().st_mtime_ns for p in first}
    summary = suite.run_suite(settings, str(workdir))
    return workdir, data, topics, summary, stamps


def read_predictions(path: pathlib.Path) -> list[str]:
    return [line.split("\t")[1] for line in path.read_text().splitlines()[1:]]


def mcc(p, g):
    classes = sorted(set(p) | set(g))
    t = [[sum(1 for a, b in zip(p, g) if a == x and b == y) for y in classes] for x in classes]
    ...


@pytest.mark.slow
def test_a_killed_suite_resumes_without_redoing_a_finished_run(download_suite):
    workdir, _, _, summary, stamps = download_suite
    assert len(stamps) == 1  # the kill came after the first run
    for path, stamp in stamps.items():
        assert path.stat().st_mtime_ns == stamp
    assert summary["runs"] == len(TASKS) and len(summary["executed"]) == len(TASKS) - 1
