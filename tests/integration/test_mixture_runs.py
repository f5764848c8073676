"""Pretraining on a weighted mixture of three sources in three shipped formats: a run stopped
part-way resumes to bit-identical parameters on one process and on two, prepared sources are
reused, and a new phase that changes the weights (and adds a source) records both mixtures."""

import json
import pathlib
import shutil

import numpy as np
import pytest

import bertjax
from bertjax.data import mixture
from bertjax.data.corpus import InputReport, read_documents
from bertjax.data.demo_sources import write_sources
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import loop as engine_loop
from bertjax.pretrain import loop as trainer
from bertjax.pretrain.data import SOURCES_DIR
from bertjax.pretrain.settings import PretrainSettings
from configs import tiny
from tests.helpers.corpora import ONE_LAYER, write_corpus
from tests.helpers.gcs_run import (
    cli,
    config_file,  # noqa: F401 (fixtures)
    leaf_hashes,
)
from tests.helpers.mixture import format_sources
from tests.helpers.xla_env import run_distributed

SEQ_LEN = 64
PREDICTIONS = 10
ASKED = {"web": 0.6, "books": 0.3, "wiki": 0.1}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """(root, data.sources): the synthetic corpus dealt to web.parquet, books.jsonl.zst and
    wiki.json.gz (bertjax.data.demo_sources), mixed 0.6 / 0.3 / 0.1."""
    root = tmp_path_factory.mktemp("mixture_runs")
    corpus = write_corpus(root / "corpus.txt", num_documents=600, seed=4)
    sources = write_sources(read_documents([str(corpus)], InputReport()), root / "shipped")
    return root, sources


def values(root: pathlib.Path, sources: str, **extra) -> dict:
    """A one-layer model on the mixture, its sources prepared under root/prepared."""
    return {
        "data.dir": str(root / "prepared"),
        "data.sources": sources,
        "data.max_seq_length": SEQ_LEN,
        "data.max_predictions_per_seq": PREDICTIONS,
        "data.vocab_size": 350,
        "data.dupe_factor": 1,
        "data.eval_fraction": 0.2,
        **ONE_LAYER,
        "batch_size": 16,
        "num_train_steps": 4,
        "log_every_steps": 1,
        "eval_every_steps": 2,
        "eval_batches": 1,
        "checkpoint_every_steps": 2,
        "optimizer.warmup_steps": 2,
        "fill_mask_samples": 0,
        **extra,
    }


def train(values: dict, workdir: pathlib.Path) -> dict:
    config = tiny.get_config()
    config.update_from_flattened_dict(values)
    return trainer.train_and_evaluate(PretrainSettings.from_config(config), str(workdir))


def losses(workdir: pathlib.Path) -> dict[int, float]:
    records = map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


def manifests(root: pathlib.Path) -> dict[str, float]:
    """Each prepared source directory's manifest and when it was written."""
    return {
        p.parent.name: p.stat().st_mtime_ns
        for p in sorted((root / "prepared" / SOURCES_DIR).glob("*/manifest.json"))
    }


@pytest.fixture(scope="module")
def straight(shipped, tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """(work directory, summary) of the mixture run made in one go."""
    root, sources = shipped
    workdir = tmp_path_factory.mktemp("straight") / "run"
    return workdir, train(values(root, sources), workdir)


@pytest.mark.slow
def test_a_stopped_mixture_run_resumes_to_identical_parameters(
    shipped, straight, tmp_path, monkeypatch
):
    root, sources = shipped
    workdir, result = straight
    prepared = manifests(root)
    assert sorted(name.split("-")[0] for name in prepared) == ["books", "web", "wiki"]
    monkeypatch.setattr(engine_loop.PreemptionWatcher, "should_stop", lambda self, step: step == 2)
    stopped = train(values(root, sources), tmp_path / "run")
    assert stopped["preempted"] and stopped["steps"] == 2
    monkeypatch.undo()
    resumed = train(values(root, sources), tmp_path / "run")
    assert resumed["steps"] == 4 and not resumed["preempted"]
    assert losses(tmp_path / "run") == losses(workdir)
    assert leaf_hashes(bertjax.load(str(tmp_path / "run"))[1]) == leaf_hashes(
        bertjax.load(str(workdir))[1]
    )
    assert manifests(root) == prepared  # both runs reused the sources the first prepared
    # The summary and the metrics give each source's share beside the asked one.
    assert result["mixture"]["asked"] == pytest.approx(ASKED)
    for name, share in result["mixture"]["realised"].items():
        assert abs(share - ASKED[name]) <= 2 / 64  # 64 examples: within two of the asked
    logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert {"data/share/web", "data/share/books", "data/share/wiki"} <= set(logged[-1])
    meta = checkpoint_lib.read_meta(workdir / "checkpoints")
    assert [s["weight"] for s in meta["mixture"]["sources"]] == [0.6, 0.3, 0.1]
    assert meta["loader_state"]["step"] == 4


@pytest.mark.slow
def test_a_new_phase_changes_the_weights_adds_a_source_and_records_both(
    shipped, straight, tmp_path
):
    root, sources = shipped
    workdir, _ = straight
    prepared = manifests(root)
    extra = write_corpus(root / "extra.txt", num_documents=60, seed=9)
    changed = mixture.parse_sources(sources)
    reweighted = tuple(
        mixture.Source(s.name, s.paths, w, s.format, s.text_field, s.id_field)
        for s, w in zip(changed, (0.2, 0.2, 0.5))
    ) + (mixture.Source("extra", (str(extra),), 0.1),)
    phase = tmp_path / "decay"
    result = train(values(root, format_sources(reweighted), init_from=str(workdir)), phase)
    assert result["steps"] == 4
    after = manifests(root)
    # The three sources were not prepared again; the new one was, with the same tokenizer.
    assert {k: v for k, v in after.items() if k in prepared} == prepared
    (new,) = set(after) - set(prepared)
    assert new.startswith("extra-")
    tokenizers = {
        (root / "prepared" / SOURCES_DIR / name / "tokenizer.model").read_bytes() for name in after
    }
    assert len(tokenizers) == 1
    meta = checkpoint_lib.read_meta(phase / "checkpoints")
    assert meta["mixture"]["asked"] == pytest.approx(
        {"web": 0.2, "books": 0.2, "wiki": 0.5, "extra": 0.1}
    )
    assert meta["phase"]["mixture_before"]["asked"] == pytest.approx(ASKED)
    assert meta["phase"]["init_from"] == str(workdir)


@pytest.mark.slow
def test_two_processes_train_on_the_same_mixture_and_resume_exactly(
    shipped, straight, config_file, tmp_path
):
    root, sources = shipped
    workdir, _ = straight
    args = values(root, sources)
    two = tmp_path / "two"
    run_distributed(cli(args, str(two), config_file))
    # The same batches as one process (each process reads its half of every batch).
    got, expected = losses(two), losses(workdir)
    assert sorted(got) == [1, 2, 3, 4]
    np.testing.assert_allclose([got[s] for s in got], [expected[s] for s in got], rtol=1e-5)
    # Stopped after its step-2 checkpoint: what a kill then leaves, resumed on two processes.
    stopped = tmp_path / "stopped"
    shutil.copytree(two, stopped)
    shutil.rmtree(stopped / "checkpoints" / "4")
    outputs = run_distributed(cli(args, str(stopped), config_file))
    assert "Resumed" in outputs[0] and "step 2" in outputs[0]
    assert leaf_hashes(bertjax.load(str(stopped))[1]) == leaf_hashes(bertjax.load(str(two))[1])
