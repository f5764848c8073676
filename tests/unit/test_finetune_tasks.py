"""The capability registry as fine-tuning sees it: what config.task can name, and what a new
capability plugs into."""

import pathlib

import jax
import numpy as np
import pytest

from bertjax import capability
from bertjax.capability import HeadSpec
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine import optim
from bertjax.engine.settings import ConfigError
from bertjax.finetune import task as task_lib
from bertjax.finetune.settings import FinetuneSettings
from bertjax.tasks import labels
from bertjax.tasks.labels import model as label_heads
from bertjax.tasks.labels.task import HeadTask
from configs import finetune as finetune_config
from tests.helpers.finetuning import data_parallel_finetuning


class _Echo(HeadTask):
    """A task registered from outside the package: the classification head under a new
    name and its own metric, as a new capability package would register one."""

    @property
    def metrics(self):
        return ("exact",)

    @property
    def default_metric(self):
        return "exact"


class _EchoCapability(labels.Labels):
    tasks = ("echo_test",)
    fine_tuning = {"echo_test": _Echo("echo_test")}

    def check_head(self, head):
        label_heads.check_labels(label_heads.CLASSIFICATION, head.labels)


def _settings(tmp_path: pathlib.Path, **fields) -> FinetuneSettings:
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\na cat,yes\na dog,no\n", encoding="utf-8")
    config = finetune_config.get_config()
    config.init_from = str(tmp_path)
    config.data.train = str(train)
    config.data.validation = str(train)
    config.batch_size = 8
    config.eval_batch_size = 8
    for key, value in fields.items():
        setattr(config, key, value)
    return FinetuneSettings.from_config(config)


def test_the_four_heads_are_registered_in_order():
    assert task_lib.names()[:4] == label_heads.TASKS
    for name in label_heads.TASKS:
        assert task_lib.get(name).name == name
    with pytest.raises(ValueError, match=r"task='nope' is not a fine-tuning task: valid \("):
        task_lib.get("nope")


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        capability.register(labels.Labels())


def test_settings_take_a_task_and_its_metrics_from_the_registry(tmp_path):
    with pytest.raises(ConfigError, match=r"config.task='echo_test': must be one of \("):
        _settings(tmp_path, task="echo_test")
    echo = capability.register(_EchoCapability())
    try:
        settings = _settings(tmp_path, task="echo_test")
        assert settings.task == "echo_test" and settings.run.metric == "exact"
        # Its checkpoints' head names it too.
        assert HeadSpec("echo_test", ("yes", "no")).task == "echo_test"
        with pytest.raises(ConfigError, match=r"must be one of \('exact',\) for a echo_test"):
            _settings(tmp_path, task="echo_test", metric="accuracy")
    finally:
        capability._CAPABILITIES.remove(echo)
        capability._BY_TASK.pop("echo_test")


def test_the_optimizer_has_pretraining_s_shape_with_a_warmup_fraction(tmp_path):
    settings = _settings(tmp_path, task="classification")
    assert isinstance(settings.optimizer, optim.OptimizerSettings)
    resolved = settings.optimizer_for(250)
    # google's run_classifier: lr 2e-5, 10% warmup, linear decay to 0 at the last step.
    assert (resolved.learning_rate, resolved.warmup_steps, resolved.total_steps) == (2e-5, 25, 250)
    assert resolved.schedule == "linear" and resolved.name == "adamw"
    assert resolved.weight_decay == 0.01 and resolved.eps == 1e-6


def test_build_finetuning_takes_the_objective_from_the_task():
    config = BertConfig(
        vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64
    )
    head = HeadSpec(label_heads.MULTI_LABEL, ("a", "b", "c"))
    ft = data_parallel_finetuning(config, head)
    assert ft.objective.head == head and ft.objective.eval_outputs
    kernel = ft.state.abstract.params["classifier"]["kernel"]
    assert kernel.shape == (32, 3)
    batch = {
        "input_ids": np.full((8, 8), 5, np.int32),
        "input_mask": np.ones((8, 8), np.int32),
        "segment_ids": np.zeros((8, 8), np.int32),
        "labels": np.zeros((8, 3), np.float32),
        "weights": np.ones(8, np.float32),
    }
    with jax.set_mesh(ft.mesh):
        params = ft.state.init(jax.random.key(0)).params
        sums, outputs = ft.eval_step(params, batch)
    assert outputs["probabilities"].shape == (8, 3)
    assert float(sums.count) == 8 * 3


@pytest.mark.parametrize(
    "name,init", [("regression", "mean"), ("regression", "zero"), ("classification", "mean")]
)
def test_a_fresh_regression_head_starts_at_the_training_targets_mean(tmp_path, name, init):
    settings = _settings(tmp_path, task="classification", regression_bias_init=init)
    assert settings.run.regression_bias_init == init
    examples = task_lib.Examples(
        "train",
        "train.csv",
        {"labels": np.array([1.0, 2.0, 4.5], np.float32)},
        ["0", "1", "2"],
        True,
    )
    head = HeadSpec(label_heads.REGRESSION, ("score",))
    data = task_lib.TaskData(head, examples, [examples], [], [])
    params = {
        "bert": {},
        "classifier": {"kernel": jax.numpy.ones((4, 1)), "bias": jax.numpy.zeros(1)},
    }
    started, note = task_lib.get(name).start_head(params, data, settings.run)
    bias = np.asarray(started["classifier"]["bias"])
    if name == "regression" and init == "mean":
        np.testing.assert_allclose(bias, [2.5])
        assert "mean 2.5" in note
    else:
        assert not bias.any() and note is None
    np.testing.assert_array_equal(np.asarray(started["classifier"]["kernel"]), 1.0)


def test_an_unknown_regression_bias_init_is_named(tmp_path):
    with pytest.raises(ConfigError, match="regression_bias_init"):
        _settings(tmp_path, task="classification", regression_bias_init="median")


def test_compile_ahead_is_a_count_of_threads(tmp_path):
    assert _settings(tmp_path, task="classification").run.compile_ahead == 1  # one thread
    assert _settings(tmp_path, task="classification", compile_ahead=2).run.compile_ahead == 2
    assert _settings(tmp_path, task="classification", compile_ahead=0).run.compile_ahead == 0
    for bad in (-1, -3):
        with pytest.raises(ConfigError, match=r"config.compile_ahead=.* integer >= 0"):
            _settings(tmp_path, task="classification", compile_ahead=bad)
