"""Pretraining distillation (objective "distill") as a user runs it: train.py with the CPU demo
recipe from a teacher run, a killed run resuming bit-exactly, a student of another family than
its teacher, and the student opening as an ordinary model of its family."""

import json
import pathlib
import sys

import jax
import numpy as np

import bertjax
from bertjax.engine import loop as engine_loop
from bertjax.engine import rundir
from bertjax.pretrain import loop as pretrain_loop
from bertjax.pretrain.settings import PretrainSettings
from configs import distil_tiny, modernbert_tiny
from tests.helpers.corpora import ONE_LAYER
from tests.helpers.trainer import short_run_config
from tests.helpers.xla_env import run_process

REPO = pathlib.Path(__file__).resolve().parents[2]


def _config(teacher, data, **fields):
    """configs/distil_tiny.py, short, from `teacher` (the session's one-layer BERT run)."""
    return short_run_config(
        distil_tiny,
        data,
        steps=8,
        batch_size=16,
        warmup_steps=2,
        log_every=2,
        eval_every=8,
        checkpoint_every=4,
        **{"teacher": str(teacher), **ONE_LAYER, "fill_mask_samples": 0, **fields},
    )


def _metrics(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _params(workdir):
    return jax.device_get(rundir.read_params(rundir.open_run(workdir))[1])


def test_train_py_distils_the_demo_recipe_from_a_teacher_run(demo_run, tmp_path):
    """The recipe's command as its docstring gives it, from the tiny demo run (L2/H128) and on
    its prepared data, shortened: the student starts as the teacher's layer 0, trains, and
    opens as a one-layer BERT."""
    teacher, _, _ = demo_run
    workdir = tmp_path / "student"
    completed = run_process(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--config",
            str(REPO / "configs" / "distil_tiny.py"),
            "--workdir",
            str(workdir),
            f"--config.teacher={teacher}",
            f"--config.data.dir={pathlib.Path(teacher) / rundir.DATA_DIR}",
            "--config.num_train_steps=4",
            "--config.optimizer.warmup_steps=1",
            "--config.batch_size=16",
            "--config.eval_every_steps=4",
            "--config.eval_batches=1",
            "--config.checkpoint_every_steps=4",
            "--config.fill_mask_samples=0",
        ],
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Initialised parameters as the objective gives them (distill)" in completed.stdout
    evaluation = [line for line in _metrics(workdir) if "eval/distill_ce" in line]
    assert evaluation and np.isfinite(evaluation[-1]["eval/distill_cos"])
    model = bertjax.Model.load(workdir)
    assert model.config.num_layers == 1 and model.family.name == "bert"
    assert len(model.fill_mask("a [MASK] b")) == 5


def test_a_killed_distillation_run_resumes_bit_exactly(
    pretrained_run, synthetic_data, tmp_path, monkeypatch
):
    teacher, _ = pretrained_run
    config = _config(teacher, synthetic_data, distill_student_layers="0")
    pretrain_loop.train_and_evaluate(
        PretrainSettings.from_config(config), str(tmp_path / "straight")
    )
    with monkeypatch.context() as patch:
        patch.setattr(engine_loop.PreemptionWatcher, "should_stop", lambda self, step: step == 5)
        pretrain_loop.train_and_evaluate(
            PretrainSettings.from_config(config), str(tmp_path / "resumed")
        )
    pretrain_loop.train_and_evaluate(
        PretrainSettings.from_config(config), str(tmp_path / "resumed")
    )
    straight, resumed = _params(tmp_path / "straight"), _params(tmp_path / "resumed")
    jax.tree.map(np.testing.assert_array_equal, straight, resumed)


def test_a_modernbert_student_learns_from_a_bert_teacher(pretrained_run, synthetic_data, tmp_path):
    """Another family than the teacher's, the teacher's tokenizer: the student (a one-layer
    ModernBERT as wide as the teacher) starts at random and draws its hidden states towards
    the teacher's."""
    teacher, _ = pretrained_run
    config = short_run_config(
        modernbert_tiny,
        synthetic_data,
        steps=12,
        batch_size=16,
        warmup_steps=2,
        log_every=2,
        eval_every=12,
        **{
            "objective": "distill",
            "teacher": str(teacher),
            "model.hidden_size": 64,
            "model.intermediate_size": 128,
            "model.num_layers": 1,
            "model.num_heads": 2,
            "model.local_attention": 16,
            "data.masked_lm_prob": 0.15,
            "data.eval_masked_lm_prob": 0.15,
            "batch_warmup_steps": 0,
            "data.layout": "pairs",
            "optimizer.decay_steps": 4,
            "fill_mask_samples": 0,
        },
    )
    pretrain_loop.train_and_evaluate(PretrainSettings.from_config(config), str(tmp_path / "run"))
    lines = [line for line in _metrics(tmp_path / "run") if "train/distill_cos" in line]
    assert lines[-1]["train/distill_cos"] < lines[0]["train/distill_cos"]
    model = bertjax.Model.load(tmp_path / "run")
    assert model.family.name == "modernbert" and model.config.hidden_size == 64
