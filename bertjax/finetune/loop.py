"""The fine-tuning run: train, evaluate after each epoch, keep the best, predict, per seed.

`finetune(settings, workdir)` is the whole job behind `python finetune.py`. Each seed runs the
shared loop (bertjax.engine.loop) with what fine-tuning adds: the epoch's data order, evaluation of
every validation split at each epoch's end by the task's metric, and the best parameters kept
apart. The task itself (reading, objective, scores, predictions) comes from the registry
(bertjax.finetune.task). A run's work directory (names in bertjax.engine.rundir) holds:

    checkpoints/          the latest state (parameters, optimizer state, step), saved after
                          every epoch and every checkpoint_every_steps; rerunning resumes it
    best/                 the parameters of the best epoch by the task's metric (Orbax)
    tokenizer.model       the tokenizer (tokenizer.json for WordPiece), so the directory
                          opens on its own: bertjax.Model.load(workdir) and the method
                          of its capability (predict, answer, embed, generate)
    metrics.jsonl, tensorboard/
    predictions_<split>.tsv   predictions of the best parameters for each test file, as
                          the task writes them (bertjax.tasks)
    result.json           the best epoch and its validation metrics

With several seeds (config.seeds) each seed runs in <workdir>/seed_<n>/ and
<workdir>/seeds.json holds every seed's best value and their median.

The data order of epoch e is drawn from (seed, e) (epoch_order: shuffled, or batches by
length) and dropout keys are folded from the seed and the step, so a resumed run takes the
same steps as an uninterrupted one.

This module is the run's orchestration; each of its other jobs has a module of its own:
prepared.py (init_from and the data read, the steps built, once for every seed), warm_start.py
(the first train state from init_from), batches.py (each epoch's order, training and
evaluation batches), widths.py (the few widths the run's batches are cut to, the token
capacity), evaluation.py (evaluation, validation scores, test predictions), resume.py (what
a checkpoint says, and whether it belongs to this run), ahead.py (the run's programs compiled
ahead) and summary.py (the seeds' results).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import numpy as np
import tqdm

from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import compile_ahead, metrics_writer, perf, rundir, steps
from bertjax.engine import loop as loop_lib
from bertjax.finetune import task as task_lib
from bertjax.finetune.ahead import compiled_ahead
from bertjax.finetune.batches import train_batch, train_micro_batches, training_order
from bertjax.finetune.evaluation import is_better, predict_tests, validation_scores
from bertjax.finetune.layouts import metric_prefix
from bertjax.finetune.prepared import PreparedRun, prepare
from bertjax.finetune.resume import check_resumable, checkpoint_meta
from bertjax.finetune.settings import FinetuneSettings
from bertjax.finetune.summary import print_summary, seed_summary
from bertjax.finetune.warm_start import first_state
from bertjax.storage import fs


@dataclasses.dataclass
class _SeedHooks:
    """What the shared loop asks of one seed of a fine-tuning run (loop.LoopHooks)."""

    run: PreparedRun
    seed: int
    best_checkpointer: checkpoint_lib.Checkpointer
    checkpoint_dir: fs.AnyPath
    best: dict | None = None
    # The best evaluation's outputs by validation split, kept where the task writes the
    # validation split's predictions (None before it, or when resumed after it).
    best_validation_outputs: dict[str, dict[str, np.ndarray]] | None = None
    # (epoch, its training order): drawn once per epoch, not at every step (by length, the
    # order sorts the whole training set).
    current_order: tuple[int, np.ndarray] | None = None

    def dropout_rng(self) -> jax.Array:
        return jax.random.fold_in(jax.random.key(self.seed), 1)

    def fresh(self) -> tuple[steps.TrainState, jax.Array]:
        state, note, fresh_head = first_state(
            self.run.source, self.run.ft, jax.random.key(self.seed)
        )
        params = state.params
        if fresh_head:
            task = task_lib.get(self.run.settings.task)
            params, head_note = task.start_head(params, self.run.task, self.run.settings.run)
            note += f"; {head_note}" if head_note else ""
        print(note)
        return state.replace(params=params), self.dropout_rng()

    def resumed(self, restored: checkpoint_lib.Restored) -> jax.Array:
        self.best = restored.meta["best"]
        print(f"Resumed seed {self.seed} from {self.checkpoint_dir} at step {restored.step}")
        return self.dropout_rng()

    def batch(self, step: int) -> dict[str, np.ndarray]:
        run = self.run
        epoch, index = divmod(step, run.steps_per_epoch)
        settings = run.settings.run
        if self.current_order is None or self.current_order[0] != epoch:
            order = training_order(
                run.task.train, self.seed, epoch, settings.batch_size, settings.batch_order
            )
            self.current_order = (epoch, order)
        order = self.current_order[1]
        if settings.micro_batches_by_length:
            return train_micro_batches(
                run.task.train,
                order,
                index,
                settings.batch_size,
                settings.grad_accum_steps,
                settings.length_bucket,
                run.train_widths,
            )
        return train_batch(
            run.task.train,
            order,
            index,
            settings.batch_size,
            settings.length_bucket,
            run.train_widths,
        )

    def eval_metrics(self, state: steps.TrainState, step: int) -> dict[str, float]:
        run, metric = self.run, self.run.settings.run.metric
        scores, outputs = validation_scores(
            run.ft,
            state.params,
            run.task,
            run.settings.run.eval_batch_size,
            run.settings.run.length_bucket,
            run.eval_widths,
        )
        scores["epoch"] = step // run.steps_per_epoch
        main = f"{metric_prefix(run.task.validation[0].name)}/{metric}"
        line = ", ".join(f"{k} {v:.4f}" for k, v in scores.items() if k.startswith("eval"))
        tqdm.tqdm.write(f"seed {self.seed} epoch {scores['epoch']}: {line}")
        if is_better(metric, scores[main], self.best):
            self.best = {
                "metric": main,
                "value": scores[main],
                "step": step,
                "epoch": scores["epoch"],
                "scores": scores,
            }
            if task_lib.get(run.settings.task).predicts_validation:
                # The best parameters' validation predictions, written when the run ends
                # without evaluating the split again.
                self.best_validation_outputs = outputs
            self.best_checkpointer.save(
                step,
                params=state.params,
                # Parameters only: the optimizer item holds just the step.
                opt_state={"step": state.step},
                meta=self.meta(step),
                force=True,
            )
        return scores

    def meta(self, step: int) -> dict:
        return checkpoint_meta(self.run, self.seed, self.best)


def _steps_left(run: PreparedRun, workdir: fs.AnyPath) -> bool:
    """Whether the seed run in `workdir` has steps left to train, by its newest saved step
    (a damaged one, which a restore skips, makes the run train again, compiling as it goes)."""
    newest = checkpoint_lib.newest_step(workdir / rundir.CHECKPOINT_DIR)
    return newest is None or newest < run.total_steps


def _run_seed(run: PreparedRun, seed: int, workdir: fs.AnyPath) -> dict[str, Any]:
    settings = run.settings
    is_main = jax.process_index() == 0
    # Checked before anything is written there: a directory of another run keeps its files.
    existing = workdir / rundir.CHECKPOINT_DIR
    if existing.is_dir():
        try:
            meta = checkpoint_lib.read_meta(existing)
        except FileNotFoundError:  # no finished step yet: nothing to resume or to protect
            meta = None
        if meta is not None:
            check_resumable(meta, run, existing)
    fs.makedirs(workdir)
    if is_main:
        run.tokenizer.save(workdir / rundir.tokenizer_file(run.tokenizer))
    checkpointer = checkpoint_lib.Checkpointer(
        workdir / rundir.CHECKPOINT_DIR,
        max_to_keep=1,
        save_interval_steps=settings.run.checkpoint_every_steps,
    )
    best_checkpointer = checkpoint_lib.Checkpointer(
        workdir / rundir.BEST_CHECKPOINT_DIR, max_to_keep=1, save_interval_steps=1
    )
    writer = metrics_writer.MetricWriter(
        workdir / rundir.METRICS_FILE, workdir / rundir.TENSORBOARD_DIR, enabled=is_main
    )
    plan = loop_lib.Plan(
        run.ft.steps,
        checkpointer,
        writer,
        loop_lib.Cadence(
            total_steps=run.total_steps,
            period=run.steps_per_epoch,
            log_every=settings.run.log_every_steps,
            eval_every=run.steps_per_epoch,
            checkpoint_every=settings.run.checkpoint_every_steps,
        ),
        is_main,
    )
    hooks = _SeedHooks(run, seed, best_checkpointer, checkpointer.directory)
    try:
        outcome = loop_lib.train(plan, hooks)
    finally:
        best_checkpointer.close()

    result = {
        "seed": seed,
        "workdir": str(workdir),
        "steps": outcome.step,
        "preempted": outcome.preempted,
        "best": hooks.best,
    }
    if outcome.preempted:
        return result
    result["predictions"] = predict_tests(run, workdir, hooks.best_validation_outputs)
    if is_main:
        rundir.write_text(workdir / rundir.RESULT_FILE, json.dumps(result, indent=2) + "\n")
    return result


def finetune(
    settings: FinetuneSettings, workdir: str | os.PathLike, devices=None
) -> dict[str, Any]:
    """Fine-tunes (or resumes) for every seed of the settings in workdir; returns the summary.

    `workdir` is a local directory or `gs://bucket/path`. `devices`: the devices of the mesh
    (default: all of them).
    """
    start = time.time()
    workdir = fs.makedirs(workdir)
    # On GCS making a directory writes nothing: ask the store now, so that a missing bucket,
    # missing credentials or a refused permission end here, in one line naming the path.
    fs.kind(workdir)
    lock = rundir.WorkdirLock(workdir)
    if jax.process_index() == 0:
        lock.acquire()
    try:
        with perf.CompileTime() as compiling:
            run = prepare(settings, devices)
            compiler = None
            if settings.run.compile_ahead:
                compiler = compile_ahead.Compiler(settings.run.compile_ahead, run.ft.mesh)
            seeds = settings.run.seeds
            seed_dirs = [
                workdir if len(seeds) == 1 else workdir / rundir.SEED_DIR.format(seed)
                for seed in seeds
            ]
            results = []
            failing = True
            try:
                if compiler is not None:
                    # Rerunning a finished run trains nothing: its training programs are not
                    # compiled (its evaluation and prediction programs are).
                    trains = any(_steps_left(run, seed_dir) for seed_dir in seed_dirs)
                    run = compiled_ahead(run, compiler, training=trains)
                for seed, seed_dir in zip(seeds, seed_dirs):
                    results.append(_run_seed(run, seed, seed_dir))
                    if results[-1]["preempted"]:
                        break
                failing = False
            finally:
                if compiler is not None:
                    # Programs never called are dropped; a failure no step raised is raised.
                    compiler.close(failing=failing)
    finally:
        lock.release()
    summary = seed_summary(settings, results, workdir, time.time() - start)
    summary["compile_sec"] = compiling.seconds
    summary["programs_compiled"] = compiling.programs
    summary["programs_loaded"] = compiling.loaded
    if jax.process_index() == 0:
        print_summary(summary)
    return summary
