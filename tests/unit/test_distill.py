"""Task distillation's pieces: settings, the mixed objective's sums and loss against numpy,
each task's soft loss, and unlabeled rows (bertjax.finetune.distill)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.capability import HeadSpec
from bertjax.engine.settings import ConfigError
from bertjax.finetune import distill
from bertjax.finetune.settings import FinetuneSettings
from bertjax.finetune.task import Examples
from bertjax.nn import heads
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.labels.task import HeadObjective
from bertjax.tasks.qa import model as qa_model
from tests.helpers.corpora import finetune_config
from tests.helpers.encoders import SMALL_BERT
from tests.helpers.params import random_init


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _kl(teacher, student, temperature):
    p = _softmax(teacher.astype(np.float64) / temperature)
    q = _softmax(student.astype(np.float64) / temperature)
    return temperature**2 * np.sum(p * (np.log(p) - np.log(q)), axis=-1)


def _logits(seed, shape):
    return np.random.default_rng(seed).normal(scale=2.0, size=shape).astype(np.float32)


# ----------------------------------------------------------------------------- settings


@pytest.fixture
def config(tmp_path):
    """A classification config whose files exist (settings check them), and a teacher."""
    for name in ("init", "teacher"):
        (tmp_path / name).mkdir()
    for name in ("train.csv", "dev.csv", "more.csv"):
        (tmp_path / name).write_text("sentence,label\na b,x\n")
    return finetune_config(
        tmp_path / "init",
        **{
            "task": "classification",
            "data.train": str(tmp_path / "train.csv"),
            "data.validation": str(tmp_path / "dev.csv"),
            "distill.teacher": str(tmp_path / "teacher"),
        },
    )


def test_a_teacher_is_read_with_its_mix_and_temperature(config):
    config.distill.alpha, config.distill.temperature = 0.25, 4.0
    settings = FinetuneSettings.from_config(config)
    assert settings.distill == distill.DistillSettings(
        teacher=config.distill.teacher, alpha=0.25, temperature=4.0
    )
    config.distill.update(teacher="", alpha=0.5, temperature=2.0)
    assert FinetuneSettings.from_config(config).distill is None


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("distill.alpha", 1.5, "config.distill.alpha=1.5: must be in [0, 1]"),
        ("distill.alpha", -0.1, "config.distill.alpha=-0.1: must be in [0, 1]"),
        ("distill.temperature", 0.0, "config.distill.temperature=0.0: must be in (0, 100]"),
        ("distill.temperature", 1000.0, "config.distill.temperature=1000.0: must be in (0, 100]"),
        ("distill.student_layers", "0,x", "config.distill.student_layers='0,x': must be layer"),
        ("distill.student_layers", "2,1", "in increasing order"),
        (
            "distill.teacher",
            "/nowhere/teacher",
            "config.distill.teacher='/nowhere/teacher': no such",
        ),
    ],
)
def test_bad_distillation_settings_fail_in_one_line_naming_the_field(config, field, value, message):
    config.update_from_flattened_dict({field: value})
    with pytest.raises(ConfigError) as failure:
        FinetuneSettings.from_config(config)
    assert message in str(failure.value) and "\n" not in str(failure.value)


def test_student_layers_replace_init_from(config):
    config.distill.student_layers = "0,2"
    with pytest.raises(ConfigError, match="config.init_from=.*leave init_from empty"):
        FinetuneSettings.from_config(config)
    config.init_from = ""
    settings = FinetuneSettings.from_config(config)
    assert settings.distill.student_layers == (0, 2)
    assert settings.init_from == config.distill.teacher


def test_unlabeled_examples_need_a_teacher_and_the_training_files_format(config, tmp_path):
    config.data.unlabeled = str(tmp_path / "more.csv")
    assert FinetuneSettings.from_config(config).data.unlabeled == config.data.unlabeled
    config.distill.teacher = ""
    with pytest.raises(ConfigError, match="config.data.unlabeled=.*set config.distill.teacher"):
        FinetuneSettings.from_config(config)
    config.distill.teacher = str(tmp_path / "teacher")
    (tmp_path / "more.jsonl").write_text('{"sentence": "a b"}\n')
    config.data.unlabeled = str(tmp_path / "more.jsonl")
    with pytest.raises(ConfigError, match="is read as jsonl, the training file as csv"):
        FinetuneSettings.from_config(config)
    config.data.unlabeled = str(tmp_path / "missing.csv")
    with pytest.raises(ConfigError, match="config.data.unlabeled=.*no such file"):
        FinetuneSettings.from_config(config)


def test_distillation_settings_without_a_teacher_are_refused(config):
    config.distill.teacher = ""
    config.distill.temperature = 3.0
    with pytest.raises(ConfigError, match="config.distill.temperature=3.0: applies to"):
        FinetuneSettings.from_config(config)


def test_a_task_that_does_not_distil_says_which_do(config, tmp_path):
    config.task = "seq2seq"
    (tmp_path / "s.csv").write_text("source,target\na,b\n")
    config.data.train = config.data.validation = str(tmp_path / "s.csv")
    with pytest.raises(ConfigError, match="a seq2seq run does not distil; tasks that do: .*"):
        FinetuneSettings.from_config(config)


def test_layers_parse_as_increasing_indices():
    assert distill.parse_layers("0, 2,4") == (0, 2, 4)
    assert distill.parse_layers((1, 3)) == (1, 3)
    assert distill.parse_layers("") == ()
    with pytest.raises(ValueError, match="distinct"):
        distill.parse_layers("1,1")


# ----------------------------------------------------------------------------- soft losses


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_classification_and_token_soft_sums_are_the_softened_kl(temperature):
    student, teacher = _logits(0, (4, 3)), _logits(1, (4, 3))
    batch = {"input_ids": np.zeros((4, 5), np.int32)}
    loss, count = label_heads.soft_sums("classification", student, teacher, batch, temperature)
    np.testing.assert_allclose(loss, _kl(teacher, student, temperature).sum(), rtol=1e-5)
    assert count == 4

    student, teacher = _logits(2, (2, 5, 3)), _logits(3, (2, 5, 3))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    batch = {"input_ids": np.zeros((2, 5), np.int32), "input_mask": mask}
    loss, count = label_heads.soft_sums(
        "token_classification", student, teacher, batch, temperature
    )
    want = (_kl(teacher, student, temperature) * mask).sum()
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert count == mask.sum()


def test_regression_and_multi_label_soft_sums():
    student, teacher = _logits(4, (3, 1)), _logits(5, (3, 1))
    batch = {"input_ids": np.zeros((3, 4), np.int32)}
    loss, count = label_heads.soft_sums("regression", student, teacher, batch, 2.0)
    np.testing.assert_allclose(loss, ((student - teacher) ** 2).sum(), rtol=1e-5)
    assert count == 3

    student, teacher = _logits(6, (3, 4)), _logits(7, (3, 4))
    loss, count = label_heads.soft_sums("multi_label", student, teacher, batch, 2.0)
    p, q = 1 / (1 + np.exp(-teacher / 2.0)), 1 / (1 + np.exp(-student / 2.0))
    want = 4.0 * (p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))).sum()
    np.testing.assert_allclose(loss, want, rtol=1e-4)
    assert count == 3 * 4  # averaged over (row, label), as the hard loss


def test_qa_soft_loss_is_the_two_ends_kl_over_real_positions_only():
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.int32)
    ends = [_logits(k, (2, 4)) for k in range(4)]  # student start, end; teacher start, end
    got = qa_model.soft_span_loss((ends[0], ends[1]), (ends[2], ends[3]), mask, 2.0)
    for row in range(2):
        real = mask[row] > 0
        want = 0.5 * sum(
            _kl(ends[t][row, real], ends[s][row, real], 2.0) for s, t in ((0, 2), (1, 3))
        )
        np.testing.assert_allclose(got[row], want, rtol=1e-5)
    # Padding does not move it: the same window at another width scores the same.
    wide = [np.pad(e, ((0, 0), (0, 3)), constant_values=9.0) for e in ends]
    wide_mask = np.pad(mask, ((0, 0), (0, 3)))
    again = qa_model.soft_span_loss((wide[0], wide[1]), (wide[2], wide[3]), wide_mask, 2.0)
    np.testing.assert_allclose(again, got, rtol=1e-6)


# ----------------------------------------------------------------------------- the objective


def _classification():
    head = HeadSpec("classification", ("a", "b", "c"))
    student = HeadObjective(SMALL_BERT, head)
    params = random_init(lambda: student.init_params(jax.random.key(0)), 0, std=0.1)
    rng = np.random.default_rng(0)
    rows = 6
    batch = {
        "input_ids": rng.integers(5, SMALL_BERT.vocab_size, (rows, 8)).astype(np.int32),
        "input_mask": np.ones((rows, 8), np.int32),
        "segment_ids": np.zeros((rows, 8), np.int32),
        "labels": rng.integers(0, 3, rows).astype(np.int32),
        # The last two rows are unlabeled: the teacher alone teaches them.
        "weights": np.array([1, 1, 1, 1, 0, 0], np.float32),
        "teacher_logits": _logits(9, (rows, 3)),
    }
    return student, params, batch


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_the_loss_mixes_the_labels_loss_and_the_teachers_by_alpha(alpha):
    student, params, batch = _classification()
    objective = distill.DistillationObjective(student, alpha, 2.0)
    sums = objective.sums(params, batch, rng=None, deterministic=True)
    loss = float(objective.loss(sums, objective.denominators(batch)))
    logits = np.asarray(
        student.distill_outputs(params, batch, rng=None, deterministic=True)["logits"]
    )
    log_probs = np.log(_softmax(logits.astype(np.float64)))
    labelled = batch["weights"] > 0
    hard = -log_probs[labelled, batch["labels"][labelled]].mean()  # the 4 labelled rows
    soft = _kl(batch["teacher_logits"], logits, 2.0).mean()  # every row
    np.testing.assert_allclose(loss, (1 - alpha) * hard + alpha * soft, rtol=1e-5)
    metrics = objective.metrics(sums, "train")
    np.testing.assert_allclose(float(metrics["train/distill_loss"]), soft, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["train/loss"]), hard, rtol=1e-5)


def test_micro_batches_add_up_to_the_whole_batchs_loss():
    """Sums of two halves with the whole batch's denominators give the whole batch's loss,
    so gradient accumulation with a teacher is exact."""
    student, params, batch = _classification()
    objective = distill.DistillationObjective(student, 0.5, 2.0)
    denominators = objective.denominators(batch)
    whole = objective.loss(
        objective.sums(params, batch, rng=None, deterministic=True), denominators
    )
    halves = [{k: v[s] for k, v in batch.items()} for s in (slice(0, 3), slice(3, 6))]
    parts = sum(
        objective.loss(objective.sums(params, h, rng=None, deterministic=True), denominators)
        for h in halves
    )
    np.testing.assert_allclose(float(parts), float(whole), rtol=1e-6)


def test_evaluation_is_the_tasks_own():
    student, params, batch = _classification()
    objective = distill.DistillationObjective(student, 0.5, 2.0)
    sums, outputs = objective.evaluate(params, batch)
    want_sums, want_outputs = student.evaluate(params, batch)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), sums, want_sums))
    assert objective.metrics(sums, "eval").keys() == student.metrics(want_sums, "eval").keys()
    np.testing.assert_array_equal(outputs["probabilities"], want_outputs["probabilities"])
    assert isinstance(sums, heads.HeadSums)


# ----------------------------------------------------------------------------- unlabeled


def _examples(name, rows, width=4):
    features = {
        "input_ids": np.full((rows, width), 7, np.int32),
        "labels": np.arange(rows, dtype=np.int32),
    }
    return Examples(name, f"{name}.csv", features, [str(i) for i in range(rows)], True)


def test_unlabeled_rows_join_the_training_split_with_label_weight_zero():
    merged = distill.with_unlabeled(_examples("train", 3), _examples("unlabeled", 2))
    assert len(merged) == 5 and merged.name == "train"
    np.testing.assert_array_equal(merged.features["weights"], [1, 1, 1, 0, 0])
    assert merged.features["input_ids"].shape == (5, 4)


def test_an_empty_or_other_shaped_unlabeled_file_is_refused():
    with pytest.raises(ConfigError, match="config.data.unlabeled='unlabeled.csv' holds no"):
        distill.with_unlabeled(_examples("train", 3), _examples("unlabeled", 0))
    with pytest.raises(ConfigError, match="must be in the task's own format"):
        distill.with_unlabeled(_examples("train", 3), _examples("unlabeled", 2, width=6))


def test_labels_must_be_the_teachers():
    distill.check_labels(
        HeadSpec("classification", ("a", "b")), HeadSpec("classification", ("a", "b"))
    )
    with pytest.raises(
        ConfigError, match=r"its labels \['a', 'b'\] are not the student's \['a', 'c'\]"
    ):
        distill.check_labels(
            HeadSpec("classification", ("a", "b")), HeadSpec("classification", ("a", "c"))
        )
