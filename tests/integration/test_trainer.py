"""End-to-end pretraining: learning, exact resume, preemption, accumulation, token packing
(two processes against one: tests/integration/test_mixture_runs.py and test_gcs_run.py)."""

import json
import pathlib
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

import bertjax
from bertjax import data as data_lib
from tests.helpers.corpora import ONE_LAYER, write_corpus
from tests.helpers.gcs_run import (  # noqa: F401 (fixtures)
    INTERRUPTED_RUN,
    cli,
    config_file,
    leaf_hashes,
    overrides,
    straight_reference,
)
from tests.helpers.trainer import (
    PREDICTIONS,
    SEQ_LEN,
    _one_step,
    data_dir,  # noqa: F401 (fixtures)
    make_config,
    masking,
    read_losses,
    train,
)
from tests.helpers.xla_env import run_process, run_script, subprocess_env

# ----------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_tiny_model_learns_and_loads_in_a_notebook(data_dir, tmp_path, optimized):
    """The suite's proof that next-sentence prediction learns (the demo recipe's test,
    tests/integration/test_demo_learns.py, is the masked LM's): 150 steps on 8 devices.
    Measured: eval NSP accuracy 0.79 (0.53 at step 50, 0.63 at 100), MLM accuracy 0.188
    against 0.078 for always predicting the commonest masked token."""
    workdir = tmp_path / "run"
    config = make_config(
        data_dir,
        num_train_steps=150,
        log_every_steps=50,
        eval_every_steps=150,
        eval_batches=0,
        checkpoint_every_steps=150,
    )
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 30
    result = train(config, str(workdir))

    # Baseline: always predicting the most frequent masked token.
    loader = data_lib.make_loader(
        data_dir,
        split="eval",
        batch_size=32,
        shuffle=False,
        num_epochs=1,
        seed=config.seed,
        masking=masking(config),
    )
    ids = np.concatenate([b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in loader])
    most_common_frequency = np.bincount(ids).max() / ids.size
    assert result["steps"] == 150
    assert result["eval"]["eval/mlm_accuracy"] > 2 * most_common_frequency
    assert result["eval"]["eval/nsp_accuracy"] > 0.7

    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any("perf/tokens_per_sec" in r and r["perf/tokens_per_sec"] > 0 for r in records)
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))

    # The checkpoint was written from 8 devices; a notebook with one device opens it.
    script = (
        "import bertjax, jax, numpy as np\n"
        f"config, params, tokenizer = bertjax.load({str(workdir)!r})\n"
        "assert jax.device_count() == 1\n"
        "ids = np.array([tokenizer.encode_batch(['the big dog sees a cat.'])[0]])\n"
        "out = bertjax.BertForPreTraining(config).apply({'params': params}, ids)\n"
        "print(config.num_layers, tokenizer.vocab_size, float(np.abs(out.mlm_logits).sum()))\n"
    )
    completed = run_script(script, cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    layers, vocab, logit_sum = completed.stdout.split()
    assert int(layers) == 2
    assert int(vocab) == bertjax.Tokenizer.load(data_dir / "tokenizer.model").vocab_size
    assert np.isfinite(float(logit_sum)) and float(logit_sum) > 0


@pytest.mark.slow
def test_the_default_run_prepares_the_demo_corpus_itself(demo_run, demo_corpus):
    workdir, result, config = demo_run  # what `python train.py` runs, shortened (conftest.py)
    manifest = data_lib.read_manifest(workdir / "data")
    assert manifest["splits"]["train"]["num_instances"] > 1000
    assert list((workdir / "corpus").iterdir())
    assert manifest["settings"]["inputs"] == [str(demo_corpus)]  # the demo corpus in corpus/
    assert result["steps"] == 2 and (workdir / "checkpoints" / "2").is_dir()
    assert set(result["eval"]) == {
        "eval/mlm_loss",
        "eval/mlm_accuracy",
        "eval/nsp_loss",
        "eval/nsp_accuracy",
    }
    # The summary sets the accuracies beside what learning nothing would score ...
    assert 0 < result["baselines"]["eval/mlm_accuracy"] < 0.5
    assert 0.5 <= result["baselines"]["eval/nsp_accuracy"] < 1
    # ... and shows what the model guesses for a word hidden in held-out sentences.
    assert len(result["samples"]) == config.fill_mask_samples
    assert all("[MASK]" in line and "  ->  " in line for line in result["samples"])


# ----------------------------------------------------------------------------- resume


@pytest.mark.slow
def test_resume_after_kill_is_bit_identical(
    synthetic_data, config_file, straight_reference, tmp_path
):
    """Killed after its step-10 checkpoint, the run resumes from it and ends as the straight
    run (the one the GCS kill and outage tests compare with) did, every loss and leaf."""
    killed = tmp_path / "killed"
    values = overrides(synthetic_data, **INTERRUPTED_RUN)
    # The first evaluation (step 15) takes a moment to compile: a window after checkpoint 10
    # in which the kill lands. Evaluation does not touch the training state or its batches.
    process = subprocess.Popen(
        cli({**values, "eval_every_steps": 15}, str(killed), config_file),
        env=subprocess_env(2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint_10 = killed / "checkpoints" / "10"
    deadline = time.time() + 240
    while process.poll() is None and not checkpoint_10.is_dir() and time.time() < deadline:
        time.sleep(0.05)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert checkpoint_10.is_dir()
    # If the run finished before the kill landed, remove what a kill before step 20 would not
    # have left behind, so the resumed run always starts from step 10.
    for later in (killed / "checkpoints").glob("20*"):
        subprocess.run(["rm", "-rf", str(later)], check=True)

    completed = run_process(cli(values, str(killed), config_file))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Resumed" in completed.stdout and "step 10" in completed.stdout

    expected, resumed = straight_reference["losses"], read_losses(killed)
    assert sorted(expected) == list(range(1, 21))
    for step in range(1, 21):
        assert resumed[step] == expected[step], f"step {step}: {resumed[step]} != {expected[step]}"
    assert leaf_hashes(bertjax.load(killed)[1]) == straight_reference["hashes"]


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly_then_resumes(synthetic_data, config_file, tmp_path):
    workdir = tmp_path / "preempted"
    values = overrides(synthetic_data, num_train_steps=400, checkpoint_every_steps=1000)
    process = subprocess.Popen(
        cli(values, str(workdir), config_file),
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240
    while process.poll() is None and time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    assert "Preempted" in output
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert len(saved) == 1 and 3 <= saved[0] < 400

    completed = run_process(
        cli(dict(values, num_train_steps=saved[0] + 2), str(workdir), config_file)
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"step {saved[0]}" in completed.stdout


# ----------------------------------------------------------------------------- the step


@pytest.mark.slow  # several train steps compiled: over 20 s on two cores
def test_gradient_accumulation_equals_one_large_batch(data_dir):
    no_dropout = {"model.hidden_dropout": 0.0, "model.attention_dropout": 0.0, **ONE_LAYER}
    _, params_1, metrics_1 = _one_step(
        data_dir, make_config(data_dir, grad_accum_steps=1, **no_dropout)
    )
    _, params_4, metrics_4 = _one_step(
        data_dir, make_config(data_dir, grad_accum_steps=4, **no_dropout)
    )
    np.testing.assert_allclose(metrics_4["train/loss"], metrics_1["train/loss"], rtol=1e-5)
    np.testing.assert_allclose(
        metrics_4["train/grad_norm"], metrics_1["train/grad_norm"], rtol=1e-4
    )
    for a, b in zip(jax.tree.leaves(params_1), jax.tree.leaves(params_4)):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.fixture(scope="module")
def short_data_dir(tmp_path_factory) -> pathlib.Path:
    """Documents of two sentences: most sequences end well before SEQ_LEN."""
    root = tmp_path_factory.mktemp("short_data")
    corpus = write_corpus(root / "corpus.txt", num_documents=800, sentences_per_document=2)
    out = root / "prepared"
    data_lib.prepare(
        [str(corpus)],
        out,
        max_seq_length=SEQ_LEN,
        max_predictions_per_seq=PREDICTIONS,
        vocab_size=350,
        dupe_factor=1,
        eval_fraction=0.1,
        workers=1,
        seed=1,
    )
    return out


@pytest.mark.slow  # several train steps compiled: over 20 s on two cores
def test_token_packing_trains_like_the_padded_step(short_data_dir):
    no_dropout = {"model.hidden_dropout": 0.0, "model.attention_dropout": 0.0, **ONE_LAYER}
    config = make_config(short_data_dir, **no_dropout)
    loader = data_lib.make_loader(
        short_data_dir,
        batch_size=config.batch_size,
        seed=0,
        masking=masking(config),
    )
    mask = next(loader)["input_mask"]
    groups = jax.device_count()  # the default mesh puts every device on the batch
    slots = mask.size // groups
    needed = int(mask.reshape(groups, slots).sum(axis=1).max())
    assert needed <= slots - 16, "the test data leaves no padding to skip"
    _, plain_params, plain = _one_step(short_data_dir, config)
    assert "train/packed" not in plain
    # A capacity the batch fits in runs packed; a smaller one falls back to the padded path;
    # with two micro-batches each one decides for itself.
    for capacity, accum, packed in (
        (needed / slots, 1, {1.0}),
        ((needed - 9) / slots, 1, {0.0}),
        (needed / slots, 2, {0.0, 0.5, 1.0}),
    ):
        packed_config = make_config(
            short_data_dir, token_capacity=capacity, grad_accum_steps=accum, **no_dropout
        )
        _, params, metrics = _one_step(short_data_dir, packed_config)
        assert float(metrics["train/packed"]) in packed
        np.testing.assert_allclose(metrics["train/loss"], plain["train/loss"], rtol=1e-5)
        np.testing.assert_allclose(metrics["train/grad_norm"], plain["train/grad_norm"], rtol=1e-4)
        for a, b in zip(jax.tree.leaves(plain_params), jax.tree.leaves(params)):
            np.testing.assert_allclose(a, b, atol=1e-6)


# ----------------------------------------------------------------------------- config
