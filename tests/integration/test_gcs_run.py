"""Pretraining run directories on gs:// (the emulator of conftest's `gcs` fixture).

The prepared data stays local (conftest's `synthetic_data`); the work directory is in a
bucket: checkpoints, metrics, TensorBoard events, the tokenizer copy and the lock.
"""

import importlib.util
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import bertjax
from bertjax.engine import checkpoint as ckpt
from bertjax.engine import loop as engine_loop
from bertjax.engine import metrics_writer, rundir
from bertjax.pretrain import loop as trainer
from bertjax.storage import fs
from bertjax.text.tokenizer import SENTENCEPIECE_FILE
from tests.helpers.gcs_run import (  # noqa: F401 (fixtures)
    INTERRUPTED_RUN,
    REPO,
    cli,
    config_file,
    leaf_hashes,
    losses,
    objects,
    overrides,
    settings_of,
    straight_reference,
)
from tests.helpers.xla_env import run_distributed, run_process, subprocess_env


def local_names(root: pathlib.Path) -> list[str]:
    return [p.name for p in root.rglob("*")]


@pytest.fixture(scope="module")
def gcs_run(gcs, synthetic_data, tmp_path_factory):
    """(gs:// work directory, summary, cwd) of a 4-step run saving steps 2 and 4, run from an
    empty current directory (where a mangled `gs:` folder would appear)."""
    url = gcs.bucket() + "/run"
    cwd = tmp_path_factory.mktemp("cwd")
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        result = trainer.train_and_evaluate(settings_of(overrides(synthetic_data)), url)
    finally:
        os.chdir(previous)
    return url, result, cwd


def test_a_run_on_gcs_lands_in_the_bucket_and_nothing_local(gcs_run, gcs, synthetic_data):
    url, result, cwd = gcs_run
    names = objects(gcs, url)
    for step in (2, 4):
        assert f"checkpoints/{step}/commit_success.txt" in names
        assert any(n.startswith(f"checkpoints/{step}/params/") for n in names)
    assert any(n.startswith("tensorboard/events.out.tfevents.") for n in names), names
    assert rundir.LOCK_FILE not in names  # released at the end
    gcs.fs.invalidate_cache()
    copied = gcs.fs.cat_file(url[5:] + "/" + SENTENCEPIECE_FILE)
    assert copied == (synthetic_data / SENTENCEPIECE_FILE).read_bytes()
    assert sorted(losses(gcs, url)) == [1, 2, 3, 4]
    assert result["steps"] == 4 and result["workdir"] == url
    assert local_names(cwd) == []  # no `gs:` folder, no stray files


def test_load_from_gcs_equals_loading_a_local_copy(gcs_run, gcs, tmp_path):
    url, _, _ = gcs_run
    local = tmp_path / "run"
    gcs.fs.invalidate_cache()
    gcs.fs.get(url[5:] + "/", str(local), recursive=True)
    config, params, tokenizer = bertjax.load(url)
    local_config, local_params, local_tokenizer = bertjax.load(local)
    assert config == local_config
    assert tokenizer.fingerprint == local_tokenizer.fingerprint
    assert leaf_hashes(params) == leaf_hashes(local_params)

    run = rundir.open_run(url, step=2)
    assert run.kind == rundir.PRETRAINED and fs.is_remote(run.path)
    step, params_2 = rundir.read_params(run)
    _, local_params_2 = rundir.read_params(rundir.open_run(local, step=2))
    assert step == 2 and leaf_hashes(params_2) == leaf_hashes(local_params_2)
    assert leaf_hashes(params_2) != leaf_hashes(params)


def _garble(gcs, step_url: str) -> None:
    """Overwrite the middle of the largest params data object of a step."""
    gcs.fs.invalidate_cache()
    files = [f for f in gcs.fs.find(step_url[5:] + "/params") if "/d/" in f]
    largest = max(files, key=gcs.fs.size)
    data = bytearray(gcs.fs.cat_file(largest))
    middle = len(data) // 2
    data[middle : middle + 256] = np.random.default_rng(7).integers(0, 256, 256, np.uint8).tobytes()
    gcs.fs.pipe_file(largest, bytes(data))


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_damaged_newest_step_on_gcs_falls_back_and_is_moved_aside(gcs_run, gcs, caplog):
    url, _, _ = gcs_run
    copy = gcs.bucket() + "/run"
    gcs.fs.copy(url[5:] + "/", copy[5:], recursive=True)
    _garble(gcs, copy + "/checkpoints/4")

    # A reader (bertjax.load) skips it, naming it, and moves nothing.
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        _, params, _ = bertjax.load(copy)
    assert any("step 4" in r.getMessage() for r in caplog.records)
    expected = rundir.read_params(rundir.open_run(url, step=2))[1]
    assert leaf_hashes(params) == leaf_hashes(expected)
    assert "checkpoints/4/commit_success.txt" in objects(gcs, copy)

    # Resuming moves it to corrupt/ so the step can be saved again, and goes on from step 2.
    settings = settings_of(overrides(pathlib.Path(gcs_run[1]["data_dir"])))
    result = trainer.train_and_evaluate(settings, copy)
    assert result["steps"] == 4
    names = objects(gcs, copy)
    assert any(n.startswith("checkpoints/corrupt/4-") for n in names), names
    assert "checkpoints/4/commit_success.txt" in names
    # Steps 3 and 4 ran again from step 2's state: the same losses as the first run.
    assert losses(gcs, copy)[4] == losses(gcs, url)[4]


# ----------------------------------------------------------------------------- the lock


def test_a_second_run_is_refused_naming_the_holder_and_writes_nothing(gcs, synthetic_data):
    url = gcs.bucket() + "/run"
    with rundir.WorkdirLock(url) as lock:
        holder = json.loads(gcs.fs.cat_file(url[5:] + "/" + rundir.LOCK_FILE))
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(rundir.WorkdirLockedError, match=rf"process {os.getpid()} on "):
            trainer.train_and_evaluate(settings_of(overrides(synthetic_data)), url)
        assert objects(gcs, url) == [rundir.LOCK_FILE]
        assert not lock.lost
    assert objects(gcs, url) == []  # released


def test_heartbeats_keep_a_lock_alive_and_a_silent_one_is_taken_over(gcs):
    url = gcs.bucket() + "/run"
    fast = {"heartbeat_seconds": 0.5, "stale_after_seconds": 2.5}
    holder = rundir.WorkdirLock(url, **fast).acquire()
    first = fs.stat_remote(holder.path)["generation"]
    time.sleep(4)  # longer than the staleness limit: only the heartbeats keep it alive
    assert fs.stat_remote(holder.path)["generation"] != first
    with pytest.raises(rundir.WorkdirLockedError, match="last heartbeat"):
        rundir.WorkdirLock(url, **fast).acquire()
    holder.release()
    assert objects(gcs, url) == []

    # A dead run's lock: another host, never rewritten. Refused while fresh, taken when stale.
    dead = {"host": "some-other-host", "pid": 12345, "since": 0, "token": "x"}
    gcs.fs.pipe_file(url[5:] + "/" + rundir.LOCK_FILE, json.dumps(dead).encode())
    with pytest.raises(rundir.WorkdirLockedError, match="12345 on some-other-host"):
        rundir.WorkdirLock(url, **fast).acquire()
    time.sleep(3)
    with rundir.WorkdirLock(url, **fast):
        taken = json.loads(gcs.fs.cat_file(url[5:] + "/" + rundir.LOCK_FILE))
        assert taken["pid"] == os.getpid()
    assert objects(gcs, url) == []


def test_of_two_takers_of_a_stale_lock_one_wins(gcs):
    url = gcs.bucket() + "/run"
    lock_url = url + "/" + rundir.LOCK_FILE
    fs.write_bytes(lock_url, b'{"host": "gone", "pid": 1}')
    stale = int(fs.stat_remote(lock_url)["generation"])
    # Both read generation `stale`; only the first conditional write may succeed.
    assert fs.write_if_generation(lock_url, b"a", stale) is not None
    assert fs.write_if_generation(lock_url, b"b", stale) is None
    assert fs.read_bytes(lock_url) == b"a"
    assert fs.write_if_generation(lock_url, b"c", 0) is None  # create-if-absent: exists


# ----------------------------------------------------------------------------- bad paths


def test_gcs_without_gcsfs_is_one_line_naming_the_extra_and_writes_nothing(
    synthetic_data, tmp_path, monkeypatch
):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a)
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fs.StorageError, match=r"pip install 'bertjax\[gcs\]'") as caught:
        trainer.train_and_evaluate(settings_of(overrides(synthetic_data)), "gs://bucket/run")
    assert "\n" not in str(caught.value)
    with pytest.raises(fs.StorageError, match=r"bertjax\[gcs\]"):
        settings_of(overrides(synthetic_data, **{"data.dir": "gs://bucket/data"}))
    assert local_names(tmp_path) == []


def test_train_py_without_gcsfs_says_so_in_one_line(tmp_path):
    # train.py with gcsfs hidden from it: what a user without the extra sees.
    hide = (
        "import importlib.util, runpy, sys; real = importlib.util.find_spec; "
        "importlib.util.find_spec = lambda n, *a: None if n == 'gcsfs' else real(n, *a); "
        f"sys.argv = ['train.py', '--workdir', 'gs://bucket/run']; "
        f"runpy.run_path({str(REPO / 'train.py')!r}, run_name='__main__')"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    completed = subprocess.run(
        [sys.executable, "-c", hide], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert completed.returncode != 0
    last = completed.stderr.strip().splitlines()
    assert last and "pip install 'bertjax[gcs]'" in last[-1], completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    assert local_names(tmp_path) == []


def test_a_missing_bucket_is_named(gcs, synthetic_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fs.StorageError, match="bucket gs://no-such-bucket-9f3a does not exist"):
        trainer.train_and_evaluate(
            settings_of(overrides(synthetic_data)), "gs://no-such-bucket-9f3a/run"
        )
    assert not gcs.fs.exists("no-such-bucket-9f3a")  # not created by the attempt either
    assert local_names(tmp_path) == []


# ----------------------------------------------------------------------------- metrics


def test_metrics_upload_in_the_background_and_fully_at_close(gcs):
    url = gcs.bucket() + "/run"
    jsonl = url + "/metrics.jsonl"
    fs.write_text(jsonl, '{"step": 1, "x": 1.0}\n')  # an earlier run's line: kept
    writer = metrics_writer.MetricWriter(jsonl, url + "/tensorboard", upload_every_seconds=0.1)
    writer.write(2, {"x": 2.0})
    deadline = time.time() + 20
    while time.time() < deadline and fs.read_text(jsonl).count("\n") < 2:
        time.sleep(0.1)  # uploaded by the background thread, while the writer stays open
    assert fs.read_text(jsonl).count("\n") == 2
    for step in range(3, 30):
        writer.write(step, {"x": float(step)})
    writer.close()
    steps = [json.loads(line)["step"] for line in fs.read_text(jsonl).splitlines()]
    assert steps == list(range(1, 30))
    assert any(n.startswith("tensorboard/events.out.tfevents.") for n in objects(gcs, url))


def test_a_preempted_run_on_gcs_uploads_its_metrics_before_it_stops(
    gcs, synthetic_data, monkeypatch, tmp_path
):
    url = gcs.bucket() + "/run"
    monkeypatch.chdir(tmp_path)
    # The upload interval is longer than the run: only the stop's own upload can bring them.
    monkeypatch.setattr(metrics_writer, "UPLOAD_EVERY_SECONDS", 3600.0)
    monkeypatch.setattr(engine_loop.PreemptionWatcher, "should_stop", lambda self, step: step == 3)
    values = overrides(synthetic_data, num_train_steps=10, checkpoint_every_steps=100)
    result = trainer.train_and_evaluate(settings_of(values), url)
    assert result["preempted"] and result["steps"] == 3
    assert sorted(losses(gcs, url)) == [1, 2, 3]
    names = objects(gcs, url)
    assert "checkpoints/3/commit_success.txt" in names and rundir.LOCK_FILE not in names
    assert local_names(tmp_path) == []


# ----------------------------------------------------------------------------- subprocesses


@pytest.mark.slow
def test_resume_after_a_kill_during_a_save_on_gcs_is_bit_identical(
    gcs, synthetic_data, config_file, straight_reference, tmp_path
):
    values = overrides(synthetic_data, **INTERRUPTED_RUN)
    killed = gcs.bucket() + "/run"
    root = killed[5:] + "/checkpoints"
    process = subprocess.Popen(
        cli(values, killed, config_file),
        env=subprocess_env(2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    # Killed once step 20's save has started writing objects (the final save: the run would
    # end right after it), if possible before its commit file.
    deadline = time.time() + 240
    while process.poll() is None and time.time() < deadline:
        gcs.fs.invalidate_cache()
        if any(name.startswith(root + "/20") for name in gcs.fs.find(root)):
            break
        time.sleep(0.02)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    names = objects(gcs, killed)
    assert "checkpoints/10/commit_success.txt" in names
    if "checkpoints/20/commit_success.txt" in names:  # the save finished before the kill
        gcs.fs.rm(root + "/20", recursive=True)

    completed = run_process(cli(values, killed, config_file), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Resumed" in completed.stdout and "step 10" in completed.stdout
    assert leaf_hashes(bertjax.load(killed)[1]) == straight_reference["hashes"]
    assert losses(gcs, killed)[20] == straight_reference["losses"][20]
    assert local_names(tmp_path) == []


@pytest.mark.slow
def test_two_processes_share_a_gcs_work_directory(gcs, synthetic_corpus, config_file, tmp_path):
    # The corpus is in the bucket and no data.dir is given: each run prepares its data into
    # <workdir>/data, the two-process run with each process preparing half of the chunks.
    corpus = gcs.bucket("corpus") + "/corpus.txt"
    fs.write_bytes(corpus, synthetic_corpus.read_bytes())
    values = overrides(
        "",
        **{
            "data.input": corpus,
            "data.vocab_size": 350,
            "data.dupe_factor": 3,
            "data.eval_fraction": 0.1,
            "model.hidden_dropout": 0.0,
            "model.attention_dropout": 0.0,
        },
    )
    del values["data.dir"]
    single = gcs.bucket() + "/run"
    run_process(cli(values, single, config_file), devices=4, check=True)
    multi = gcs.bucket() + "/run"
    run_distributed(cli(values, multi, config_file), cwd=tmp_path)
    names = objects(gcs, multi)
    assert "checkpoints/4/commit_success.txt" in names
    assert any(n.startswith("checkpoints/4/params/ocdbt.process_1") for n in names), names
    assert rundir.LOCK_FILE not in names
    prepared = sorted(n for n in names if n.startswith("data/"))
    assert "data/manifest.json" in prepared and not any("/.parts" in n for n in prepared)
    assert prepared == sorted(n for n in objects(gcs, single) if n.startswith("data/"))
    for name in prepared:
        if name.endswith(".npy"):  # the shards: what one process writes, byte for byte
            assert fs.read_bytes(f"{multi}/{name}") == fs.read_bytes(f"{single}/{name}"), name
    expected, got = losses(gcs, single), losses(gcs, multi)
    assert sorted(got) == [1, 2, 3, 4]
    np.testing.assert_allclose([got[s] for s in got], [expected[s] for s in got], rtol=1e-5)
    assert local_names(tmp_path) == []


@pytest.mark.slow
def test_the_demo_command_runs_wholly_on_gcs(gcs, tmp_path):
    """The issue's command: train.py's defaults (the demo corpus, tiny config) with only a
    gs:// work directory. Corpus, prepared data, checkpoints, eval and metrics land in the
    bucket; nothing is left on local disk, not even in the metrics cache under $TMPDIR."""
    url = gcs.bucket() + "/run"
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = subprocess_env(1)
    env["TMPDIR"] = str(tmp)
    completed = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--workdir", url]
        + ["--config.num_train_steps=5", "--config.optimizer.warmup_steps=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    names = objects(gcs, url)
    assert any(n.startswith("corpus/demo_corpus-") for n in names), names
    assert "data/manifest.json" in names and any(n.startswith("data/train/shard-") for n in names)
    assert "checkpoints/5/commit_success.txt" in names
    assert SENTENCEPIECE_FILE in names and rundir.LOCK_FILE not in names
    records = [json.loads(line) for line in fs.read_text(url + "/metrics.jsonl").splitlines()]
    assert any("eval/mlm_loss" in r for r in records), records[-1]
    assert max(r["step"] for r in records) == 5
    assert local_names(cwd) == [] and local_names(tmp) == []
    assert bertjax.Model.load(url).fill_mask("the [MASK] sat")  # and it opens from there
