"""Runs on gs:// through the command line: config files and overrides, the objects a run
writes, its losses, leaf hashes and an uninterrupted reference run."""

import hashlib
import json
import pathlib
import sys

import jax
import numpy as np
import pytest

import bertjax
from bertjax.pretrain.settings import PretrainSettings
from configs import tiny
from tests.helpers.corpora import ONE_LAYER
from tests.helpers.xla_env import REPO, run_process

SEQ_LEN = 64


PREDICTIONS = 10


def overrides(data_dir, **extra) -> dict:
    """A one-layer model on the synthetic data: a few seconds a run."""
    values = {
        "data.dir": str(data_dir),
        "data.max_seq_length": SEQ_LEN,
        "data.max_predictions_per_seq": PREDICTIONS,
        **ONE_LAYER,
        "batch_size": 16,
        "num_train_steps": 4,
        "log_every_steps": 1,
        "eval_every_steps": 1000,
        "eval_batches": 1,
        "checkpoint_every_steps": 2,
        "optimizer.warmup_steps": 2,
        "fill_mask_samples": 0,
    }
    values.update(extra)
    return values


def settings_of(values: dict) -> PretrainSettings:
    config = tiny.get_config()
    config.update_from_flattened_dict(values)
    return PretrainSettings.from_config(config)


def objects(gcs, url: str) -> list[str]:
    """Every object under a gs:// prefix, relative to it."""
    gcs.fs.invalidate_cache()
    root = url[len("gs://") :]
    return sorted(name[len(root) + 1 :] for name in gcs.fs.find(root))


def losses(gcs, url: str) -> dict[int, float]:
    gcs.fs.invalidate_cache()
    lines = gcs.fs.cat_file(url[len("gs://") :] + "/metrics.jsonl").decode().splitlines()
    return {r["step"]: r["train/loss"] for r in map(json.loads, lines) if "train/loss" in r}


def leaf_hashes(params) -> dict[str, str]:
    return {
        jax.tree_util.keystr(path): hashlib.sha256(np.asarray(leaf).tobytes()).hexdigest()
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }


MODEL_FIELDS = tuple(ONE_LAYER)


@pytest.fixture(scope="session")
def config_file(tmp_path_factory) -> pathlib.Path:
    """tiny.py with the one-layer model of `overrides` (fields the command line cannot add)."""
    path = tmp_path_factory.mktemp("config") / "one_layer.py"
    values = ONE_LAYER
    path.write_text(
        "from configs import tiny\n\n\ndef get_config():\n    config = tiny.get_config()\n"
        f"    config.update_from_flattened_dict({values!r})\n    return config\n"
    )
    return path


def cli(values: dict, workdir: str, config: pathlib.Path) -> list[str]:
    args = [sys.executable, str(REPO / "train.py"), "--config", str(config), "--workdir", workdir]
    return args + [
        f"--config.{key}={value}" for key, value in values.items() if key not in MODEL_FIELDS
    ]


# The run that the kill and outage tests stop part-way and resume.
INTERRUPTED_RUN = {"num_train_steps": 20, "checkpoint_every_steps": 10}


@pytest.fixture(scope="session")
def straight_reference(synthetic_data, config_file, shared_by_workers) -> dict:
    """{"losses": {step: train loss}, "hashes": leaf hashes of the final parameters} of
    INTERRUPTED_RUN made in one go, in a local work directory: what a run on gs:// that was
    killed or cut off and then resumed must end at, bit for bit. Made once for the whole
    suite (conftest's `shared_by_workers`)."""

    def make(directory: pathlib.Path) -> dict:
        workdir = directory / "run"
        values = overrides(synthetic_data, **INTERRUPTED_RUN)
        run_process(cli(values, str(workdir), config_file), check=True)
        records = map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
        return {
            "losses": {r["step"]: r["train/loss"] for r in records if "train/loss" in r},
            "hashes": leaf_hashes(bertjax.load(str(workdir))[1]),
        }

    reference = shared_by_workers("gcs_straight_reference", make)
    reference["losses"] = {int(step): loss for step, loss in reference["losses"].items()}
    return reference
