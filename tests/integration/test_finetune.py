"""End-to-end fine-tuning from a short demo pretraining: learning, seeds, resume, every head."""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from synthetic_corpus import LABELS, sentences, write_topic_csv
from synthetic_corpus import finetune_config as make_config
from xla_env import subprocess_env

import bertjax
from bertjax import hf, optim, rundir, steps
from bertjax import model as model_lib
from bertjax.capability import HeadSpec
from bertjax.finetune import loop
from bertjax.finetune.objective import build_finetuning
from bertjax.finetune.settings import FinetuneSettings
from bertjax.finetune.task import Examples
from bertjax.model import BertConfig
from bertjax.settings import ConfigError
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.qa import squad

REPO = pathlib.Path(__file__).resolve().parents[1]


def assert_trained_the_same(first, second):
    """Two (loss or losses, updated params) results agree: losses to 1e-5, params to 1e-4."""
    (loss_a, params_a), (loss_b, params_b) = first, second
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params_a, params_b
    )


def finetune(config, workdir) -> dict:
    """What finetune.py does with a config."""
    return loop.finetune(FinetuneSettings.from_config(config), workdir)


def read_metrics(workdir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_fine_tuning_learns_a_synthetic_task_well_above_chance(finetuned_run):
    root, seeds, _, _ = finetuned_run
    for result in seeds["seeds"]:
        assert result["best"]["metric"] == "eval/accuracy"
        assert result["best"]["value"] >= 0.9, result["best"]  # chance: about 0.5
    record = json.loads((root / "seeds" / "seeds.json").read_text())
    values = sorted(r["best"]["value"] for r in seeds["seeds"])
    assert record["median"] == pytest.approx(sum(values) / 2) == seeds["median"]
    assert set(record["seeds"]) == {"1", "2"}
    evals = [m for m in read_metrics(root / "seeds" / "seed_1") if "eval/accuracy" in m]
    assert [m["epoch"] for m in evals] == [1, 2, 3, 4]
    assert {"eval/loss", "eval/f1", "eval/f1_macro", "eval/mcc"} <= set(evals[0])
    # The summary says how much of the wall time went to compiling, and how many programs.
    assert 0 < seeds["compile_sec"] < seeds["wall_time_sec"]
    assert seeds["programs_compiled"] >= 2  # at least a train and an eval step


@pytest.mark.slow
def test_the_best_epoch_is_kept_and_predicts_the_test_file(finetuned_run):
    root, seeds, _, _ = finetuned_run
    workdir = root / "seeds" / "seed_1"
    best = seeds["seeds"][0]["best"]
    evals = [m for m in read_metrics(workdir) if "eval/accuracy" in m]
    assert best["value"] == max(m["eval/accuracy"] for m in evals)
    assert (workdir / rundir.BEST_CHECKPOINT_DIR / str(best["step"])).is_dir()
    lines = (workdir / "predictions_test.tsv").read_text().splitlines()
    assert lines[0] == "index\tlabel\tscore" and len(lines) == 13
    gold = [line.rsplit(",", 1)[1] for line in (root / "test.csv").read_text().splitlines()[1:]]
    predicted = [line.split("\t") for line in lines[1:]]
    assert [p[0] for p in predicted] == [str(i) for i in range(12)]
    assert all(0.5 <= float(p[2]) <= 1.0 for p in predicted)
    assert sum(p[1] == g for p, g in zip(predicted, gold)) >= 10


@pytest.mark.slow
def test_the_fine_tuned_directory_predicts_in_a_notebook(finetuned_run, tmp_path):
    root, _, _, _ = finetuned_run
    model = bertjax.Model.load(root / "alone")
    assert model.head == HeadSpec("classification", LABELS)
    texts = [line.rsplit(",", 1)[0] for line in (root / "test.csv").read_text().splitlines()[1:]]
    predictions = model.predict(texts)
    written = [
        line.split("\t")
        for line in (root / "alone" / "predictions_test.tsv").read_text().splitlines()[1:]
    ]
    assert [p["label"] for p in predictions] == [w[1] for w in written]
    np.testing.assert_allclose(
        [p["score"] for p in predictions], [float(w[2]) for w in written], atol=1e-5
    )
    # One text alone: the same label, and the same score up to float rounding (a batch of one
    # and a batch of twelve are different XLA programs, whose sums may round differently).
    alone = model.predict(texts[0])
    assert alone["label"] == predictions[0]["label"]
    assert alone["score"] == pytest.approx(predictions[0]["score"], abs=1e-6)
    with pytest.raises(bertjax.inference.InferenceError, match="no masked-LM head"):
        model.fill_mask("a [MASK] b")
    # Saved for transformers, with its labels, and back: the same predictions.
    model.save_hf(tmp_path / "export")
    hf_config = transformers.AutoConfig.from_pretrained(tmp_path / "export")
    assert hf_config.architectures == ["BertForSequenceClassification"]
    assert hf_config.id2label == dict(enumerate(LABELS))
    again = bertjax.Model.load(tmp_path / "export").predict(texts)
    assert [p["label"] for p in again] == [p["label"] for p in predictions]
    np.testing.assert_allclose(
        [p["score"] for p in again], [p["score"] for p in predictions], atol=1e-5
    )


@pytest.mark.slow
def test_a_preempted_run_resumes_to_the_same_result(finetuned_run):
    root, seeds, preempted, resumed = finetuned_run
    assert preempted["preempted"] and preempted["seeds"][0]["steps"] == 25
    alone = resumed["seeds"][0]
    assert alone["steps"] == 80 and not resumed["preempted"]
    assert alone["best"] == seeds["seeds"][0]["best"]  # as uninterrupted seed 1, exactly
    losses = {m["step"]: m["train/loss"] for m in read_metrics(root / "alone") if "train/loss" in m}
    uninterrupted = read_metrics(root / "seeds" / "seed_1")
    assert losses[80] == next(m["train/loss"] for m in uninterrupted if m["step"] == 80)


@pytest.mark.slow
def test_rerunning_with_another_task_is_refused_and_keeps_the_checkpoint(
    finetuned_run, pretrained_run, tmp_path
):
    root, _, _, _ = finetuned_run
    before = sorted(p.name for p in (root / "alone" / "checkpoints").iterdir())
    dev = tmp_path / "dev.csv"
    dev.write_text("sentence,label\n" + "\n".join(f"{w} {w},{w}" for w in "abcabcab") + "\n")
    config = make_config(
        pretrained_run[0],
        task="classification",
        **{"data.train": str(dev), "data.validation": str(dev), "batch_size": 8},
    )
    with pytest.raises(loop.HeadMismatchError, match="is a classification with 2 label"):
        finetune(config, root / "alone")
    assert sorted(p.name for p in (root / "alone" / "checkpoints").iterdir()) == before


@pytest.mark.slow
def test_a_pretraining_workdir_is_neither_overwritten_nor_a_bad_source_taken(
    pretrained_run, tmp_path
):
    init_from, topics = pretrained_run
    train = write_topic_csv(tmp_path / "train.csv", topics, 16, seed=5)
    fields = {"task": "classification", "data.train": str(train), "data.validation": str(train)}
    before = sorted(p.name for p in (init_from / "checkpoints").iterdir())
    tokenizer = (init_from / "tokenizer.model").read_bytes()
    with pytest.raises(loop.HeadMismatchError, match="not a fine-tuning run's"):
        finetune(make_config(init_from, **fields), init_from)
    assert sorted(p.name for p in (init_from / "checkpoints").iterdir()) == before
    assert (init_from / "tokenizer.model").read_bytes() == tokenizer
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ConfigError, match=r"config.init_from=.*broken': config.json: model_type"):
        finetune(make_config(broken, **fields), tmp_path / "run")


MNLI_COLUMNS = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2"


@pytest.mark.slow
def test_glue_mnli_evaluates_matched_and_mismatched_and_predicts_both_tests(
    pretrained_run, tmp_path
):
    init_from, topics = pretrained_run
    glue = tmp_path / "MNLI"
    glue.mkdir()

    def write(name, count, seed, labelled=True):
        lines = [MNLI_COLUMNS + ("\tlabel1\tgold_label" if labelled else "")]
        pairs = zip(sentences(topics, count, seed), sentences(topics, count, seed + 100))
        for k, ((t1, w1), (t2, w2)) in enumerate(pairs):
            label = "entailment" if t1 % 2 == t2 % 2 else "contradiction"
            row = f"{k}\t1\t1e\tfiction\t{' '.join(w1)}\t{' '.join(w2)}"
            lines.append(row + (f"\t{label}\t{label}" if labelled else ""))
        (glue / name).write_text("\n".join(lines) + "\n")

    write("train.tsv", 32, 1)
    write("dev_matched.tsv", 8, 2)
    write("dev_mismatched.tsv", 8, 3)
    write("test_matched.tsv", 4, 4, labelled=False)
    write("test_mismatched.tsv", 5, 5, labelled=False)
    config = make_config(
        init_from, num_epochs=1, **{"data.glue_task": "mnli", "data.dir": str(glue)}
    )
    summary = finetune(config, tmp_path / "run")

    best = summary["seeds"][0]["best"]
    assert best["metric"] == "eval_matched/accuracy"
    assert {"eval_matched/accuracy", "eval_mismatched/accuracy", "eval_mismatched/loss"} <= set(
        best["scores"]
    )
    for name, count in (("test_matched", 4), ("test_mismatched", 5)):
        lines = (tmp_path / "run" / f"predictions_{name}.tsv").read_text().splitlines()
        assert len(lines) == 1 + count
        assert {line.split("\t")[1] for line in lines[1:]} <= {
            "contradiction", "entailment", "neutral"
        }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("task", ["token_classification", "regression", "multi_label"])
def test_every_head_fine_tunes_and_predicts(pretrained_run, tmp_path, task):
    init_from, topics = pretrained_run
    train, dev, test = (tmp_path / f"{name}" for name in ("train", "dev", "test"))
    fields = {"task": task, "num_epochs": 1, "optimizer.learning_rate": 1e-3}
    if task == "token_classification":
        # Words of topic 0 are entities of type A in sentences that mix topics 0 and 1.
        def conll(count, seed, tagged=True):
            blocks = []
            for _, words in sentences(topics, count, seed):
                mixed = [(w, "B-A") for w in topics[0][:3]] + [(w, "O") for w in words]
                rng = np.random.default_rng(seed + len(blocks))
                lines = [f"{w} {t}" if tagged else w for w, t in rng.permutation(mixed)]
                blocks.append("\n".join(lines))
            return "\n\n".join(blocks) + "\n"

        for path, count, seed in ((train, 48, 1), (dev, 16, 2)):
            path.with_suffix(".conll").write_text(conll(count, seed))
        test.with_suffix(".conll").write_text(conll(4, 3, tagged=False))
        suffix = ".conll"
    else:
        rows = {}
        for path, count, seed in ((train, 48, 1), (dev, 16, 2), (test, 4, 3)):
            lines = []
            for topic, words in sentences(topics, count, seed):
                if task == "regression":
                    label = str(topic / 3)
                else:
                    label = json.dumps(["even" if topic % 2 == 0 else "odd", f"t{topic // 2}"])
                lines.append(json.dumps({"sentence": " ".join(words), "label": json.loads(label)}))
            rows[path] = lines
            path.with_suffix(".jsonl").write_text("\n".join(lines) + "\n")
        suffix = ".jsonl"
    for name, path in (("train", train), ("validation", dev), ("test", test)):
        fields[f"data.{name}"] = str(path.with_suffix(suffix))
    if task == "multi_label":  # from a transformers export of the pretrained model this time
        config, params, tokenizer = bertjax.load(init_from)
        hf.save(config, params, tmp_path / "export", tokenizer=tokenizer)
        init_from = tmp_path / "export"
    summary = finetune(make_config(init_from, **fields), tmp_path / "run")

    result = summary["seeds"][0]
    expected_metric = {"token_classification": "f1", "regression": "pearson"}.get(task, "f1_micro")
    assert result["best"]["metric"] == f"eval/{expected_metric}"
    assert np.isfinite(result["best"]["value"]) and result["steps"] == 3
    lines = (tmp_path / "run" / "predictions_test.tsv").read_text().splitlines()
    assert len(lines) == 5
    model = bertjax.Model.load(tmp_path / "run")
    if task == "token_classification":
        assert lines[0] == "index\tlabel\tscore"
        sentences_ = [b.split() for b in test.with_suffix(suffix).read_text().split("\n\n")]
        tags = lines[1].split("\t")[1].split(" ")
        assert len(tags) == len(sentences_[0]) and set(tags) <= {"B-A", "O"}
        predicted = model.predict(" ".join(sentences_[0]))
        assert [p["word"] for p in predicted] == sentences_[0]
        assert [p["label"] for p in predicted] == tags
        scores = [float(x) for x in lines[1].split("\t")[2].split(" ")]
        np.testing.assert_allclose([p["score"] for p in predicted], scores, atol=1e-5)
    else:
        texts = [
            json.loads(line)["sentence"]
            for line in test.with_suffix(suffix).read_text().splitlines()
        ]
        predicted = model.predict(texts)
        if task == "regression":
            assert lines[0] == "index\tprediction"
            values = [float(line.split("\t")[1]) for line in lines[1:]]
            np.testing.assert_allclose([p["score"] for p in predicted], values, atol=1e-5)
            assert {p["label"] for p in predicted} == {"score"}
        else:
            for line, labels in zip(lines[1:], predicted):
                _, names, scores = (line.split("\t") + [""])[:3]
                assert set(filter(None, names.split(","))) == {x["label"] for x in labels}
                assert all(x["score"] >= 0.5 for x in labels)
                assert set(names.split(",")) <= {"", "even", "odd", "t0", "t1"}


def small_config(positions: int) -> BertConfig:
    """A one-layer BERT without dropout, for exact comparisons of train steps."""
    return BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        intermediate_size=64,
        max_position_embeddings=positions,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def test_sharded_steps_equal_data_parallel_ones():
    config = small_config(16)
    head = HeadSpec(label_heads.CLASSIFICATION, ("a", "b", "c"))
    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(5, 64, size=(16, 16)).astype(np.int32),
        "input_mask": np.ones((16, 16), np.int32),
        "segment_ids": np.zeros((16, 16), np.int32),
        "labels": rng.integers(0, 3, size=16).astype(np.int32),
        "weights": np.ones(16, np.float32),
    }
    results = []
    # Data parallel; then FSDP x tensor x data with two accumulated micro-batches.
    for mesh_shape, accumulate in (((8, 1, 1), 1), ((2, 2, 2), 2)):
        ft = build_finetuning(
            config,
            head,
            optimizer,
            mesh_shape=mesh_shape,
            grad_accum_steps=accumulate,
            micro_batch_size=16 // accumulate,
            max_seq_length=16,
        )
        with jax.set_mesh(ft.mesh):
            state = ft.state.init(jax.random.key(0))
            losses = []
            for _ in range(2):
                global_batch = steps.global_batch(batch, ft.batch_sharding, 1)
                state, metrics = ft.train_step(state, global_batch, jax.random.key(1))
                losses.append(float(metrics["train/loss"]))
            results.append((losses, jax.device_get(state.params)))
        if mesh_shape == (2, 2, 2):
            kernel = ft.state.shardings.params["classifier"]["kernel"]
            assert kernel.spec == jax.sharding.PartitionSpec("fsdp", None)
    assert_trained_the_same(*results)


@pytest.mark.slow
def test_bad_input_ends_the_command_in_one_line_naming_file_and_line(pretrained_run, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\nthe cat,yes\nthe dog,no\n")
    dev = tmp_path / "dev.csv"
    dev.write_text("sentence,label\nthe cat,yes\nthe mat,maybe\n")
    env = subprocess_env(1)
    process = subprocess.run(
        [
            sys.executable,
            str(REPO / "finetune.py"),
            f"--workdir={tmp_path / 'run'}",
            f"--config.init_from={pretrained_run[0]}",
            "--config.task=classification",
            f"--config.data.train={train}",
            f"--config.data.validation={dev}",
            "--config.batch_size=2",
            "--config.eval_batch_size=2",
            "--config.mesh_shape=(1,1,1)",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert process.returncode != 0
    assert "Traceback" not in process.stderr
    last = process.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: {dev} line 3: label 'maybe' never appears in the training data {train} "
        "(its labels: no, yes)"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("task", [label_heads.CLASSIFICATION, label_heads.TOKEN_CLASSIFICATION])
def test_length_buckets_cut_only_padding_and_train_the_same(task):
    config = small_config(32)
    head = HeadSpec(task, ("a", "b", "c"))
    rng = np.random.default_rng(0)
    count, seq = 16, 32
    lengths = rng.integers(3, 14, size=count)  # the longest, 13 or less, fits 16 positions
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    labels = rng.integers(0, 3, size=count).astype(np.int32)
    if task == label_heads.TOKEN_CLASSIFICATION:
        labels = np.where(
            mask == 1, rng.integers(0, 3, size=(count, seq)), label_heads.IGNORE_LABEL
        )
    features = {
        "input_ids": (rng.integers(5, 64, size=(count, seq)) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((count, seq), np.int32),
        "labels": labels.astype(np.int32),
    }
    word_positions = (
        [np.arange(n) for n in lengths] if task == label_heads.TOKEN_CLASSIFICATION else None
    )
    examples = Examples(
        "train", "synthetic", features, [str(i) for i in range(count)], True, word_positions
    )
    order = loop.epoch_order(0, 0, count)
    full = loop.train_batch(examples, order, 0, count)
    cut = loop.train_batch(examples, order, 0, count, length_bucket=8)
    assert full["input_ids"].shape == (count, seq)
    assert cut["input_ids"].shape == cut["input_mask"].shape == (count, 16)
    assert cut["labels"].shape == ((count, 16) if word_positions else (count,))
    assert cut["input_mask"].sum() == full["input_mask"].sum()  # only padding was cut

    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    # Packing slots (half of 32 positions) that the full batch packs into and the cut one,
    # with no more positions than that, runs without.
    ft = build_finetuning(
        config,
        head,
        optimizer,
        mesh_shape=(8, 1, 1),
        grad_accum_steps=1,
        micro_batch_size=count,
        max_seq_length=seq,
        token_capacity=0.5,
    )
    results = []
    with jax.set_mesh(ft.mesh):
        for batch in (full, cut):
            state = ft.state.init(jax.random.key(0))
            global_batch = steps.global_batch(batch, ft.batch_sharding, 1)
            state, metrics = ft.train_step(state, global_batch, jax.random.key(1))
            assert float(metrics["train/packed"]) == 1.0
            results.append((float(metrics["train/loss"]), jax.device_get(state.params)))
    assert_trained_the_same(*results)


@pytest.mark.parametrize("shards, accumulate", [(1, 1), (4, 2)])
def test_the_capacity_chosen_from_the_data_fits_every_batch_exactly(shards, accumulate):
    rng = np.random.default_rng(3)
    count, seq, batch_size = 100, 24, 16
    lengths = rng.integers(3, seq + 1, size=count)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    features = {"input_mask": mask, "labels": np.zeros(count, np.int32)}
    examples = Examples("train", "synthetic", features, [""] * count, True)
    seeds, epochs = (1, 2), 3
    capacity = loop.fitting_capacity(examples, seeds, epochs, batch_size, accumulate, shards)
    slots = batch_size // accumulate // shards * seq
    # What the train step counts: real tokens per batch shard of every micro-batch.
    fullest = 0
    for seed in seeds:
        for epoch in range(epochs):
            order = loop.epoch_order(seed, epoch, count)
            for index in range(count // batch_size):
                rows = order[index * batch_size : (index + 1) * batch_size]
                for micro in steps.split_micro_batches(mask[rows], accumulate):
                    per_shard = model_lib.tokens_per_group(jnp.asarray(micro), shards)
                    fullest = max(fullest, int(per_shard.max()))
    assert fullest == round(capacity * slots)
    assert 0 < capacity < 1


def _uneven_examples(task: str, count: int, seq: int, longest: int, seed: int = 0) -> Examples:
    """Examples of lengths 3 to `longest` for a label task or question answering."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, longest + 1, size=count)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    features = {
        "input_ids": (rng.integers(5, 64, size=(count, seq)) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((count, seq), np.int32),
    }
    word_positions = None
    if task == squad.TASK:
        starts = (rng.random(count) * (lengths - 1)).astype(np.int32)
        features["start_positions"] = starts
        features["end_positions"] = np.minimum(starts + 1, lengths - 1).astype(np.int32)
    elif task == label_heads.TOKEN_CLASSIFICATION:
        labels = np.where(
            mask == 1, rng.integers(0, 3, size=(count, seq)), label_heads.IGNORE_LABEL
        )
        features["labels"] = labels.astype(np.int32)
        word_positions = [np.arange(n) for n in lengths]
    else:
        features["labels"] = rng.integers(0, 3, size=count).astype(np.int32)
    return Examples(
        "train", "synthetic", features, [str(i) for i in range(count)], True, word_positions
    )


def _head(task: str) -> HeadSpec:
    return HeadSpec(task, squad.HEAD_LABELS if task == squad.TASK else ("a", "b", "c"))


@pytest.mark.parametrize(
    "task", [label_heads.CLASSIFICATION, label_heads.TOKEN_CLASSIFICATION, squad.TASK]
)
def test_micro_batches_grouped_by_length_take_the_one_batch_update(task):
    count, seq, groups = 32, 48, 4
    examples = _uneven_examples(task, count, seq, longest=seq - 1)
    order = loop.epoch_order(0, 0, count)
    lengths = examples.features["input_mask"].sum(axis=1)
    micro_batches = loop.train_micro_batches(examples, order, 0, count, groups, length_bucket=8)
    # Every example once, the shortest together, each micro-batch cut to its own bucket.
    held = [micro["input_mask"].sum(axis=1) for micro in micro_batches]
    assert sorted(np.concatenate(held)) == sorted(lengths)
    assert all(a.max() <= b.min() for a, b in zip(held, held[1:]))
    for micro, real in zip(micro_batches, held):
        assert micro["input_ids"].shape == (count // groups, -(-real.max() // 8) * 8)
    assert len({micro["input_ids"].shape for micro in micro_batches}) > 1

    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    results = []
    for accumulate in (1, groups):
        ft = build_finetuning(
            small_config(seq),
            _head(task),
            optimizer,
            mesh_shape=(8, 1, 1),
            grad_accum_steps=accumulate,
            micro_batch_size=count // accumulate,
            max_seq_length=seq,
        )
        with jax.set_mesh(ft.mesh):
            state = ft.state.init(jax.random.key(0))
            losses = []
            for _ in range(2):  # the second step starts from the first's optimizer state
                if accumulate == 1:
                    batch = loop.train_batch(examples, order, 0, count)
                else:
                    batch = micro_batches
                state, metrics = ft.steps.take_step(state, batch, jax.random.key(1))
                losses.append(float(metrics["train/loss"]))
            params = jax.device_get(state.params)
            if task == squad.TASK:
                # The start and end biases' gradient is zero (a softmax's probabilities sum
                # to one): Adam scales its float noise up to updates of about lr / 100.
                del params[squad.HEAD_NAME]["bias"]
            results.append((losses, params))
    assert_trained_the_same(*results)


@pytest.mark.parametrize(
    "task", [label_heads.CLASSIFICATION, label_heads.TOKEN_CLASSIFICATION, squad.TASK]
)
def test_evaluation_grouped_by_length_gives_every_example_its_full_length_outputs(task):
    count, seq = 21, 48  # the last batch of 8 is part filler
    examples = _uneven_examples(task, count, seq, longest=30, seed=1)
    optimizer = optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, total_steps=4)
    ft = build_finetuning(
        small_config(seq),
        _head(task),
        optimizer,
        mesh_shape=(8, 1, 1),
        grad_accum_steps=1,
        micro_batch_size=8,
        max_seq_length=seq,
    )
    with jax.set_mesh(ft.mesh):
        params = ft.state.init(jax.random.key(0)).params
        sums, outputs = loop.run_eval(ft, params, examples, 8, length_bucket=8)
        # The reference: every example at full length, in order, in one batch.
        batch = dict(examples.features, weights=np.ones(count, np.float32))
        batch = {k: np.concatenate([v, v[:3]]) for k, v in batch.items()}  # 24 rows
        batch["weights"][count:] = 0.0
        if examples.word_positions is not None:  # token labels count unless ignored
            batch["labels"][count:] = label_heads.IGNORE_LABEL
        expected_sums, expected = ft.eval_step(
            params, steps.global_batch(batch, ft.batch_sharding, 1)
        )
    expected = {k: np.asarray(v)[:count] for k, v in expected.items()}
    assert set(outputs) == set(expected)
    lengths = examples.features["input_mask"].sum(axis=1)
    never_read = -(-lengths.max() // 8) * 8  # no batch keeps positions from here on
    assert never_read < seq
    for name, value in outputs.items():
        assert value.shape == expected[name].shape
        if name in ft.objective.position_outputs:
            for row, n in enumerate(lengths):  # at real positions the outputs agree
                np.testing.assert_allclose(value[row, :n], expected[name][row, :n], atol=1e-5)
            lowest = np.finfo if value.dtype.kind == "f" else np.iinfo
            assert (value[:, never_read:] == lowest(value.dtype).min).all()
        else:
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5),
        sums,
        jax.device_get(expected_sums),
    )
