"""The GLUE suite end to end on GLUE-shaped data, from the one-layer pretrained run: each
task's metric recomputed here from the predictions its run wrote, a killed suite resumed, the
hub's parquet layout, a leaderboard submission, and a curve over pretraining checkpoints."""

import json
import math
import pathlib
import subprocess
import sys
import zipfile

import jax
import pytest

from bertjax.glue import suite
from bertjax.glue.settings import SuiteSettings
from bertjax.pretrain import loop as pretrain_loop
from bertjax.pretrain.settings import PretrainSettings
from configs import glue as glue_recipe
from configs import tiny
from tests.helpers import glue_data
from tests.helpers.corpora import ONE_LAYER
from tests.helpers.trainer import short_run_config
from tests.helpers.xla_env import run_process

REPO = pathlib.Path(__file__).resolve().parents[2]
DOWNLOAD_TASKS = ("sst2", "mrpc", "stsb", "mnli")
HUB_TASKS = ("cola", "qqp")
DEV = 16  # dev examples per file


def suite_config(init_from, data_dir, **fields):
    """configs/glue.py with a one-point sweep and one seed, sized for the one-layer model."""
    config = glue_recipe.get_config()
    config.init_from = str(init_from)
    config.data_dir = str(data_dir)
    config.seeds = (1,)
    config.sweep.learning_rate = (1e-3,)
    config.finetune.batch_size = 16
    config.finetune.eval_batch_size = 32
    config.finetune.num_epochs = 1  # what is checked is the bookkeeping, not learning
    config.finetune.log_every_steps = 5
    config.finetune.data.max_seq_length = 32
    config.update_from_flattened_dict(fields)
    return config


class Killed(Exception):
    """Stops the suite after its first run, as a kill would."""


@pytest.fixture(scope="module")
def download_suite(pretrained_run, tmp_path_factory):
    """(suite workdir, topics, summary of the resumed suite, result.json mtimes after the
    kill): GLUE's download layout, MRPC started from MNLI, a submission."""
    init_from, topics = pretrained_run
    root = tmp_path_factory.mktemp("glue")
    data = glue_data.write_download(
        root / "glue", topics, DOWNLOAD_TASKS, train=32, dev=DEV, test=8
    )
    config = suite_config(init_from, data, tasks=",".join(DOWNLOAD_TASKS), submission=True)
    config.per_task = {"mrpc": {"start_from": "mnli"}}
    settings = SuiteSettings.from_config(config)
    workdir = root / "suite"

    def kill(run):
        raise Killed(run.directory)

    with pytest.raises(Killed):
        suite.run_suite(settings, str(workdir), after_run=kill)
    stamps = {p: p.stat().st_mtime_ns for p in workdir.glob("*/*/seed_1/result.json")}
    clear_caches, cleared = jax.clear_caches, []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "clear_caches", lambda: cleared.append(clear_caches()))
        summary = suite.run_suite(settings, str(workdir))
    # Each finished run's programs are dropped before the next (run_suite says why).
    assert len(cleared) == len(summary["executed"])
    return workdir, topics, summary, stamps


CLI_FIELDS = (
    "--config.seeds=1",
    "--config.sweep.learning_rate=1e-3",
    "--config.finetune.batch_size=16",
    "--config.finetune.eval_batch_size=32",
    "--config.finetune.num_epochs=1",
    "--config.finetune.data.max_seq_length=32",
    "--config.finetune.mesh_shape=(1,1,1)",
)


def evaluate(*args: str) -> subprocess.CompletedProcess:
    """`python evaluate.py ARGS` as a user runs it."""
    return run_process([sys.executable, str(REPO / "evaluate.py"), *args], devices=1)


@pytest.fixture(scope="module")
def hub_suite(pretrained_run, tmp_path_factory):
    """(suite workdir, topics, the command's output): `python evaluate.py` on the hub's
    parquet layout, with tasks missing."""
    init_from, topics = pretrained_run
    root = tmp_path_factory.mktemp("glue_hub")
    data = glue_data.write_hub(root / "glue", topics, HUB_TASKS, train=32, dev=DEV, test=8)
    process = evaluate(
        f"--workdir={root / 'suite'}",
        f"--config.init_from={init_from}",
        f"--config.data_dir={data}",
        "--config.tasks=cola,qqp,rte",
        *CLI_FIELDS,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return root / "suite", topics, process


# ----------------------------------------------------------------------------- references
# Written from the definitions, apart from bertjax.finetune.metrics.


def accuracy(predicted, gold):
    return sum(p == g for p, g in zip(predicted, gold)) / len(gold)


def f1(predicted, gold, positive="1"):
    tp = sum(p == positive and g == positive for p, g in zip(predicted, gold))
    fp = sum(p == positive and g != positive for p, g in zip(predicted, gold))
    fn = sum(p != positive and g == positive for p, g in zip(predicted, gold))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def matthews(predicted, gold, positive="1"):
    tp = sum(p == positive and g == positive for p, g in zip(predicted, gold))
    tn = sum(p != positive and g != positive for p, g in zip(predicted, gold))
    fp = sum(p == positive and g != positive for p, g in zip(predicted, gold))
    fn = sum(p != positive and g == positive for p, g in zip(predicted, gold))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else 0.0


def ranks(values):
    """1-based ranks, tied values sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda k: values[k])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in order[start : end + 1]:
            out[k] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(x, y):
    return pearson(ranks(x), ranks(y))


REFERENCES = {
    "accuracy": accuracy,
    "f1": f1,
    "mcc": matthews,
    "pearson": pearson,
    "spearman": spearman,
    "matched_accuracy": accuracy,
    "mismatched_accuracy": accuracy,
}


def predictions(path: pathlib.Path, regression: bool) -> list:
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == [str(k) for k in range(len(rows))]  # the dev file's order
    return [float(r[1]) if regression else r[1] for r in rows]


def check_metrics(workdir: pathlib.Path, topics, task: str) -> None:
    """The task's reported figures equal the references computed from the dev predictions."""
    report = json.loads((workdir / "results.json").read_text())
    entry = report["tasks"][task]
    run_dir = workdir / entry["configurations"][0]["runs"][0]["directory"]
    regression = task == "stsb"
    for metric, value in entry["metrics"].items():
        split = 1 if metric == "mismatched_accuracy" else 0
        name = {0: "dev", 1: "dev_mismatched"}[split]
        if task == "mnli" and split == 0:
            name = "dev_matched"
        predicted = predictions(run_dir / f"predictions_{name}.tsv", regression)
        gold = glue_data.gold(task, topics, DEV, split)
        # Regression predictions are written to 6 decimals: a model that barely varies its
        # outputs (this one-layer one) loses about 1e-3 of its correlation to the rounding.
        tolerance = 2e-3 if regression else 1e-9
        assert value == pytest.approx(REFERENCES[metric](predicted, gold), abs=tolerance), metric


# ----------------------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.parametrize("task", DOWNLOAD_TASKS)
def test_each_metric_equals_a_reference_computed_from_the_written_predictions(download_suite, task):
    workdir, topics, _, _ = download_suite
    check_metrics(workdir, topics, task)


@pytest.mark.slow
def test_a_killed_suite_resumes_without_redoing_a_finished_run(download_suite):
    workdir, _, summary, stamps = download_suite
    assert len(stamps) == 1  # the kill came right after the first run
    for path, stamp in stamps.items():
        assert path.stat().st_mtime_ns == stamp
    assert summary["runs"] == len(DOWNLOAD_TASKS)
    assert len(summary["executed"]) == len(DOWNLOAD_TASKS) - 1
    first = next(iter(stamps)).parent.relative_to(workdir).as_posix()
    assert first not in summary["executed"]


@pytest.mark.slow
def test_the_table_averages_the_tasks_run_and_mrpc_starts_from_mnli(download_suite):
    workdir, _, summary, _ = download_suite
    report = json.loads((workdir / "results.json").read_text())
    assert report["average"]["tasks"] == ["sst2", "mrpc", "stsb", "mnli"]
    scores = [report["tasks"][t]["score"] for t in report["average"]["tasks"]]
    assert report["average"]["value"] == pytest.approx(sum(scores) / len(scores))
    mrpc = report["tasks"]["mrpc"]["metrics"]
    assert report["tasks"]["mrpc"]["score"] == pytest.approx((mrpc["f1"] + mrpc["accuracy"]) / 2)
    assert report["notes"] == ["mrpc starts from mnli's run mnli/learning_rate=0.001/seed_1"]
    log = next((workdir / "mrpc").glob("*/seed_1/log.txt")).read_text()
    assert "Initialised the encoder from " + str(workdir / "mnli") in log
    text = (workdir / "results.md").read_text()
    assert "| MRPC | F1 |" in text and "ELECTRA-base (dev)" in text
    assert summary["report"] == report


@pytest.mark.slow
def test_the_submission_holds_every_test_file_in_glues_spelling(download_suite):
    workdir, _, summary, _ = download_suite
    with zipfile.ZipFile(workdir / "submission.zip") as archive:
        names = sorted(archive.namelist())
        files = {name: archive.read(name).decode().splitlines() for name in names}
    assert names == sorted(
        ["SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"]
    )
    for name, lines in files.items():
        assert lines[0] == "index\tprediction"
        assert [line.split("\t")[0] for line in lines[1:]] == [str(k) for k in range(8)], name
    labels = {n: {line.split("\t")[1] for line in lines[1:]} for n, lines in files.items()}
    assert labels["MNLI-m.tsv"] | labels["AX.tsv"] <= {"entailment", "neutral", "contradiction"}
    assert labels["SST-2.tsv"] | labels["MRPC.tsv"] <= {"0", "1"}
    assert all(isinstance(float(v), float) for v in labels["STS-B.tsv"])
    assert summary["submission"]["missing"] == []


@pytest.mark.slow
def test_evaluate_py_runs_the_hubs_parquet_layout_and_skips_a_missing_task(hub_suite):
    workdir, topics, process = hub_suite
    for task in HUB_TASKS:
        check_metrics(workdir, topics, task)
    converted = (workdir / "data" / "cola" / "dev.tsv").read_text().splitlines()
    assert len(converted) == DEV  # CoLA's dev file has no header
    report = json.loads((workdir / "results.json").read_text())
    data_dir = workdir.parent / "glue"
    assert report["skipped"] == {
        "rte": f"no RTE/ (GLUE's download) or rte/ (the hub's parquet files) in {data_dir}"
    }
    assert report["average"]["missing"] == ["sst2", "mrpc", "stsb", "mnli", "qnli", "rte"]
    # The table is printed at the end, and one progress display counts the runs.
    assert process.stdout.rstrip().endswith((workdir / "results.md").read_text().rstrip())
    assert "skipped RTE: no RTE/" in process.stdout
    assert "2/2" in process.stderr and "seed 1 epoch" not in process.stdout + process.stderr
    assert "seed 1 epoch 1" in (workdir / "cola").glob("*/seed_1/log.txt").__next__().read_text()


@pytest.mark.slow
def test_evaluate_py_names_a_sweep_field_that_does_not_exist(tmp_path):
    process = evaluate(f"--workdir={tmp_path}", "--config.sweep.learnig_rate=1e-3")
    assert process.returncode == 1
    lines = process.stderr.strip().splitlines()
    assert lines == [
        f"error: config.sweep.learnig_rate is not a field of {REPO / 'configs' / 'glue.py'}; "
        "did you mean config.sweep.learning_rate?"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def three_checkpoints(synthetic_data, tmp_path_factory):
    """A one-layer pretraining run that kept its checkpoints at steps 2, 4 and 6."""
    config = short_run_config(
        tiny, synthetic_data, steps=6, batch_size=16, warmup_steps=2, log_every=2, **ONE_LAYER
    )
    config.checkpoint_every_steps = 2
    config.keep_checkpoints = 3
    workdir = tmp_path_factory.mktemp("pretrained_steps") / "run"
    pretrain_loop.train_and_evaluate(PretrainSettings.from_config(config), str(workdir))
    return workdir


@pytest.mark.slow
def test_a_curve_over_every_kept_checkpoint(three_checkpoints, pretrained_run, tmp_path):
    _, topics = pretrained_run
    data = glue_data.write_download(
        tmp_path / "glue", topics, ("sst2",), train=32, dev=DEV, ax=False
    )
    config = suite_config(three_checkpoints, data, steps="all", curve_tasks="sst2")
    summary = suite.run_suite(SuiteSettings.from_config(config), str(tmp_path / "suite"))
    curve = json.loads((tmp_path / "suite" / "curve.json").read_text())
    assert curve["steps"] == [2, 4, 6]
    for k, step in enumerate(curve["steps"]):
        report = json.loads((tmp_path / "suite" / f"step_{step}" / "results.json").read_text())
        assert report["step"] == step
        assert curve["tasks"]["sst2"][k] == pytest.approx(100 * report["tasks"]["sst2"]["score"])
    assert (tmp_path / "suite" / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "suite" / "curve.md").read_text().splitlines()[2].startswith("| 2 |")
    # Each step's runs started from that step's checkpoint: the same seed from another
    # encoder predicts other probabilities (one checkpoint for all would repeat one run).
    written = {
        (
            next((tmp_path / "suite" / f"step_{s}" / "sst2").glob("*/seed_1"))
            / "predictions_dev.tsv"
        ).read_text()
        for s in curve["steps"]
    }
    assert len(written) == 3 and summary["runs"] == 3


@pytest.mark.slow
def test_a_suite_reads_and_writes_gcs(gcs, pretrained_run, tmp_path):
    _, topics = pretrained_run
    local = glue_data.write_hub(tmp_path / "glue", topics, ("sst2",), train=32, dev=DEV, ax=False)
    data = gcs.bucket() + "/glue"
    gcs.fs.put(str(local) + "/", data[len("gs://") :], recursive=True)
    workdir = gcs.bucket() + "/suite"
    config = suite_config(pretrained_run[0], data, tasks="sst2")
    summary = suite.run_suite(SuiteSettings.from_config(config), workdir)
    gcs.fs.invalidate_cache()
    root = workdir[len("gs://") :]
    names = {name[len(root) + 1 :] for name in gcs.fs.find(root)}
    run = "sst2/learning_rate=0.001/seed_1"
    expected = {"results.json", "results.md", "data/sst2/dev.tsv", f"{run}/result.json"}
    assert expected | {f"{run}/log.txt", f"{run}/predictions_dev.tsv"} <= names
    report = json.loads(gcs.fs.cat_file(root + "/results.json"))
    assert report == summary["report"] and set(report["tasks"]) == {"sst2"}
    # Rerun: nothing to do.
    assert suite.run_suite(SuiteSettings.from_config(config), workdir)["executed"] == []
