"""The GLUE suite's pure parts: the task table, config validation, the plan, medians and the
best configuration, the average, results files, both data layouts and their bad inputs,
the curve."""

import dataclasses
import json

import ml_collections
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax.engine.settings import ConfigError
from bertjax.finetune import glue_tasks
from bertjax.finetune.data import TaskDataError, read_split
from bertjax.glue import curve, files, published, results, suite
from bertjax.glue.settings import ALL_STEPS, SuiteSettings
from configs import glue as glue_recipe
from configs import glue_modernbert
from tests.helpers import glue_data

TOPICS = {t: [f"w{t}a", f"w{t}b", f"w{t}c"] for t in range(8)}


# ----------------------------------------------------------------------------- the table


def test_every_glue_task_is_in_the_table_with_the_papers_metrics():
    metrics = {t.name: [m.name for m in t.metrics] for t in glue_tasks.GLUE_TASKS.values()}
    assert metrics["cola"] == ["mcc"]
    assert metrics["mrpc"] == metrics["qqp"] == ["f1", "accuracy"]
    assert metrics["stsb"] == ["pearson", "spearman"]
    assert metrics["mnli"] == ["matched_accuracy", "mismatched_accuracy"]
    assert all(metrics[t] == ["accuracy"] for t in ("sst2", "qnli", "rte", "wnli"))
    assert glue_tasks.GLUE_TASKS["mnli"].metrics[1].key == "eval_mismatched/accuracy"
    assert glue_tasks.GLUE_TASKS["mnli"].selection_key == "eval_matched/accuracy"
    assert glue_tasks.GLUE_TASKS["stsb"].selection_key == "eval/spearman"
    assert glue_tasks.DEFAULT_TASKS == tuple("cola sst2 mrpc stsb qqp mnli qnli rte".split())
    mnli = glue_tasks.GLUE_TASKS["mnli"]
    assert [m.label for m in mnli.metrics] == ["m Acc", "mm Acc"]
    assert [m.label for m in glue_tasks.GLUE_TASKS["stsb"].metrics] == ["Pearson", "Spearman"]
    # The hub's label ids and text columns, where they are not GLUE's TSV files'.
    assert mnli.hub_labels == ("entailment", "neutral", "contradiction")
    assert mnli.hub_text_columns == ("premise", "hypothesis")
    assert glue_tasks.GLUE_TASKS["rte"].hub_labels == ("entailment", "not_entailment")
    assert glue_tasks.GLUE_TASKS["stsb"].hub_labels is None
    assert glue_tasks.glue_task("sts-b") is glue_tasks.GLUE_TASKS["stsb"]
    files_ = [f for t in glue_tasks.GLUE_TASKS.values() for _, f in t.submission]
    assert "MNLI-m.tsv" in files_ and "MNLI-mm.tsv" in files_ and len(set(files_)) == 10


def test_task_names_parse_in_the_tables_order_with_glues_spellings():
    assert glue_tasks.parse_names("RTE, SST-2,sts-b,wnli") == ("sst2", "stsb", "rte", "wnli")
    with pytest.raises(ValueError, match="'colaa' is not a GLUE task"):
        glue_tasks.parse_names("colaa")


# ----------------------------------------------------------------------------- settings


def config_for(tmp_path, **fields):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "glue").mkdir(exist_ok=True)
    config = glue_recipe.get_config()
    config.init_from = str(tmp_path / "model")
    config.data_dir = str(tmp_path / "glue")
    config.update_from_flattened_dict(fields)
    return config


def test_berts_recipe_sweeps_four_learning_rates_over_every_task(tmp_path):
    settings = SuiteSettings.from_config(config_for(tmp_path))
    assert settings.tasks == glue_tasks.DEFAULT_TASKS and settings.seeds == (1, 2, 3)
    plan = settings.plans["rte"]
    assert plan.sweep == (("optimizer.learning_rate", (5e-5, 4e-5, 3e-5, 2e-5)),)
    assert settings.finetune["batch_size"] == 32 and settings.finetune["num_epochs"] == 3
    runs = suite.plan(settings, ("cola", "rte"), [None])
    assert len(runs) == 2 * 4 * 3
    assert runs[0].directory == "cola/learning_rate=5e-05/seed_1"
    assert runs[-1].directory == "rte/learning_rate=2e-05/seed_3"


def test_modernberts_recipe_starts_rte_mrpc_and_stsb_after_mnli(tmp_path):
    config = glue_modernbert.get_config()
    config.init_from, config.data_dir = config_for(tmp_path).init_from, str(tmp_path / "glue")
    settings = SuiteSettings.from_config(config)
    assert {t for t, p in settings.plans.items() if p.start_from == "mnli"} == {
        "rte",
        "mrpc",
        "stsb",
    }
    assert suite.order_tasks(settings, settings.tasks)[-3:] == ["mrpc", "stsb", "rte"]
    rte = dict(settings.plans["rte"].sweep)
    # Composer's decoupled decay 1e-5 at learning rate 1e-5 is AdamW's 1.0.
    assert rte == {
        "optimizer.learning_rate": (1e-5,),
        "optimizer.weight_decay": (1.0,),
        "num_epochs": (3,),
    }
    assert dict(settings.plans["rte"].fields) == {"batch_size": 16}


def test_a_task_sweep_replaces_the_shared_one_and_points_multiply(tmp_path):
    config = config_for(tmp_path)
    config.per_task = ml_collections.ConfigDict(
        {"cola": {"sweep": {"learning_rate": (1e-5,), "num_epochs": (2, 3)}}}
    )
    plan = SuiteSettings.from_config(config).plans["cola"]
    assert plan.configurations() == [
        (("optimizer.learning_rate", 1e-5), ("num_epochs", 2)),
        (("optimizer.learning_rate", 1e-5), ("num_epochs", 3)),
    ]
    assert suite.configuration_name(plan.configurations()[1]) == "learning_rate=1e-05,num_epochs=3"


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"sweep.learning_rat": (1e-5,)},
            "config.sweep.learning_rat: 'learning_rat' is not a field of the fine-tuning "
            "config (configs/finetune.py); did you mean 'optimizer.learning_rate'?",
        ),
        (
            {"sweep.seeds": (1, 2)},
            "config.sweep.seeds: each run's seeds comes from config.seeds",
        ),
        ({"tasks": "cola,mnlii"}, "config.tasks='cola,mnlii': 'mnlii' is not a GLUE task"),
        ({"seeds": (1, 1)}, "config.seeds=(1, 1): must be distinct integers >= 0"),
        ({"steps": "1000,x"}, "config.steps='1000,x': must be checkpoint steps"),
        ({"init_from": ""}, "config.init_from='': set it to the model to evaluate"),
        ({"sweep.learning_rate": ()}, "config.sweep.learning_rate=(): give at least one value"),
        (
            {"submission": True, "steps": "10"},
            "config.submission=True: predicts with one model's runs; leave config.steps empty",
        ),
    ],
)
def test_a_bad_suite_field_is_one_line_naming_it(tmp_path, fields, message):
    config = config_for(tmp_path)
    for field, value in fields.items():
        *parents, name = field.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        with node.ignore_type():
            node[name] = value
    with pytest.raises(ConfigError) as caught:
        SuiteSettings.from_config(config)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_per_task_entries_are_checked(tmp_path):
    config = config_for(tmp_path)
    config.per_task = ml_collections.ConfigDict({"rte": {"start_from": "rte"}})
    with pytest.raises(ConfigError, match=r"per_task.rte.start_from='rte': must be another"):
        SuiteSettings.from_config(config)
    config.per_task = ml_collections.ConfigDict({"mnlx": {}})
    with pytest.raises(ConfigError, match="config.per_task.mnlx: not a GLUE task"):
        SuiteSettings.from_config(config)
    config.per_task = ml_collections.ConfigDict({"rte": {"sweeps": {}}})
    with pytest.raises(ConfigError, match=r"unknown entries \['sweeps'\]"):
        SuiteSettings.from_config(config)


def test_steps_read_as_a_list_or_all(tmp_path):
    assert SuiteSettings.from_config(config_for(tmp_path, steps="30,10")).steps == (10, 30)
    assert SuiteSettings.from_config(config_for(tmp_path, steps="all")).steps == ALL_STEPS
    (tmp_path / "model" / "checkpoints" / "10").mkdir(parents=True)
    settings = SuiteSettings.from_config(config_for(tmp_path, steps="10,20"))
    with pytest.raises(ConfigError, match=r"config.steps: \[20\] not among the checkpoints"):
        suite.resolve_steps(settings)


def test_a_run_is_one_fine_tuning_config_that_predicts_the_dev_files(tmp_path):
    root = glue_data.write_download(tmp_path / "glue", TOPICS, ("mnli",), 8, 4, 4, ax=False)
    config = config_for(tmp_path, data_dir=str(root))
    config.per_task = ml_collections.ConfigDict({"mnli": {"fields": {"max_seq_length": 64}}})
    settings = SuiteSettings.from_config(config)
    run = suite.plan(settings, ("mnli",), [20])[-1]
    assert run.directory == "step_20/mnli/learning_rate=2e-05/seed_3"
    finetune = suite.run_settings(
        suite.run_config(settings, run, str(root / "MNLI"), settings.init_from), run.step
    )
    assert finetune.init_step == 20 and finetune.run.seeds == (3,)
    assert finetune.optimizer.learning_rate == 2e-5 and finetune.run.batch_size == 32
    assert finetune.data.max_seq_length == 64 and finetune.data.glue_task == "mnli"
    assert finetune.data.test == (
        ("dev_matched", str(root / "MNLI" / "dev_matched.tsv")),
        ("dev_mismatched", str(root / "MNLI" / "dev_mismatched.tsv")),
    )
    bad = dataclasses.replace(run, values=(("num_epochs", 2.5),))
    with pytest.raises(ConfigError, match=r"^mnli: fine-tuning field num_epochs=2.5: "):
        suite.run_config(settings, bad, str(root / "MNLI"), settings.init_from)


# ----------------------------------------------------------------------------- results


def runs(task, figures):
    """ConfigurationRuns from {configuration: [(seed, {metric key: value})]}."""
    return [
        results.ConfigurationRuns(
            name,
            {"optimizer.learning_rate": name},
            [results.RunScores(seed, f"{task}/{name}/seed_{seed}", s, 1) for seed, s in seeds],
        )
        for name, seeds in figures.items()
    ]


def test_the_best_configuration_by_its_median_over_seeds_keeps_every_run():
    mrpc = glue_tasks.GLUE_TASKS["mrpc"]

    def scores(f1, accuracy):
        return {"eval/f1": f1, "eval/accuracy": accuracy}

    entry = results.task_result(
        mrpc,
        runs(
            "mrpc",
            {
                # One lucky seed: its mean is the highest, its median is not.
                "a": [(1, scores(0.95, 0.9)), (2, scores(0.5, 0.5)), (3, scores(0.6, 0.55))],
                "b": [(1, scores(0.8, 0.7)), (2, scores(0.7, 0.65)), (3, scores(0.75, 0.8))],
            },
        ),
    )
    assert entry["configuration"] == "b"
    assert entry["metrics"] == {"f1": 0.75, "accuracy": 0.7}  # medians per metric
    assert entry["score"] == pytest.approx(0.725)
    assert [len(c["runs"]) for c in entry["configurations"]] == [3, 3]
    assert results.median_run(entry) == "mrpc/b/seed_3"  # f1 0.75 is the middle seed


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=6))
def test_the_median_run_holds_the_median_selection(values):
    sst2 = glue_tasks.GLUE_TASKS["sst2"]
    entry = results.task_result(
        sst2, runs("sst2", {"x": [(s, {"eval/accuracy": v}) for s, v in enumerate(values)]})
    )
    chosen = results.median_run(entry)
    value = next(
        r["selection"] for r in entry["configurations"][0]["runs"] if r["directory"] == chosen
    )
    ordered = sorted(values)
    assert value == ordered[(len(values) - 1) // 2]
    assert entry["metrics"]["accuracy"] == pytest.approx(
        (ordered[(len(values) - 1) // 2] + ordered[len(values) // 2]) / 2
    )


def test_ties_go_to_the_first_configuration_of_the_sweep():
    rte = glue_tasks.GLUE_TASKS["rte"]
    entry = results.task_result(
        rte, runs("rte", {"a": [(1, {"eval/accuracy": 0.6})], "b": [(1, {"eval/accuracy": 0.6})]})
    )
    assert entry["configuration"] == "a"


def fake_results():
    """Task entries with given scores (only what glue_average and markdown read)."""
    out = {}
    for task, value in (("cola", 0.5), ("mnli", 0.8), ("stsb", 0.9), ("wnli", 0.1)):
        t = glue_tasks.GLUE_TASKS[task]
        out[task] = {
            "task": task,
            "title": t.title,
            "metrics": {m.name: value for m in t.metrics},
            "score": value,
            "configuration": "learning_rate=2e-05",
            "seeds": 3,
            "selection_metric": t.selection_key,
            "configurations": [
                {"name": "learning_rate=2e-05", "medians": {m.name: value for m in t.metrics}}
            ],
        }
    return out


def test_the_average_leaves_wnli_out_and_names_what_is_missing():
    average = results.glue_average(fake_results())
    assert average["tasks"] == ["cola", "stsb", "mnli"]
    assert average["value"] == pytest.approx((0.5 + 0.9 + 0.8) / 3)
    assert average["missing"] == ["sst2", "mrpc", "qqp", "qnli", "rte"]


def test_results_files_put_our_row_beside_the_published_ones():
    report = results.report(
        fake_results(), init_from="runs/base", step=None, skipped={"qqp": "no QQP/"}, notes=[]
    )
    text = results.markdown(report)
    assert "| CoLA | MCC | 50.0 | 52.1 | 60.5 | 63.6 | 67.7 |  |  |" in text
    assert "| MNLI | mm Acc | 80.0 | 83.4 | 85.9 |  |  |  |  |" in text
    assert "| **Average** |  | 73.3 (3 of 8 tasks) | 79.6 | 82.1 |  |  | 88.4 | 90.4 |" in text
    assert "- qqp: no QQP/" in text
    assert all(row.source in text for row in published.ROWS)
    assert json.loads(results.dumps(report))["average"]["tasks"] == ["cola", "stsb", "mnli"]


def test_published_rows_name_glue_tasks_and_metrics_and_their_source():
    for row in published.ROWS:
        assert row.source and row.split in ("dev", "test")
        for task, metric in row.scores:
            assert metric in [m.name for m in glue_tasks.GLUE_TASKS[task].metrics], (
                row.model,
                task,
            )
    # BERT's published average is over the nine numbers of Table 1 (MNLI-m and -mm apart).
    bert = published.ROWS[0]
    assert sum(bert.scores.values()) / len(bert.scores) == pytest.approx(bert.average, abs=0.05)


# ----------------------------------------------------------------------------- data


def test_the_hubs_parquet_files_become_glues_tsv_files(tmp_path):
    root = glue_data.write_hub(tmp_path / "hub", TOPICS, ("cola", "mnli", "stsb"), 12, 8, 4)
    cache = tmp_path / "cache"
    found = files.locate(str(root), glue_tasks.GLUE_TASKS["mnli"], str(cache))
    assert found.tests == ("test_matched", "test_mismatched")
    glue = glue_tasks.GLUE_TASKS["mnli"]
    dev = read_split(cache / "mnli" / "dev_mismatched.tsv", glue.validation[1][1].layout, "v", True)
    assert [r.label for r in dev.records] == glue_data.gold("mnli", TOPICS, 8, split=1)
    assert [r.texts for r in dev.records][0] == tuple(
        glue_data.examples("mnli", TOPICS, 8, 3)[0][1:3]
    )
    test = read_split(cache / "mnli" / "test_matched.tsv", glue.test[0][1].layout, "t", False)
    assert [r.index for r in test.records] == ["0", "1", "2", "3"]
    cola = files.locate(str(root), glue_tasks.GLUE_TASKS["cola"], str(cache))
    files.check_labels(cola)
    cola_dev = read_split(
        cache / "cola" / "dev.tsv", glue_tasks.GLUE_TASKS["cola"].validation[0][1].layout, "v", True
    )
    assert [r.label for r in cola_dev.records] == glue_data.gold("cola", TOPICS, 8)
    stsb = files.locate(str(root), glue_tasks.GLUE_TASKS["stsb"], str(cache))
    assert (
        (cache / "stsb" / "dev.tsv")
        .read_text()
        .splitlines()[1]
        .endswith(str(glue_data.gold("stsb", TOPICS, 8)[0]))
    )
    # Converted once: a second look reuses the files.
    stamp = (cache / "stsb" / "train.tsv").stat().st_mtime_ns
    assert files.locate(str(root), glue_tasks.GLUE_TASKS["stsb"], str(cache)) == stsb
    assert (cache / "stsb" / "train.tsv").stat().st_mtime_ns == stamp
    assert files.locate(str(root), glue_tasks.GLUE_TASKS["rte"], str(cache)) is None


def test_the_diagnostic_set_is_found_in_either_layout(tmp_path):
    hub = glue_data.write_hub(tmp_path / "hub", TOPICS, (), 8, 4, 4)
    path = files.locate_ax(str(hub), str(tmp_path / "cache"))
    lines = open(path).read().splitlines()
    rows = glue_data.examples("mnli", TOPICS, 4, 20)
    assert lines == ["index\tsentence1\tsentence2"] + [f"{i}\t{a}\t{b}" for i, a, b, _ in rows]
    download = glue_data.write_download(tmp_path / "glue", TOPICS, (), 8, 4, 4)
    found = files.locate_ax(str(download), str(tmp_path / "cache"))
    assert found == str(download / "diagnostic" / "diagnostic.tsv")


def test_the_download_layout_is_read_where_it_is(tmp_path):
    root = glue_data.write_download(tmp_path / "glue", TOPICS, ("sst2",), 8, 4, 4, ax=False)
    found = files.locate(str(root), glue_tasks.GLUE_TASKS["sst2"], str(tmp_path / "cache"))
    assert found.directory == str(root / "SST-2") and found.tests == ("test",)
    files.check_labels(found)
    assert files.locate_ax(str(root), str(tmp_path / "cache")) is None


def test_a_task_directory_without_its_dev_file_is_one_line(tmp_path):
    root = glue_data.write_download(tmp_path / "glue", TOPICS, ("rte",), 8, 4, 4, ax=False)
    (root / "RTE" / "dev.tsv").unlink()
    with pytest.raises(TaskDataError) as caught:
        files.locate(str(root), glue_tasks.GLUE_TASKS["rte"], str(tmp_path / "cache"))
    assert str(caught.value) == (
        f"{root / 'RTE'}: no dev.tsv; GLUE's RTE directory holds ['train.tsv', 'dev.tsv'] "
        "(and optionally its test file)"
    )
    hub = glue_data.write_hub(tmp_path / "hub", TOPICS, ("rte",), 8, 4, 4, ax=False)
    (hub / "rte" / "validation-00000-of-00001.parquet").unlink()
    with pytest.raises(TaskDataError, match=r"rte: no validation-\*\.parquet"):
        files.locate(str(hub), glue_tasks.GLUE_TASKS["rte"], str(tmp_path / "cache"))


def test_a_label_outside_the_tasks_set_is_one_line_naming_the_file(tmp_path):
    root = glue_data.write_download(tmp_path / "glue", TOPICS, ("rte",), 8, 4, 4, ax=False)
    dev = root / "RTE" / "dev.tsv"
    dev.write_text(dev.read_text().replace("not_entailment", "contradiction", 1))
    found = files.locate(str(root), glue_tasks.GLUE_TASKS["rte"], str(tmp_path / "cache"))
    with pytest.raises(TaskDataError, match=rf"^{dev} line \d+: label 'contradiction' is not one"):
        files.check_labels(found)
    hub = tmp_path / "hub"
    glue_data.write_hub(hub, TOPICS, ("mnli",), 8, 4, 4, ax=False)
    path = hub / "mnli" / "validation_matched-00000-of-00001.parquet"
    glue_data.write_parquet(
        path, {"premise": ["a b"], "hypothesis": ["c d"], "label": [3], "idx": [0]}
    )
    with pytest.raises(TaskDataError) as caught:
        files.locate(str(hub), glue_tasks.GLUE_TASKS["mnli"], str(tmp_path / "cache"))
    assert str(caught.value) == (
        f"{path} row 0: label 3 is not one of MNLI's labels 0 (entailment), 1 (neutral), "
        "2 (contradiction)"
    )


def test_a_malformed_parquet_file_is_one_line_naming_it(tmp_path):
    hub = glue_data.write_hub(tmp_path / "hub", TOPICS, ("sst2",), 8, 4, 4, ax=False)
    path = hub / "sst2" / "train-00000-of-00001.parquet"
    path.write_bytes(b"not a parquet file")
    with pytest.raises(TaskDataError, match=rf"^{path}: not a readable parquet file"):
        files.locate(str(hub), glue_tasks.GLUE_TASKS["sst2"], str(tmp_path / "cache"))
    glue_data.write_parquet(path, {"text": ["a b"], "label": [0], "idx": [0]})
    with pytest.raises(TaskDataError, match=rf"^{path}: no column 'sentence'; it has"):
        files.locate(str(hub), glue_tasks.GLUE_TASKS["sst2"], str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- curve


def test_the_curve_draws_each_tasks_score_against_the_step(tmp_path):
    def report(sst2, rte):
        return {"tasks": {"sst2": {"score": sst2}, "rte": {"score": rte}}}

    reports = {200: report(0.7, 0.55), 100: report(0.6, 0.5)}
    data = curve.points(reports)
    assert data["steps"] == [100, 200]
    assert data["tasks"] == {
        "sst2": pytest.approx([60.0, 70.0]),
        "rte": pytest.approx([50.0, 55.0]),
    }
    assert data["mean"] == pytest.approx([55.0, 62.5])
    assert curve.markdown(reports).splitlines()[2:] == [
        "| 100 | 60.0 | 50.0 | 55.0 |",
        "| 200 | 70.0 | 55.0 | 62.5 |",
    ]
    paths = curve.write(reports, tmp_path)
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "curve.json").read_text()) == data
    assert set(paths) == {"png", "md", "json"}


def test_a_data_dir_without_any_task_is_one_line(tmp_path):
    settings = SuiteSettings.from_config(config_for(tmp_path))
    with pytest.raises(ConfigError, match=r"^config.data_dir='.*': holds none of the tasks"):
        suite.run_suite(settings, str(tmp_path / "suite"))
