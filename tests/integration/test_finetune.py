"""End-to-end fine-tuning from a short demo pretraining: learning, seeds, resume, every head."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import transformers

import bertjax
from bertjax.capability import HeadSpec
from bertjax.encoders.bert import hf as bert_hf
from bertjax.engine import rundir
from bertjax.engine.settings import ConfigError
from bertjax.finetune import loop, resume
from bertjax.finetune.settings import FinetuneSettings
from tests.helpers.corpora import LABELS, sentences, write_topic_csv
from tests.helpers.corpora import finetune_config as make_config
from tests.helpers.xla_env import subprocess_env

REPO = pathlib.Path(__file__).resolve().parents[2]


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
    # At least a train and an eval step, compiled or (a warm cache) loaded.
    assert seeds["programs_compiled"] + seeds["programs_loaded"] >= 2


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
    with pytest.raises(resume.HeadMismatchError, match="is a classification with 2 label"):
        finetune(config, root / "alone")
    assert sorted(p.name for p in (root / "alone" / "checkpoints").iterdir()) == before


@pytest.mark.slow
def test_batches_by_length_learn_and_resume_only_in_the_order_they_began(
    finetuned_run, pretrained_run, tmp_path
):
    root, seeds, _, _ = finetuned_run
    init_from, _ = pretrained_run
    fields = {
        "task": "classification",
        "data.train": str(root / "train.csv"),
        "data.validation": str(root / "dev.csv"),
        "num_epochs": 4,
        "optimizer.learning_rate": 1e-3,
    }
    by_length = finetune(make_config(init_from, batch_order="by_length", **fields), tmp_path)
    best = by_length["seeds"][0]["best"]
    assert best["value"] >= 0.9, best  # as the shuffled seeds (chance: about 0.5)
    assert by_length["seeds"][0]["steps"] == seeds["seeds"][0]["steps"]
    # A shuffled run's checkpoint resumes only shuffled: it keeps its files.
    before = sorted(p.name for p in (root / "alone" / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match="batch_order='shuffled', this run 'by_length'"):
        finetune(make_config(init_from, batch_order="by_length", **fields), root / "alone")
    assert sorted(p.name for p in (root / "alone" / "checkpoints").iterdir()) == before
    with pytest.raises(ConfigError, match="batch_order"):
        FinetuneSettings.from_config(make_config(init_from, batch_order="sorted", **fields))


@pytest.mark.slow
def test_a_pretraining_workdir_is_neither_overwritten_nor_a_bad_source_taken(
    pretrained_run, tmp_path
):
    init_from, topics = pretrained_run
    train = write_topic_csv(tmp_path / "train.csv", topics, 16, seed=5)
    fields = {"task": "classification", "data.train": str(train), "data.validation": str(train)}
    before = sorted(p.name for p in (init_from / "checkpoints").iterdir())
    tokenizer = (init_from / "tokenizer.model").read_bytes()
    with pytest.raises(resume.HeadMismatchError, match="not a fine-tuning run's"):
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
        bert_hf.save(config, params, tmp_path / "export", tokenizer=tokenizer)
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
