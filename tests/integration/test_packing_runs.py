"""The integration tests of test_packing.py (tests/unit/), with its helpers."""

import json

import numpy as np
import pytest

from bertjax.pretrain import loop as pretrain_loop
from bertjax.pretrain.settings import PretrainSettings
from tests.helpers.corpora import write_corpus
from tests.helpers.packing import packed_config
from tests.helpers.prepare_distributed import files_of, prepare_in_processes, single_process
from tests.helpers.xla_env import run_script


@pytest.mark.slow
def test_two_processes_write_the_single_process_packed_bytes(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus / "a.txt", num_documents=150, seed=1)
    manifest = single_process(corpus, tmp_path / "one", layout="packed")
    assert manifest["layout"] == "packed" and manifest["num_chunks"] >= 4
    prepare_in_processes([str(corpus)], str(tmp_path / "two"), 2, extra=["--layout=packed"])
    assert files_of(tmp_path / "two") == files_of(tmp_path / "one")


@pytest.mark.slow  # a 40-step run and a fresh notebook process: about a minute on two cores
def test_mlm_only_run_on_packed_data_trains_and_loads(packed_data, tmp_path):
    workdir = tmp_path / "run"
    settings = PretrainSettings.from_config(packed_config(packed_data[1]))
    result = pretrain_loop.train_and_evaluate(settings, str(workdir))
    assert result["steps"] == 40
    assert "eval/nsp_loss" not in result["eval"] and result["eval"]["eval/mlm_loss"] > 0
    losses = [
        json.loads(line)["train/loss"]
        for line in (workdir / "metrics.jsonl").read_text().splitlines()
        if "train/loss" in line
    ]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses

    script = (
        "import bertjax\n"
        f"model = bertjax.Model.load({str(workdir)!r})\n"
        "guesses = model.fill_mask('the [MASK] sees a cat.', top_k=3)\n"
        "assert len(guesses) == 3, guesses\n"
        "print(sum(g['score'] for g in guesses))\n"
    )
    completed = run_script(script, cwd=tmp_path, timeout=180)
    assert completed.returncode == 0, completed.stderr
    assert 0 < float(completed.stdout.split()[-1]) <= 1.0 + 1e-6
