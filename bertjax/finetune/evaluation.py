"""Evaluation and prediction in a fine-tuning run: the objective's loss and outputs over a
split's batches (`run_eval`), every validation split scored by the task's metrics
(`validation_scores`), and each test split's predictions by the best parameters
(`predict_tests`)."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import rundir, steps
from bertjax.finetune import metrics as metrics_lib
from bertjax.finetune import task as task_lib
from bertjax.finetune.batches import eval_batches, eval_length_bucket
from bertjax.finetune.layouts import metric_prefix
from bertjax.finetune.objective import Finetuning
from bertjax.finetune.prepared import PreparedRun
from bertjax.finetune.task import Examples, TaskData
from bertjax.nn import heads, sharding
from bertjax.storage import fs


def _to_host(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def run_eval(
    ft: Finetuning,
    params,
    examples: Examples,
    batch_size: int,
    length_bucket: int = 32,
    widths: tuple[int, ...] | None = None,
) -> tuple[heads.HeadSums, dict[str, np.ndarray]]:
    """Summed loss statistics and the outputs (the objective's) of every example, in order.

    Where the task's objective allows it (`position_outputs`), batches are grouped by length
    and cut to multiples of a quarter of `length_bucket` positions (training's widths), or to
    `widths` (the run's `evaluation_widths`); per-position outputs come back at full length,
    the cut positions holding the lowest value of their type (no decoder picks them).
    """
    position_outputs = ft.objective.position_outputs
    seq = examples.features["input_mask"].shape[1]
    totals, outputs = None, {}
    for real, local in run_eval_batches(ft, examples, batch_size, length_bucket, widths):
        batch = steps.global_batch(local, ft.batch_sharding, jax.process_count())
        sums, batch_outputs = ft.eval_step(params, batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        for name, value in batch_outputs.items():
            value = _to_host(value)[: len(real)]
            if name not in outputs:
                shape = value.shape[1:]
                if name in (position_outputs or ()):
                    shape = (seq,) + shape[1:]
                outputs[name] = np.full((len(examples),) + shape, _lowest(value.dtype), value.dtype)
            if value.ndim == 1:
                outputs[name][real] = value
            else:
                outputs[name][real, : value.shape[1]] = value
    return jax.device_get(totals), outputs


def run_eval_batches(
    ft: Finetuning,
    examples: Examples,
    batch_size: int,
    length_bucket: int,
    widths: tuple[int, ...] | None,
) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """The batches run_eval takes (eval_batches with the objective's and mesh's settings)."""
    position_outputs = ft.objective.position_outputs
    bucket = None if position_outputs is None else eval_length_bucket(length_bucket)
    multiple = sharding.data_parallel_size(ft.mesh)
    platform = ft.mesh.devices.flat[0].platform
    return eval_batches(examples, batch_size, bucket, multiple, platform, widths)


def _lowest(dtype: np.dtype):
    """The lowest value of a dtype: what positions cut from an evaluation batch hold."""
    return np.finfo(dtype).min if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def is_better(metric: str, value: float, best: dict | None) -> bool:
    """Whether `value` of `metric` beats the best evaluation so far (None: none yet)."""
    if best is None:
        return True
    if metric in metrics_lib.LOWER_IS_BETTER:
        return value < best["value"]
    return value > best["value"]


def validation_scores(
    ft: Finetuning,
    params,
    task: TaskData,
    batch_size: int,
    length_bucket: int = 32,
    widths: tuple[int, ...] | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, np.ndarray]]]:
    """Loss and the task's metrics on every validation split, namespaced by split, and each
    split's outputs (run_eval's) by its name (`widths`: as run_eval's)."""
    scorer = task_lib.get(ft.head.task)
    scores: dict[str, float] = {}
    outputs_by_split = {}
    for examples in task.validation:
        sums, outputs = run_eval(ft, params, examples, batch_size, length_bucket, widths)
        prefix = metric_prefix(examples.name)
        scores.update({k: float(v) for k, v in ft.objective.metrics(sums, prefix).items()})
        for name, value in scorer.scores(ft.head, examples, outputs).items():
            scores[f"{prefix}/{name}"] = value
        outputs_by_split[examples.name] = outputs
    return scores, outputs_by_split


def predict_tests(
    run: PreparedRun,
    workdir: fs.AnyPath,
    validation_outputs: dict[str, dict[str, np.ndarray]] | None = None,
) -> list[str]:
    """Writes each test split's predictions by the best parameters; their paths.

    A task with `predicts_validation` (question answering's official files) writes the
    validation splits' too, from `validation_outputs` (the best evaluation's, by split) where
    this process kept them; a task's write_predictions may return where it wrote.
    """
    kind = task_lib.get(run.ft.head.task)
    kept = validation_outputs or {}
    # (split, its outputs where already computed)
    splits = [(examples, None) for examples in run.task.test]
    if kind.predicts_validation:
        splits = [(e, kept.get(e.name)) for e in run.task.validation] + splits
    if not splits:
        return []
    with jax.set_mesh(run.ft.mesh):
        params = None
        written = []
        for examples, outputs in splits:
            if outputs is None:
                if params is None:
                    _, params, _ = checkpoint_lib.restore_params(
                        workdir / rundir.BEST_CHECKPOINT_DIR,
                        abstract_params=run.ft.state.abstract.params,
                    )
                _, outputs = run_eval(
                    run.ft,
                    params,
                    examples,
                    run.settings.run.eval_batch_size,
                    run.settings.run.length_bucket,
                    run.eval_widths,
                )
            path = workdir / rundir.PREDICTIONS_FILE.format(examples.name)
            if jax.process_index() == 0:
                path = kind.write_predictions(path, run.ft.head, examples, outputs) or path
            written.append(str(path))
    return written
