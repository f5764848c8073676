"""Runs, exports and the lock through a faulty network: fault_proxy.py between every GCS client
(gcsfs and tensorstore) and the emulator of conftest's `gcs` fixture.

What is retried (408, 429, 5xx, dropped connections) is retried until the budget of
bertjax.storage.fs.retry_policy is spent, what is permanent (404, 412) is not, and a fault that
outlasts the budget ends a run in one line that names the path and what survived.
"""

import asyncio
import json
import logging
import os
import subprocess
import threading
import time

import aiohttp
import gcsfs.retry
import jax.numpy as jnp
import pytest
import requests

import bertjax
from bertjax.engine import checkpoint, metrics_writer, rundir
from bertjax.engine import loop as engine_loop
from bertjax.finetune import loop as finetune_loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.inference import Model
from bertjax.pretrain import loop as trainer
from bertjax.storage import fs
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.gcs_run import (  # noqa: F401 (fixtures)
    INTERRUPTED_RUN,
    cli,
    config_file,
    leaf_hashes,
    losses,
    objects,
    overrides,
    settings_of,
    straight_reference,
)
from tests.helpers.gcs_use import _files, _finetune_config, _objects, _write_rows
from tests.helpers.xla_env import subprocess_env


@pytest.fixture(autouse=True)
def store_up(monkeypatch):
    """Each test starts with no request having spent its budget (fs's short cut off)."""
    monkeypatch.setattr(fs, "_down_since", None)


@pytest.fixture
def faults(gcs, monkeypatch):
    """`faults(rate, seed)`: a FaultProxy in front of the emulator that this process's GCS
    clients use from then on (until the test ends); stopped at the end. Random faults
    (rate > 0), and an outage ridden out with `quick_waits`, are retried after waits 20x
    shorter than Google's (the same budget): those tests count faults ridden out, not
    seconds, and spent 20 s (an outage 10 s) waiting; the waits themselves are
    test_the_retry_budget_is_read_from_the_environment's."""
    proxies = []

    def start(rate: float = 0.0, seed: int = 0, *, quick_waits: bool = False) -> FaultProxy:
        proxy = FaultProxy(gcs.url, fault_rate=rate, seed=seed)
        proxies.append(proxy)
        for key, value in proxy.env.items():
            monkeypatch.setenv(key, value)
        if rate > 0 or quick_waits:
            quick = fs.RetryPolicy(
                fs.retry_policy().deadline,
                initial_delay=fs.RETRY_INITIAL_DELAY / 20,
                max_delay=fs.RETRY_MAX_DELAY / 20,
            )
            monkeypatch.setattr(fs, "retry_policy", lambda: quick)
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


def upload(gcs, local, url: str) -> str:
    """A local directory's files copied into the bucket directly (not through the proxy)."""
    gcs.fs.put(str(local), url[len("gs://") :], recursive=True)
    gcs.fs.invalidate_cache()
    return url


# ----------------------------------------------------------------------------- the policy


def test_transient_answers_are_retried_and_permanent_ones_are_not(gcs, faults, monkeypatch):
    monkeypatch.setenv(fs.RETRY_ENV, "20")
    proxy = faults()
    url = gcs.bucket() + "/a"
    # One fault in front of each of the first requests (None: that one goes through).
    proxy.script("503", None, "429", None, "drop", None, "drop_after", None, "503")
    fs.write_bytes(url, b"one")
    assert fs.read_bytes(url) == b"one"
    assert all(proxy.counts[kind] >= 1 for kind in ("503", "429", "drop", "drop_after"))

    proxy.clear_script()  # the next call's requests are counted, none of them faulted
    before = proxy.counts["requests"]
    assert fs.write_if_generation(url, b"two", 0) is None  # it exists: 412, sent once
    assert proxy.counts["requests"] == before + 1
    assert fs.read_bytes(url) == b"one"


@pytest.mark.parametrize(
    "error, transient",
    [
        (gcsfs.retry.HttpError({"code": 503, "message": "unavailable"}), True),
        (gcsfs.retry.HttpError({"code": 429, "message": "slow down"}), True),
        (gcsfs.retry.HttpError({"code": 408, "message": "timeout"}), True),
        (aiohttp.ServerDisconnectedError(), True),
        (requests.exceptions.ProxyError(), True),  # gcsfs's 502
        (asyncio.TimeoutError(), True),
        (FileNotFoundError("b/o"), False),  # 404
        (FileExistsError("b/o"), False),  # 412: a precondition the lock relies on
        (OSError("Forbidden: b/o"), False),  # 403
        (ValueError("Bad Request: b/o invalid"), False),  # 400
        (gcsfs.retry.HttpError({"code": 401, "message": "unauthorized"}), False),
    ],
)
def test_which_failures_are_sent_again(error, transient, monkeypatch):
    monkeypatch.setenv(fs.RETRY_ENV, "0.2")
    assert fs.is_transient(error) is transient
    attempts = []

    async def attempt():
        attempts.append(1)
        raise error

    expected = fs.StorageUnavailableError if transient else type(error)
    with pytest.raises(expected):
        asyncio.run(fs.with_retries(attempt, lambda: "gs://b/o"))
    assert (len(attempts) > 1) is transient


def test_the_retry_budget_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(fs.RETRY_ENV, raising=False)
    assert fs.retry_policy().deadline == fs.RETRY_SECONDS == 120
    # Tensorstore counts attempts: 1+2+4+8+16+32+32+32 s of waits fill the 120 s.
    assert fs.tensorstore_retries() == {"max_retries": 8, "initial_delay": "1s", "max_delay": "32s"}
    monkeypatch.setenv(fs.RETRY_ENV, "3")
    assert fs.retry_policy().deadline == 3
    assert fs.tensorstore_retries()["max_retries"] == 2
    monkeypatch.setenv(fs.RETRY_ENV, "0.5")
    assert fs.tensorstore_retries() == {
        "max_retries": 1,
        "initial_delay": "0.5s",
        "max_delay": "0.5s",
    }
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv(fs.RETRY_ENV, bad)
        with pytest.raises(fs.StorageError, match=f"{fs.RETRY_ENV}='{bad}' is invalid"):
            fs.retry_policy()


def test_a_failed_request_is_named_by_the_object_it_was_for(gcs):
    store = fs.gcs_filesystem()
    location = store._location

    def target(path, *args, **kwargs):
        return fs._request_target(store, path, args, kwargs)

    assert target("b/{}/o/{}", "bkt", "run/checkpoints/10/x") == "gs://bkt/run/checkpoints/10/x"
    assert target(f"{location}/download/storage/v1/b/bkt/o/a%2Fb?alt=media") == "gs://bkt/a/b"
    assert target("b/{}/o", "bkt", prefix="run/checkpoints/") == "gs://bkt/run/checkpoints/"
    session = f"{location}/upload/storage/v1/b/bkt/o?uploadType=resumable&name=a%2Fb&upload_id=7"
    assert target(session) == "gs://bkt/a/b"
    multipart = b'--==0==\nContent-Type: application/json\n\n{"name": "a/lock"}\n--==0=='
    assert target(f"{location}/upload/storage/v1/b/bkt/o", data=multipart) == "gs://bkt/a/lock"
    assert target("b/{}", "bkt") == "gs://bkt"


def test_an_outage_beyond_the_budget_is_one_line_naming_the_path(gcs, faults, monkeypatch):
    monkeypatch.setenv(fs.RETRY_ENV, "1")
    proxy = faults()
    url = gcs.bucket() + "/data/x.bin"
    fs.write_bytes(url, b"x")
    proxy.outage(4)
    started = time.monotonic()
    with pytest.raises(fs.StorageUnavailableError) as caught:
        fs.read_bytes(url)
    message = str(caught.value)
    assert message.startswith(f"{url}: cannot read: GCS did not answer for 1 s")
    assert "last error: " in message and "\n" not in message
    # The store was just found down: the next request tries once instead of a whole budget.
    with pytest.raises(fs.StorageUnavailableError, match="unreachable"):
        fs.write_bytes(url + "-2", b"y")
    assert time.monotonic() - started < 3
    time.sleep(max(0.0, 4.5 - (time.monotonic() - started)))
    assert fs.read_bytes(url) == b"x"  # back: the first success ends the short cut


def test_a_lock_written_whose_answer_was_lost_is_still_this_runs(gcs, faults):
    proxy = faults()
    url = gcs.bucket() + "/run"
    # The create-if-absent reaches the store and its answer is lost; the retried write then
    # fails its precondition (412) on the object it created itself.
    proxy.script("drop_after")
    lock = rundir.WorkdirLock(url, heartbeat_seconds=0.3, stale_after_seconds=3).acquire()
    try:
        assert json.loads(fs.read_bytes(lock.path))["pid"] == os.getpid()
        proxy.script("drop_after")  # a heartbeat too
        time.sleep(1.5)
        assert not lock.lost and proxy.counts["drop_after"] == 2
    finally:
        lock.release()
    assert objects(gcs, url) == []


def test_the_metrics_uploader_outlives_an_outage(gcs, faults, monkeypatch, caplog):
    monkeypatch.setenv(fs.RETRY_ENV, "0.5")
    proxy = faults()
    url = gcs.bucket() + "/run"
    writer = metrics_writer.MetricWriter(
        url + "/metrics.jsonl", url + "/tensorboard", upload_every_seconds=0.1
    )
    proxy.outage(2)
    with caplog.at_level(logging.WARNING, logger=metrics_writer.__name__):
        for step in range(1, 21):
            writer.write(step, {"x": float(step)})
            time.sleep(0.15)  # 3 s of steps: through the outage and after it
    writer.close()
    assert any("could not upload metrics" in r.getMessage() for r in caplog.records)
    lines = fs.read_text(url + "/metrics.jsonl").splitlines()
    assert len(lines) == 20


def test_a_checkpoint_rides_out_an_outage_within_the_budget(gcs, faults, monkeypatch):
    monkeypatch.setenv(fs.RETRY_ENV, "20")
    proxy = faults(quick_waits=True)
    url = gcs.bucket() + "/checkpoints"
    params, opt_state = {"w": jnp.arange(8.0)}, {"m": jnp.ones(3)}
    with checkpoint.Checkpointer(url, async_save=False) as checkpointer:
        proxy.outage(1, client="tensorstore")  # the arrays' writes: tensorstore's retries
        checkpointer.save(1, params=params, opt_state=opt_state, meta={}, force=True)
    assert proxy.counts["outage:tensorstore"] > 0, proxy.counts  # its retries rode it out
    step, restored, _ = checkpoint.restore_params(url)
    assert step == 1 and leaf_hashes(restored) == leaf_hashes(params)


def test_tensorstore_keeps_to_the_budget(gcs, faults, monkeypatch):
    monkeypatch.setenv(fs.RETRY_ENV, "1")
    proxy = faults()
    url = gcs.bucket() + "/checkpoints"
    params, opt_state = {"w": jnp.arange(8.0)}, {"m": jnp.ones(3)}
    checkpointer = checkpoint.Checkpointer(url, async_save=False)
    checkpointer.save(1, params=params, opt_state=opt_state, meta={}, force=True)
    proxy.outage(3600, client="tensorstore")  # left alone, it would retry for 15 minutes
    started = time.monotonic()
    with pytest.raises(checkpoint.CheckpointSaveError) as caught:
        checkpointer.save(2, params=params, opt_state=opt_state, meta={}, force=True)
    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert message.startswith(f"could not write checkpoint step 2 to {url}: "), message
    assert message.endswith("step 1 is the newest complete checkpoint there and is kept")
    assert "\n" not in message
    proxy.outage(0)
    checkpointer.close()


def test_a_checkpoint_outlasted_by_an_outage_says_what_is_kept(gcs, faults, monkeypatch):
    monkeypatch.setenv(fs.RETRY_ENV, "1")
    proxy = faults()
    url = gcs.bucket() + "/checkpoints"
    params, opt_state = {"w": jnp.arange(8.0)}, {"m": jnp.ones(3)}
    checkpointer = checkpoint.Checkpointer(url, async_save=False)
    checkpointer.save(1, params=params, opt_state=opt_state, meta={}, force=True)
    proxy.outage(3600)
    with pytest.raises(checkpoint.CheckpointSaveError) as caught:
        checkpointer.save(2, params=params, opt_state=opt_state, meta={}, force=True)
    message = str(caught.value)
    assert message.startswith(f"could not write checkpoint step 2 to {url}: "), message
    assert "\n" not in message and "no complete checkpoint" not in message
    assert message.endswith(
        "the checkpoints there could not be listed (unreachable); step 1 was complete there "
        "when this run last looked"
    ), message
    assert caught.value.last_complete_step == 1
    proxy.outage(0)
    checkpointer.close()
    assert checkpoint.restore_params(url)[0] == 1


def test_closing_after_a_failure_never_hides_it(caplog):
    closed = []

    def good():
        closed.append("good")

    def bad(name):
        def close():
            closed.append(name)
            raise fs.StorageError(f"gs://b/{name}: cannot write: GCS did not answer")

        return close

    with caplog.at_level(logging.WARNING, logger=engine_loop.__name__):
        engine_loop._close_all(bad("a"), good, bad("b"), failing=True)  # logged, not raised
        with pytest.raises(fs.StorageError, match="gs://b/c"):
            engine_loop._close_all(bad("c"), good, bad("d"), failing=False)
    assert closed == ["a", "good", "b", "c", "good", "d"]  # every closer ran
    logged = [r.getMessage() for r in caplog.records]
    assert [m.split(": ")[0] for m in logged] == ["gs://b/a", "gs://b/b", "gs://b/d"]


# ----------------------------------------------------------------------------- whole runs


@pytest.mark.slow
def test_pretraining_through_faults_is_bit_identical(gcs, synthetic_data, faults):
    data = upload(gcs, synthetic_data, gcs.bucket("data") + "/prepared")
    values = overrides(data, num_train_steps=6, checkpoint_every_steps=2)
    clean = gcs.bucket() + "/run"
    trainer.train_and_evaluate(settings_of(values), clean)

    proxy = faults(rate=0.05, seed=3)
    faulty = gcs.bucket() + "/run"
    trainer.train_and_evaluate(settings_of(values), faulty)
    faulted = sum(proxy.counts[kind] for kind in ("503", "429", "drop", "drop_after"))
    assert faulted > 0 and proxy.counts["tensorstore"] > 0, proxy.counts
    assert proxy.counts["python-gcsfs"] > 0, proxy.counts

    assert leaf_hashes(bertjax.load(faulty)[1]) == leaf_hashes(bertjax.load(clean)[1])
    assert losses(gcs, faulty) == losses(gcs, clean)
    names = objects(gcs, faulty)
    assert rundir.LOCK_FILE not in names
    assert [n for n in names if n.endswith("commit_success.txt")] == [
        n for n in objects(gcs, clean) if n.endswith("commit_success.txt")
    ]


@pytest.mark.slow
def test_finetuning_and_an_export_through_faults(gcs, pretrained_run, faults, tmp_path):
    bucket = gcs.bucket()
    init_from = upload(gcs, pretrained_run[0], bucket + "/init")
    fields = {
        "task": "classification",
        "data.train": _write_rows(bucket + "/task/train.csv", 64, 1),
        "data.validation": _write_rows(bucket + "/task/dev.csv", 32, 2),
        "data.test": _write_rows(bucket + "/task/test.csv", 8, 3),
    }
    settings = FinetuneSettings.from_config(_finetune_config(init_from, **fields))
    proxy = faults(rate=0.05, seed=4)
    workdir = bucket + "/run"
    summary = finetune_loop.finetune(settings, workdir)
    written = _objects(gcs, workdir)
    assert {"result.json", "predictions_test.tsv"} <= set(written)
    assert summary["seeds"][0]["best"]["value"] >= 0.0

    model = Model.load(workdir)
    model.save_hf(bucket + "/export")
    model.save_hf(tmp_path / "export")
    assert _objects(gcs, bucket + "/export") == _files(tmp_path / "export")
    assert sum(proxy.counts[kind] for kind in ("503", "429", "drop", "drop_after")) > 0


@pytest.mark.slow
def test_a_run_ended_by_an_outage_changes_nothing_already_written(
    gcs, pretrained_run, faults, monkeypatch
):
    """The init_from directory and an earlier run in the same bucket are byte for byte what
    they were after a fine-tuning run that an outage ended."""
    bucket = gcs.bucket()
    init_from = upload(gcs, pretrained_run[0], bucket + "/init")
    fields = {
        "task": "classification",
        "data.train": _write_rows(bucket + "/task/train.csv", 64, 1),
        "data.validation": _write_rows(bucket + "/task/dev.csv", 32, 2),
    }
    settings = FinetuneSettings.from_config(_finetune_config(init_from, **fields))
    proxy = faults()
    finetune_loop.finetune(settings, bucket + "/earlier")
    before = {url: _objects(gcs, url) for url in (init_from, bucket + "/earlier")}

    monkeypatch.setenv(fs.RETRY_ENV, "2")
    workdir = bucket + "/run"
    lock = workdir[len("gs://") :] + "/" + rundir.LOCK_FILE

    def cut_when_running():
        deadline = time.time() + 120
        while time.time() < deadline and not gcs.fs.exists(lock):
            gcs.fs.invalidate_cache()
            time.sleep(0.05)
        proxy.outage(3600)

    watcher = threading.Thread(target=cut_when_running, daemon=True)
    watcher.start()
    with pytest.raises(Exception, match=r"GCS did not answer|GCS is unreachable"):
        finetune_loop.finetune(settings, workdir)
    watcher.join()
    proxy.outage(0)
    assert proxy.counts["outage"] > 0
    assert {url: _objects(gcs, url) for url in before} == before


@pytest.mark.slow
def test_an_outage_beyond_the_budget_ends_a_run_in_one_line_and_the_rerun_resumes(
    gcs,
    synthetic_data,
    config_file,  # noqa: F811 - the fixture imported above
    straight_reference,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    values = overrides(synthetic_data, **INTERRUPTED_RUN)
    proxy = FaultProxy(gcs.url)
    try:
        cwd, cache = tmp_path / "cwd", tmp_path / "tmp"
        cwd.mkdir()
        cache.mkdir()
        # TMPDIR: where the metrics the run could not upload are kept, named in its warning.
        env = {**subprocess_env(2), **proxy.env, fs.RETRY_ENV: "3", "TMPDIR": str(cache)}
        url = gcs.bucket() + "/run"
        process = subprocess.Popen(
            cli(values, url, config_file),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        # Down from the moment step 10 is complete until the run has ended: it cannot save
        # step 20, its metrics or its lock.
        deadline = time.time() + 240
        committed = url[5:] + "/checkpoints/10/commit_success.txt"
        while process.poll() is None and time.time() < deadline:
            if gcs.fs.exists(committed):
                proxy.outage(3600)
                break
            gcs.fs.invalidate_cache()
            time.sleep(0.05)
        out, err = process.communicate(timeout=240)
        proxy.outage(0)

        assert process.returncode != 0, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: could not write checkpoint step 20 to " + url), err[-3000:]
        assert "no complete checkpoint" not in last, last
        # Whichever of its requests spent the budget first: the save's, the metrics', the lock's.
        assert "GCS did not answer" in last or "GCS is unreachable" in last, last
        assert "last error: " in last
        assert last.endswith(
            "the checkpoints there could not be listed (unreachable); step 10 was complete "
            "there when this run last looked"
        ), last
        assert "Traceback" not in err, err[-5000:]
        assert "checkpoints/10/commit_success.txt" in objects(gcs, url)
        kept = [p.name for p in cache.iterdir()]
        assert len(kept) == 1 and f"the metrics are kept in {cache / kept[0]}" in err

        rerun = subprocess.run(
            cli(values, url, config_file),
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=cwd,
        )
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "Resumed" in rerun.stdout and "step 10" in rerun.stdout
    finally:
        proxy.stop()
    assert leaf_hashes(bertjax.load(url)[1]) == straight_reference["hashes"]
    assert losses(gcs, url)[20] == straight_reference["losses"][20]
    assert list(cwd.iterdir()) == []
