"""The pretraining run: `train_and_evaluate(settings, workdir)` is the job behind train.py.

It prepares (or finds) the data, builds the steps (bertjax.pretrain.objective) and hands
them to the shared loop (bertjax.engine.loop) with what only pretraining knows: the loader's
position and the dropout key saved in each checkpoint, eval batches from the held-out split,
throughput figures, and at the end the baselines and fill-mask samples of the summary.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import data, encoders
from bertjax.data.mixture import MixtureLoader, make_mixture_loader
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import loop as loop_lib
from bertjax.engine import metrics_writer, perf, rundir, steps
from bertjax.engine.settings import check_mesh_fits
from bertjax.pretrain import objectives
from bertjax.pretrain.data import PreparedSource, ensure_data, ensure_sources
from bertjax.pretrain.objective import build_pretraining
from bertjax.pretrain.settings import PretrainSettings
from bertjax.storage import fs
from bertjax.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


def held_out_metrics(
    run: steps.Steps,
    params,
    make_batches: Callable[[], Any],
    max_batches: int,
    metrics_of: Callable[[Any, str], dict[str, jax.Array]],
) -> dict[str, float]:
    """Eval metrics summed over the held-out split (or its first max_batches batches), named
    by the run's objective (`metrics_of(sums, prefix)`, its steps.Loss.metrics)."""
    totals = None
    for index, local_batch in enumerate(make_batches()):
        if max_batches and index >= max_batches:
            break
        batch = steps.global_batch(local_batch, run.batch_sharding, jax.process_count())
        sums = run.eval_step(params, run.with_features(batch))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    if totals is None:
        return {}
    metrics = metrics_of(totals, "eval")
    return {k: float(v) for k, v in metrics.items()}


@dataclasses.dataclass
class _Hooks:
    """What the shared loop asks of a pretraining run (bertjax.engine.loop.LoopHooks)."""

    settings: PretrainSettings
    model_config: Any  # the encoder family's config
    run: steps.Steps
    tokenizer: Tokenizer
    train_loader: data.Loader
    eval_batches: Callable[[], Any]
    checkpoint_dir: fs.AnyPath
    dropout_rng: jax.Array | None = None
    # A run started from another's parameters (config.init_from): where from, what changed.
    phase: dict | None = None
    # A mixture's sources (data.sources) and their directories; empty for one corpus.
    sources: tuple[PreparedSource, ...] = ()
    # The objective's eval metrics of summed statistics: (sums, prefix) -> {name: value}.
    metrics_of: Callable[[Any, str], dict[str, jax.Array]] | None = None

    def fresh(self) -> tuple[steps.TrainState, jax.Array]:
        params_rng, self.dropout_rng = jax.random.split(jax.random.key(self.settings.run.seed))
        state = self.run.state.init(params_rng)
        init_from = self.settings.run.init_from
        objective = objectives.get(self.settings.objective)
        given = objective.initial_params(
            self.model_config, self.settings.objective_settings, self.run.state.abstract.params
        )
        if given is not None:
            state = state.replace(params=given)
            print(f"Initialised parameters as the objective gives them ({objective.name})")
        elif init_from:
            params, start = rundir.restore_run_params(
                init_from, self.tokenizer, self.model_config, self.run.state.abstract.params
            )
            state = state.replace(params=params)
            self.phase = dataclasses.asdict(start)
            # The mixture the parameters were trained on, beside this phase's (meta "mixture");
            # a source trained on one corpus records none.
            before = checkpoint_lib.read_meta(rundir.checkpoint_dir(init_from)).get("mixture")
            if before is not None:
                self.phase["mixture_before"] = before
            print(f"Initialised parameters from {start.describe()}; the optimizer starts fresh")
        return state, self.dropout_rng

    def resumed(self, restored: checkpoint_lib.Restored) -> jax.Array:
        self.phase = restored.meta.get("phase")
        self.train_loader.set_state(restored.meta["loader_state"])
        print(f"Resumed from {self.checkpoint_dir} at step {restored.step}")
        key_data = np.asarray(restored.meta["dropout_rng"], np.uint32)
        self.dropout_rng = jax.random.wrap_key_data(key_data)
        return self.dropout_rng

    def batch(self, step: int) -> dict[str, np.ndarray]:
        # During a batch-size warmup a step takes several of the loader's (smaller) batches;
        # the loader's position counts them, so a resumed run continues with the same rows.
        run = self.settings.run
        pieces = run.batch_size_at(step) // run.loader_batch_size
        if pieces == 1:
            return next(self.train_loader)
        parts = [next(self.train_loader) for _ in range(pieces)]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def eval_metrics(self, state: steps.TrainState, step: int) -> dict[str, float]:
        metrics = held_out_metrics(
            self.run,
            state.params,
            self.eval_batches,
            self.settings.run.eval_batches,
            self.metrics_of,
        )
        if isinstance(self.train_loader, MixtureLoader):  # the realised shares so far
            shares = self.train_loader.shares()
            metrics.update({f"data/share/{name}": value for name, value in shares.items()})
        # What the objective sees going wrong in them (an ELECTRA generator grown too strong).
        for caution in objectives.get(self.settings.objective).cautions(metrics):
            logger.warning("step %d: %s", step, caution)
        return metrics

    def meta(self, step: int) -> dict:
        objective = objectives.get(self.settings.objective)
        recorded = objective.run_meta(self.model_config, self.settings.objective_settings)
        return {
            "loader_state": self.train_loader.get_state(),
            # Dropout keys are folded from this with the step: all the RNG state.
            "dropout_rng": np.asarray(jax.random.key_data(self.dropout_rng)).tolist(),
            "model_config": encoders.config_to_dict(self.model_config),
            "tokenizer_fingerprint": self.tokenizer.fingerprint,
            "config": self.settings.config,
            **({"phase": self.phase} if self.phase else {}),
            **({"mixture": self.mixture()} if self.sources else {}),
            # What the objective's networks need to open (engine.networks), if anything.
            **({objectives.RUN_META_KEY: recorded} if recorded else {}),
        }

    def mixture(self) -> dict:
        """This phase's sources and weights, and each one's share of the batches so far."""
        assert isinstance(self.train_loader, MixtureLoader)
        return {
            "sources": [prepared.to_dict() for prepared in self.sources],
            "asked": self.train_loader.asked(),
            "realised": self.train_loader.shares(),
        }


class _Throughput(perf.Throughput):
    """perf.Throughput with the batch size of each step (they differ during batch warmup)."""

    def __init__(self, batch_size_at: Callable[[int], int], *args):
        self._batch_size_at = batch_size_at
        super().__init__(batch_size_at(0), *args)

    def metrics(self, step: int) -> dict[str, float]:
        if step > self._step:  # the mean batch of the steps since the last restart
            sizes = [self._batch_size_at(s) for s in range(self._step, step)]
            self._batch_size = sum(sizes) / len(sizes)
        return super().metrics(step)


def train_and_evaluate(settings: PretrainSettings, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) pretraining in workdir; returns the final summary."""
    start_time = time.time()
    # Reachable (a gs:// path needs the gcs extra, a bucket that exists) before any write.
    workdir_path = fs.path(workdir)
    if settings.data.dir:
        fs.path(settings.data.dir)
    workdir_path = fs.makedirs(workdir_path)
    is_main_process = jax.process_index() == 0
    lock = rundir.WorkdirLock(workdir_path)
    if is_main_process:
        lock.acquire()
    try:
        return _train(settings, workdir_path, start_time, is_main_process)
    finally:
        lock.release()


def _train(settings, workdir_path, start_time, is_main_process) -> dict[str, Any]:
    run_settings, data_settings = settings.run, settings.data
    data_kwargs = dict(
        eval_batch_size=run_settings.micro_batch_size,
        seed=run_settings.seed,
        # A new phase's data is tokenized as its parameters were trained; a teacher's as it
        # reads text.
        default_tokenizer=(
            rundir.trained_tokenizer(run_settings.init_from)
            if run_settings.init_from
            else objectives.get(settings.objective).tokenizer_from(settings.objective_settings)
        ),
    )
    sources: tuple[PreparedSource, ...] = ()
    if data_settings.sources:
        prepared, tokenizer = ensure_sources(data_settings, workdir_path, **data_kwargs)
        sources = tuple(prepared)
        data_dir = sources[0].dir  # a mixture is evaluated on its first source's held-out split
    else:
        data_dir, tokenizer = ensure_data(data_settings, workdir_path, **data_kwargs)
    model_config = settings.model_config(tokenizer)
    family = encoders.family_of(model_config)
    objective = objectives.get(settings.objective)
    run = build_pretraining(settings, model_config, tokenizer)
    check_mesh_fits(model_config, run.mesh)

    def make_loader(split: str, global_batch_size: int, masking, **kwargs) -> data.Loader:
        return data.make_loader(
            data_dir,
            split=split,
            batch_size=global_batch_size // jax.process_count(),
            seed=run_settings.seed,
            masking=masking,
            expected_max_seq_length=data_settings.max_seq_length,
            expected_tokenizer_fingerprint=tokenizer.fingerprint,
            **kwargs,
        )

    def eval_batches():
        return make_loader(
            "eval",
            run_settings.micro_batch_size,
            data_settings.eval_masking,
            shuffle=False,
            num_epochs=1,
        )

    checkpointer = checkpoint_lib.Checkpointer(
        workdir_path / rundir.CHECKPOINT_DIR,
        max_to_keep=run_settings.keep_checkpoints,
        save_interval_steps=run_settings.checkpoint_every_steps,
    )
    try:
        if checkpointer.latest_step() is not None:
            rundir.check_compatible(
                checkpoint_lib.read_meta(checkpointer.directory),
                tokenizer,
                model_config,
                f"the checkpoint in {checkpointer.directory}",
            )
    except Exception:
        checkpointer.close()
        raise
    if sources:
        train_loader = make_mixture_loader(
            [(prepared.source, prepared.dir) for prepared in sources],
            batch_size=run_settings.loader_batch_size // jax.process_count(),
            seed=run_settings.seed,
            masking=data_settings.masking,
            expected_max_seq_length=data_settings.max_seq_length,
            expected_tokenizer_fingerprint=tokenizer.fingerprint,
        )
    else:
        train_loader = make_loader("train", run_settings.loader_batch_size, data_settings.masking)
    writer = metrics_writer.MetricWriter(
        workdir_path / rundir.METRICS_FILE,
        workdir_path / rundir.TENSORBOARD_DIR,
        enabled=is_main_process,
    )
    throughput = _Throughput(
        run_settings.batch_size_at,
        data_settings.max_seq_length,
        objective.flops(
            family,
            model_config,
            data_settings.max_seq_length,
            data_settings.masking.max_predictions_per_seq,
            settings.objective_settings,
        ),
        perf.peak_flops_per_device(
            jax.devices()[0].device_kind,
            model_config.dtype,
            override=run_settings.peak_flops_per_device or None,
        ),
        0,
    )
    total_steps = run_settings.num_train_steps
    plan = loop_lib.Plan(
        run,
        checkpointer,
        writer,
        loop_lib.Cadence(
            total_steps=total_steps,
            period=total_steps,
            log_every=run_settings.log_every_steps,
            eval_every=run_settings.eval_every_steps,
            checkpoint_every=run_settings.checkpoint_every_steps,
        ),
        is_main_process,
        throughput,
    )
    hooks = _Hooks(
        settings,
        model_config,
        run,
        tokenizer,
        train_loader,
        eval_batches,
        checkpointer.directory,
        sources=sources,
        metrics_of=objective.step(family, model_config, settings).metrics,
    )
    outcome = loop_lib.train(plan, hooks)

    result = {
        "steps": outcome.step,
        "preempted": outcome.preempted,
        "wall_time_sec": time.time() - start_time,
        "eval": outcome.eval_metrics,
        "checkpoint_dir": str(checkpointer.directory),
        "workdir": str(workdir_path),
        "data_dir": str(data_dir),
    }
    if sources:
        result["mixture"] = hooks.mixture()
    if is_main_process and outcome.eval_metrics:
        result["baselines"] = eval_baselines(settings, data_dir, outcome.eval_metrics)
    # Sampling runs the model outside the training mesh's collectives: one process only.
    if run_settings.fill_mask_samples and jax.process_count() == 1 and not outcome.preempted:
        result["samples"] = objective.samples(
            model_config,
            outcome.state.params,
            tokenizer,
            data_dir,
            run_settings.fill_mask_samples,
            run.mesh,
            settings.objective_settings,
        )
        result["samples_title"] = objective.samples_title
    if is_main_process:
        print_summary(result)
    return result


def eval_baselines(
    settings: PretrainSettings, data_dir: fs.AnyPath, eval_metrics: dict | None = None
) -> dict[str, float]:
    """What the eval accuracies of a model that learned nothing would be, on the same batches
    (the run's objective says which; `eval_metrics` are the run's last)."""
    return objectives.get(settings.objective).baselines(settings, data_dir, eval_metrics)


def print_summary(result: dict[str, Any]) -> None:
    lines = [
        "",
        "Training finished" if not result["preempted"] else "Training stopped for preemption",
        f"  steps:       {result['steps']}",
        f"  wall time:   {result['wall_time_sec']:.1f} s",
    ]
    baselines = result.get("baselines", {})
    for key, value in sorted(result["eval"].items()):
        if key.startswith("data/"):  # a mixture's shares: shown beside the asked ones below
            continue
        line = f"  {key + ':':<26}{value:.4f}"
        if key in baselines:  # what always answering the commonest token or label scores
            line += f"   (baseline {baselines[key]:.4f}, {value / baselines[key]:.1f}x)"
        lines.append(line)
    metrics_file = fs.path(result["workdir"]) / rundir.METRICS_FILE
    lines += [
        f"  checkpoints: {result['checkpoint_dir']}",
        f"  metrics:     {metrics_file} (and TensorBoard events)",
        f"  data:        {result['data_dir']}",
        *_mixture_lines(result.get("mixture")),
        f"  load it:     bertjax.Model.load({result['workdir']!r})",
    ]
    if result.get("samples"):
        lines += ["", result.get("samples_title", "Fill-mask on held-out text (top 3):")]
        lines += [f"  {line}" for line in result["samples"]]
    print("\n".join(lines), flush=True)


def _mixture_lines(mixture: dict | None) -> list[str]:
    """The summary's lines on a mixture: each source's realised share beside the asked one."""
    if not mixture:
        return []
    lines = ["  mixture:     share of the training examples (asked)"]
    for name, asked in mixture["asked"].items():
        lines.append(f"    {name + ':':<14}{mixture['realised'][name]:.4f}   ({asked:.4f})")
    return lines
