"""The training loop body both runs share: restore, iterate, log, evaluate, save, stop.

`train(plan, hooks)` runs the steps of one run from its latest checkpoint (or a fresh start)
to `plan.cadence.total_steps`. What differs between pretraining and fine-tuning comes in
through `LoopHooks`: where a fresh state comes from, what a resumed one restores besides the
arrays, each step's batch, what evaluation computes and what each checkpoint's meta holds.
The loop knows no task. It owns the cadence:

- every step: the step runs; the step before it is checked for a non-finite loss (its
  metrics have arrived by then), and a failed background checkpoint write stops the run;
- every `log_every` steps and at every boundary: the mean metrics since the last log;
- every `eval_every` steps and at every boundary: `hooks.eval_metrics`;
- then, if the job is being preempted, a forced save and a clean stop;
- every `checkpoint_every` steps and at every boundary: a save (forced at a boundary).

A boundary is the end of a period (an epoch) and the end of the run. A non-finite step
stops the run with `NonFiniteError`, naming the step and the last good checkpoint. However
the run ends, the progress bar is closed first (so that an error line is the last line of
the output), and a failure while closing the checkpointer or the metrics never hides the
error that stopped the run: it is logged, and raised only when the run itself succeeded.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import metrics_writer, perf, steps

logger = logging.getLogger(__name__)


class NonFiniteError(FloatingPointError):
    """Raised when a step produced a non-finite loss or gradient."""


class PreemptionWatcher:
    """Tells the loop when to save and stop because the job is being preempted.

    On several processes JAX's preemption sync point makes every host agree on the step
    (its service catches SIGTERM itself). A single process catches SIGTERM here.
    """

    def __init__(self, checkpointer: checkpoint_lib.Checkpointer):
        self._checkpointer = checkpointer
        self._signalled = False
        self._previous_handler = None
        if jax.process_count() == 1:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self._signalled = True

    def should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            return self._checkpointer.reached_preemption(step)
        return self._signalled

    def close(self):
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)


def raise_if_nonfinite(metrics: list[dict[str, Any]], step: int) -> None:
    """Stops the run, naming the step, if any of the steps ending at `step` was not finite."""
    # Only the flags cross to the host on the per-step path; the rest only when one is bad.
    for offset, flag in enumerate(jax.device_get([m["train/nonfinite"] for m in metrics])):
        if flag:
            values = jax.device_get(metrics[offset])
            raise NonFiniteError(
                f"step {step - len(metrics) + offset + 1}: non-finite loss "
                f"({values['train/loss']}) or gradient norm ({values['train/grad_norm']}); "
                "stopping. Its update was not applied."
            )


def mean_train_metrics(pending: list[dict[str, jax.Array]], step: int) -> dict[str, float]:
    """Means of the metrics of the last steps; stops the run on a non-finite step."""
    host = jax.device_get(pending)
    raise_if_nonfinite(host, step)
    keys = [k for k in host[0] if k != "train/nonfinite"]
    summary = {k: float(np.mean([m[k] for m in host])) for k in keys}
    summary["train/learning_rate"] = float(host[-1]["train/learning_rate"])
    return summary


@dataclasses.dataclass(frozen=True)
class Cadence:
    """When the loop logs, evaluates and saves; boundaries fall every `period` steps and at
    `total_steps`."""

    total_steps: int
    period: int  # an epoch's steps, or total_steps for a run without epochs
    log_every: int
    eval_every: int
    checkpoint_every: int

    def boundary(self, step: int) -> bool:
        return step % self.period == 0 or step == self.total_steps


class LoopHooks(Protocol):
    """What a run tells the loop (see the module docstring)."""

    def fresh(self) -> tuple[steps.TrainState, jax.Array]:
        """(state, dropout key) of a run with no checkpoint yet."""
        ...

    def resumed(self, restored: checkpoint_lib.Restored) -> jax.Array:
        """Restores what the checkpoint's meta holds besides the arrays; the dropout key."""
        ...

    def batch(self, step: int) -> dict[str, np.ndarray] | list[dict[str, np.ndarray]]:
        """This process's rows of the batch that takes the state from `step` to `step + 1`:
        one batch, or its micro-batches of their own widths (steps.Steps.take_step)."""
        ...

    def eval_metrics(self, state: steps.TrainState, step: int) -> dict[str, float]:
        """Evaluation metrics after `step` (the loop writes them)."""
        ...

    def meta(self, step: int) -> dict:
        """The JSON meta of a checkpoint saved after `step`."""
        ...


@dataclasses.dataclass(frozen=True)
class Plan:
    """The pieces the loop drives: the built steps, where state and metrics go, the cadence.

    The loop closes the checkpointer and the writer when it ends. `throughput`, when given,
    adds perf/ metrics to every log, timed from the step after the first (compiling) one.
    """

    steps: steps.Steps
    checkpointer: checkpoint_lib.Checkpointer
    writer: metrics_writer.MetricWriter
    cadence: Cadence
    is_main_process: bool
    throughput: perf.Throughput | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a run of the loop ended."""

    state: steps.TrainState
    step: int
    preempted: bool
    eval_metrics: dict[str, float]  # the last evaluation's


def restore(plan: Plan, hooks: LoopHooks) -> tuple[steps.TrainState, jax.Array]:
    """(state, dropout key) from the latest good checkpoint, else `hooks.fresh()`."""
    factory = plan.steps.state
    restored = plan.checkpointer.restore(
        abstract_params=factory.abstract.params, abstract_opt_state=factory.abstract.opt_state
    )
    if restored is None:
        return hooks.fresh()
    dropout_rng = hooks.resumed(restored)
    step = jax.device_put(jnp.asarray(restored.step, jnp.int32), factory.shardings.step)
    return steps.TrainState(
        step=step, params=restored.params, opt_state=restored.opt_state
    ), dropout_rng


def train(plan: Plan, hooks: LoopHooks) -> Outcome:
    """Runs (or resumes) the run's steps; see the module docstring."""
    checkpointer, writer, cadence = plan.checkpointer, plan.writer, plan.cadence
    throughput = plan.throughput
    watcher = PreemptionWatcher(checkpointer)
    eval_metrics: dict[str, float] = {}
    preempted = False
    progress: metrics_writer.Progress | None = None
    completed = False
    try:
        # Tracing the model needs the mesh in context for its sharding constraints.
        with jax.set_mesh(plan.steps.mesh):
            state, dropout_rng = restore(plan, hooks)
            step = first_step = int(state.step)
            progress = metrics_writer.Progress(
                cadence.total_steps, step, enabled=plan.is_main_process
            )
            if throughput is not None:
                throughput.restart(step)
            pending: list[dict[str, jax.Array]] = []  # per-step metrics not yet logged

            def save(force: bool) -> None:
                raise_if_nonfinite(pending[-1:], step)  # the steps before were checked
                checkpointer.save(
                    step,
                    params=state.params,
                    opt_state=state.opt_state,
                    meta=hooks.meta(step),
                    force=force,
                )

            while step < cadence.total_steps:
                state, metrics = plan.steps.take_step(state, hooks.batch(step), dropout_rng)
                step += 1
                pending.append(metrics)
                progress.update(step)
                if len(pending) >= 2:  # the previous step has finished by now: stop on it
                    raise_if_nonfinite(pending[-2:-1], step - 1)
                checkpointer.check_for_errors()  # a failed background write stops the run now
                if throughput is not None and step == first_step + 1:
                    jax.block_until_ready(metrics)  # the first step compiled: time from here on
                    throughput.restart(step)

                boundary = cadence.boundary(step)
                if step % cadence.log_every == 0 or boundary:
                    summary = mean_train_metrics(pending, step)  # waits for the device
                    if throughput is not None:
                        summary.update(throughput.metrics(step))
                    writer.write(step, summary)
                    progress.show(summary)
                    pending = []
                if step % cadence.eval_every == 0 or boundary:
                    eval_metrics = hooks.eval_metrics(state, step)
                    writer.write(step, eval_metrics)
                    progress.show(eval_metrics)
                    if throughput is not None:
                        throughput.restart(step)
                if watcher.should_stop(step):
                    save(force=True)
                    preempted = True
                    print(
                        f"\nPreempted: saved step {step} to {checkpointer.directory}; "
                        "rerun the same command to resume."
                    )
                    break
                if step % cadence.checkpoint_every == 0 or boundary:
                    save(force=boundary)
        completed = True
    except NonFiniteError as e:
        checkpointer.wait_until_finished()
        latest = checkpointer.latest_step()
        kept = (
            f"the last checkpoint, step {latest} in {checkpointer.directory}, is good"
            if latest is not None
            else "no checkpoint was saved"
        )
        raise NonFiniteError(f"{e} {kept}.") from None
    finally:
        if progress is not None:
            progress.close()
        # The checkpointer waits for the last asynchronous save; the writer uploads.
        _close_all(checkpointer.close, watcher.close, writer.close, failing=not completed)
    return Outcome(state, step, preempted, eval_metrics)


def _close_all(*closers, failing: bool) -> None:
    """Calls every closer. If the run is failing, a closer's own failure is logged (the
    run's error is the one to report); otherwise the first one is raised, the others
    logged."""
    first: Exception | None = None
    for close in closers:
        try:
            close()
        except Exception as error:  # noqa: BLE001 - see the docstring
            if failing or first is not None:
                logger.warning("%s", " ".join(str(error).split()) or type(error).__name__)
            elif first is None:
                first = error
    if first is not None:
        raise first
