"""The pretraining loop: restore, iterate, log, evaluate, checkpoint, stop on preemption.

`train_and_evaluate(settings, workdir)` is the whole job behind `python train.py`. The
pieces it stands on live elsewhere: validated settings in `settings.py`, the work
directory's layout, data and compatibility checks in `workdir.py`, the state and the
jitted steps in `steps.py`, throughput in `perf.py`, checkpoints in `checkpoint.py`.
"""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import checkpoint as checkpoint_lib
from bertjax import data as data_lib
from bertjax import inference, losses, metrics_writer, perf, steps
from bertjax import workdir as workdir_lib
from bertjax.data import baseline
from bertjax.settings import PretrainSettings, check_mesh_fits
from bertjax.tokenizer import Tokenizer


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


def evaluate(
    run: steps.Pretraining, params, make_batches: Callable[[], Any], max_batches: int
) -> dict[str, float]:
    """Eval metrics summed over the held-out split (or its first max_batches batches)."""
    totals = None
    for index, local_batch in enumerate(make_batches()):
        if max_batches and index >= max_batches:
            break
        batch = steps.global_batch(local_batch, run.batch_sharding, jax.process_count())
        sums = run.eval_step(params, batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    if totals is None:
        return {}
    return {k: float(v) for k, v in losses.metrics(totals, "eval").items()}


def restore_or_init(
    settings: PretrainSettings,
    run: steps.Pretraining,
    checkpointer: checkpoint_lib.Checkpointer,
    train_loader: data_lib.Loader,
    tokenizer: Tokenizer,
) -> tuple[steps.TrainState, jax.Array]:
    """(state, dropout key): the latest good checkpoint's (and its loader position), else fresh."""
    if checkpointer.latest_step() is not None:
        workdir_lib.check_compatible(
            checkpoint_lib.read_meta(checkpointer.directory),
            tokenizer,
            run.model_config,
            f"the checkpoint in {checkpointer.directory}",
        )
    restored = checkpointer.restore(
        abstract_params=run.state.abstract.params,
        abstract_opt_state=run.state.abstract.opt_state,
    )
    if restored is not None:
        train_loader.set_state(restored.meta["loader_state"])
        print(f"Resumed from {checkpointer.directory} at step {restored.step}")
        step = jax.device_put(jnp.asarray(restored.step, jnp.int32), run.state.shardings.step)
        dropout_rng = jax.random.wrap_key_data(np.asarray(restored.meta["dropout_rng"], np.uint32))
        state = steps.TrainState(step=step, params=restored.params, opt_state=restored.opt_state)
        return state, dropout_rng
    params_rng, dropout_rng = jax.random.split(jax.random.key(settings.run.seed))
    state = run.state.init(params_rng)
    if settings.run.init_from:
        params = workdir_lib.initial_params(
            settings.run.init_from, tokenizer, run.model_config, run.state.abstract.params
        )
        state = state.replace(params=params)
        print(f"Initialised parameters from {settings.run.init_from}")
    return state, dropout_rng


def train_and_evaluate(settings: PretrainSettings, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) pretraining in workdir; returns the final summary."""
    start_time = time.time()
    workdir_path = pathlib.Path(workdir)
    workdir_path.mkdir(parents=True, exist_ok=True)
    is_main_process = jax.process_index() == 0
    lock = workdir_lib.WorkdirLock(workdir_path)
    if is_main_process:
        lock.acquire()
    try:
        return _train(settings, workdir_path, start_time, is_main_process)
    finally:
        lock.release()


def _train(settings, workdir_path, start_time, is_main_process) -> dict[str, Any]:
    run_settings, data_settings = settings.run, settings.data
    data_dir, tokenizer = workdir_lib.ensure_data(
        data_settings,
        workdir_path,
        eval_batch_size=run_settings.micro_batch_size,
        seed=run_settings.seed,
    )
    model_config = settings.model_config(tokenizer.vocab_size)
    run = steps.build_pretraining(settings, model_config)
    check_mesh_fits(model_config, run.mesh)

    def make_loader(split: str, global_batch_size: int, **kwargs) -> data_lib.Loader:
        return data_lib.make_loader(
            data_dir,
            split=split,
            batch_size=global_batch_size // jax.process_count(),
            seed=run_settings.seed,
            masking=data_settings.masking,
            expected_max_seq_length=data_settings.max_seq_length,
            expected_tokenizer_fingerprint=tokenizer.fingerprint,
            **kwargs,
        )

    def eval_batches():
        return make_loader("eval", run_settings.micro_batch_size, shuffle=False, num_epochs=1)

    train_loader = make_loader("train", run_settings.batch_size)
    checkpointer = checkpoint_lib.Checkpointer(
        workdir_path / workdir_lib.CHECKPOINT_DIR,
        max_to_keep=run_settings.keep_checkpoints,
        save_interval_steps=run_settings.checkpoint_every_steps,
    )
    writer = metrics_writer.MetricWriter(
        workdir_path / workdir_lib.METRICS_FILE,
        workdir_path / workdir_lib.TENSORBOARD_DIR,
        enabled=is_main_process,
    )
    watcher = PreemptionWatcher(checkpointer)
    eval_metrics: dict[str, float] = {}
    preempted = False
    try:
        # Tracing the model needs the mesh in context for its sharding constraints.
        with jax.set_mesh(run.mesh):
            state, dropout_rng = restore_or_init(
                settings, run, checkpointer, train_loader, tokenizer
            )
            step = first_step = int(state.step)
            total_steps = run_settings.num_train_steps
            progress = metrics_writer.Progress(total_steps, step, enabled=is_main_process)
            throughput = perf.Throughput(
                run_settings.batch_size,
                data_settings.max_seq_length,
                perf.training_flops_per_sequence(
                    model_config,
                    data_settings.max_seq_length,
                    data_settings.masking.max_predictions_per_seq,
                ),
                perf.peak_flops_per_device(
                    jax.devices()[0].device_kind,
                    model_config.dtype,
                    override=run_settings.peak_flops_per_device or None,
                ),
                step,
            )
            pending: list[dict[str, jax.Array]] = []  # per-step metrics not yet logged

            def save(force: bool) -> None:
                raise_if_nonfinite(pending[-1:], step)  # the steps before were checked
                meta = {
                    "loader_state": train_loader.get_state(),
                    # Dropout keys are folded from this with the step: all the RNG state.
                    "dropout_rng": np.asarray(jax.random.key_data(dropout_rng)).tolist(),
                    "model_config": model_config.to_dict(),
                    "tokenizer_fingerprint": tokenizer.fingerprint,
                    "config": settings.config,
                }
                checkpointer.save(
                    step, params=state.params, opt_state=state.opt_state, meta=meta, force=force
                )

            while step < total_steps:
                batch = steps.global_batch(
                    next(train_loader), run.batch_sharding, jax.process_count()
                )
                state, metrics = run.train_step(state, batch, dropout_rng)
                step += 1
                pending.append(metrics)
                progress.update(step)
                if len(pending) >= 2:  # the previous step has finished by now: stop on it
                    raise_if_nonfinite(pending[-2:-1], step - 1)
                checkpointer.check_for_errors()  # a failed background write stops the run now
                if step == first_step + 1:  # the first step compiled: time from here on
                    jax.block_until_ready(metrics)
                    throughput.restart(step)

                at_end = step == total_steps
                if step % run_settings.log_every_steps == 0 or at_end:
                    summary = summarise(pending, step)  # waits for the device
                    summary.update(throughput.metrics(step))
                    writer.write(step, summary)
                    progress.show(summary)
                    pending = []
                if step % run_settings.eval_every_steps == 0 or at_end:
                    eval_metrics = evaluate(
                        run, state.params, eval_batches, run_settings.eval_batches
                    )
                    writer.write(step, eval_metrics)
                    progress.show(eval_metrics)
                    throughput.restart(step)
                if watcher.should_stop(step):
                    save(force=True)
                    preempted = True
                    print(
                        f"\nPreempted: saved step {step} to {checkpointer.directory}; "
                        "rerun the same command to resume."
                    )
                    break
                if step % run_settings.checkpoint_every_steps == 0 or at_end:
                    save(force=at_end)
            progress.close()
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
        checkpointer.close()  # waits for the last asynchronous save
        watcher.close()
        writer.close()

    result = {
        "steps": step,
        "preempted": preempted,
        "wall_time_sec": time.time() - start_time,
        "eval": eval_metrics,
        "checkpoint_dir": str(checkpointer.directory),
        "workdir": str(workdir_path),
        "data_dir": str(data_dir),
    }
    if is_main_process and eval_metrics:
        result["baselines"] = eval_baselines(settings, data_dir)
    # Sampling runs the model outside the training mesh's collectives: one process only.
    if run_settings.fill_mask_samples and jax.process_count() == 1 and not preempted:
        texts = inference.held_out_texts(data_dir, tokenizer, run_settings.fill_mask_samples)
        result["samples"] = inference.fill_mask_samples(
            model_config, state.params, tokenizer, texts, mesh=run.mesh
        )
    if is_main_process:
        print_summary(result)
    return result


def eval_baselines(settings: PretrainSettings, data_dir: pathlib.Path) -> dict[str, float]:
    """What the eval accuracies of a model that learned nothing would be, on the same batches."""
    batches = {
        "batch_size": settings.run.micro_batch_size,
        "max_batches": settings.run.eval_batches,
    }
    unigram = baseline.unigram_baseline(
        data_dir, masking=settings.data.masking, seed=settings.run.seed, **batches
    )
    return {
        "eval/mlm_accuracy": unigram.accuracy,
        "eval/nsp_accuracy": baseline.sentence_pair_baseline(data_dir, **batches),
    }


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


def summarise(pending: list[dict[str, jax.Array]], step: int) -> dict[str, float]:
    """Means of the metrics of the last steps; stops the run on a non-finite step."""
    host = jax.device_get(pending)
    raise_if_nonfinite(host, step)
    keys = [k for k in host[0] if k != "train/nonfinite"]
    summary = {k: float(np.mean([m[k] for m in host])) for k in keys}
    summary["train/learning_rate"] = float(host[-1]["train/learning_rate"])
    return summary


def print_summary(result: dict[str, Any]) -> None:
    lines = [
        "",
        "Training finished" if not result["preempted"] else "Training stopped for preemption",
        f"  steps:       {result['steps']}",
        f"  wall time:   {result['wall_time_sec']:.1f} s",
    ]
    baselines = result.get("baselines", {})
    for key, value in sorted(result["eval"].items()):
        line = f"  {key + ':':<26}{value:.4f}"
        if key in baselines:  # what always answering the commonest token or label scores
            line += f"   (baseline {baselines[key]:.4f}, {value / baselines[key]:.1f}x)"
        lines.append(line)
    metrics_file = pathlib.Path(result["workdir"]) / workdir_lib.METRICS_FILE
    lines += [
        f"  checkpoints: {result['checkpoint_dir']}",
        f"  metrics:     {metrics_file} (and TensorBoard events)",
        f"  data:        {result['data_dir']}",
        f"  load it:     bertjax.Model.load({result['workdir']!r})",
    ]
    if result.get("samples"):
        lines += ["", "Fill-mask on held-out text (top 3):"]
        lines += [f"  {line}" for line in result["samples"]]
    print("\n".join(lines), flush=True)
