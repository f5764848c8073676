"""Pretraining: state creation, the jitted train and eval steps, and the training loop.

`train_and_evaluate(config, workdir)` is the whole job behind `python train.py`: it prepares
the data when the work directory has none, builds the mesh, creates the train state directly
sharded, resumes from the latest good checkpoint, trains with periodic evaluation, logging and
checkpoints, saves and exits cleanly on SIGTERM, and prints a summary.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import pathlib
import shutil
import signal
import time
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from bertjax import checkpoint as checkpoint_lib
from bertjax import data as data_lib
from bertjax import losses, metrics_writer, optim, perf, sharding
from bertjax import model as model_lib
from bertjax import workdir as workdir_lib
from bertjax.data import instances
from bertjax.model import BertConfig, BertForPreTraining
from bertjax.tokenizer import Tokenizer

DATA_DIR = "data"
CORPUS_DIR = "corpus"  # the demo corpus cache
CHECKPOINT_DIR = workdir_lib.CHECKPOINT_DIR


class ConfigError(ValueError):
    """A training config value that cannot work; the message names the field."""


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training, as one pytree."""

    step: jax.Array
    params: Any
    opt_state: Any


# ----------------------------------------------------------------------------- config


def model_config_from(config: ml_collections.ConfigDict, vocab_size: int) -> BertConfig:
    """The BertConfig a training config asks for, with the tokenizer's vocabulary size."""
    overrides = dict(config.model)
    preset = overrides.pop("preset")
    requested_vocab = overrides.pop("vocab_size")
    if requested_vocab and requested_vocab != vocab_size:
        raise ConfigError(
            f"config.model.vocab_size={requested_vocab} does not match the tokenizer's "
            f"vocabulary of {vocab_size}; set it to 0 to take the tokenizer's size"
        )
    try:
        return BertConfig.preset(preset, vocab_size=vocab_size, **overrides)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.model: {e}") from e


def optimizer_settings_from(config: ml_collections.ConfigDict) -> optim.OptimizerSettings:
    try:
        return optim.OptimizerSettings(total_steps=config.num_train_steps, **dict(config.optimizer))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.optimizer: {e}") from e


def masking_settings_from(config: ml_collections.ConfigDict) -> data_lib.MaskingSettings:
    return data_lib.MaskingSettings(
        masked_lm_prob=config.data.masked_lm_prob,
        max_predictions_per_seq=config.data.max_predictions_per_seq,
        whole_word_masking=config.data.whole_word_masking,
    )


def validate_config(
    config: ml_collections.ConfigDict, *, devices=None, process_count: int = 1
) -> None:
    """Fails with a ConfigError naming the field when a config value cannot work."""

    def require(ok: bool, field: str, message: str) -> None:
        if not ok:
            raise ConfigError(f"config.{field}={config_get(config, field)!r}: {message}")

    for field in (
        "num_train_steps",
        "batch_size",
        "grad_accum_steps",
        "log_every_steps",
        "eval_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "data.max_seq_length",
        "data.max_predictions_per_seq",
    ):
        value = config_get(config, field)
        require(isinstance(value, int) and value > 0, field, "must be a positive integer")
    require(config.eval_batches >= 0, "eval_batches", "must be >= 0 (0 evaluates the whole split)")
    require(0.0 < config.data.masked_lm_prob < 1.0, "data.masked_lm_prob", "must be in (0, 1)")
    require(
        config.data.max_predictions_per_seq <= config.data.max_seq_length,
        "data.max_predictions_per_seq",
        f"must be <= data.max_seq_length={config.data.max_seq_length}",
    )
    require(
        config.peak_flops_per_device >= 0,
        "peak_flops_per_device",
        "must be >= 0 (0: look up the device)",
    )
    require(
        isinstance(config.token_capacity, (int, float)) and 0.0 < config.token_capacity <= 1.0,
        "token_capacity",
        "must be in (0, 1] (1 turns token packing off)",
    )

    try:
        mesh = sharding.make_mesh(tuple(config.mesh_shape), devices=devices)
    except ValueError as e:
        raise ConfigError(f"config.mesh_shape={tuple(config.mesh_shape)}: {e}") from e
    mesh_shape = tuple(mesh.shape.values())
    data_parallel = sharding.data_parallel_size(mesh)
    micro_batch, remainder = divmod(config.batch_size, config.grad_accum_steps)
    require(
        remainder == 0,
        "batch_size",
        f"must be divisible by grad_accum_steps={config.grad_accum_steps}",
    )
    require(
        micro_batch % data_parallel == 0,
        "batch_size",
        f"each micro-batch ({micro_batch} = batch_size / grad_accum_steps) must be divisible by "
        f"the data-parallel size {data_parallel} (mesh data x fsdp of {mesh_shape})",
    )
    require(
        config.batch_size % process_count == 0,
        "batch_size",
        f"must be divisible by the number of processes ({process_count})",
    )
    # Each process feeds its own rows, so the batch must be split across processes.
    require(
        data_parallel % process_count == 0,
        "mesh_shape",
        f"the data-parallel size {data_parallel} (data x fsdp) must be a multiple of the "
        f"{process_count} processes, so that every process holds its own batch rows",
    )

    # The model config validates its own fields; probe it with a placeholder vocabulary.
    model_config = model_config_from(config, vocab_size=max(config.model.vocab_size, 8))
    require(
        config.data.max_seq_length <= model_config.max_position_embeddings,
        "data.max_seq_length",
        f"exceeds the model's max_position_embeddings={model_config.max_position_embeddings}",
    )
    optimizer_settings_from(config)
    masking_settings_from(config)
    require(config.data.task in instances.TASKS, "data.task", f"must be one of {instances.TASKS}")
    require(
        0.0 < config.data.eval_fraction < 1.0,
        "data.eval_fraction",
        "must be in (0, 1): evaluation needs a held-out split",
    )

    for path in data_inputs(config):
        require(
            os.path.exists(path) or bool(glob.glob(path, recursive=True)),
            "data.input",
            f"{path!r} matches no file or directory",
        )
    if config.data.dir and not data_inputs(config):
        require(
            (pathlib.Path(config.data.dir) / data_lib.MANIFEST_FILE).exists(),
            "data.dir",
            "holds no prepared data (no manifest) and data.input names nothing to prepare; "
            "run python -m bertjax.data.prepare or set data.input",
        )
    if config.data.tokenizer:
        require(os.path.isfile(config.data.tokenizer), "data.tokenizer", "no such file")
    require(
        config.init_from is not None,
        "init_from",
        "this recipe continues another run: set --config.init_from=<its workdir>",
    )
    if config.init_from:
        require(
            os.path.exists(config.init_from), "init_from", "no such workdir or checkpoint directory"
        )


def config_get(config: ml_collections.ConfigDict, dotted: str) -> Any:
    value = config
    for part in dotted.split("."):
        value = value[part]
    return value


def data_inputs(config: ml_collections.ConfigDict) -> list[str]:
    """config.data.input as a list: comma-separated files, globs or directories."""
    return [path.strip() for path in config.data.input.split(",") if path.strip()]


# ----------------------------------------------------------------------------- data


def ensure_data(config: ml_collections.ConfigDict, workdir: str) -> tuple[pathlib.Path, Tokenizer]:
    """(prepared data directory, its tokenizer), preparing it on process 0 when it has none.

    With neither data.dir nor data.input set, the built-in demo corpus is prepared into
    <workdir>/data. Every process waits for process 0 (the directories are shared).
    """
    data_dir = pathlib.Path(config.data.dir or os.path.join(workdir, DATA_DIR))
    if jax.process_index() == 0 and not (data_dir / data_lib.MANIFEST_FILE).exists():
        inputs = data_inputs(config)
        if not inputs:
            inputs = [str(data_lib.demo_corpus_path(pathlib.Path(workdir) / CORPUS_DIR))]
            print(f"No data.input given: using the built-in demo corpus {inputs[0]}")
        print(f"Preparing data into {data_dir} ...")
        data_lib.prepare(
            inputs,
            data_dir,
            max_seq_length=config.data.max_seq_length,
            max_predictions_per_seq=config.data.max_predictions_per_seq,
            vocab_size=config.data.vocab_size,
            tokenizer_path=config.data.tokenizer or None,
            tokenizer_model_type=config.data.tokenizer_model_type,
            lowercase=config.data.lowercase,
            task=config.data.task,
            dupe_factor=config.data.dupe_factor,
            short_seq_prob=config.data.short_seq_prob,
            eval_fraction=config.data.eval_fraction,
            workers=config.data.workers or None,
            seed=config.seed,
        )
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("bertjax:data_prepared")

    manifest = data_lib.read_manifest(data_dir)
    if manifest["max_seq_length"] != config.data.max_seq_length:
        raise ConfigError(
            f"config.data.max_seq_length={config.data.max_seq_length} but {data_dir} was prepared "
            f"with max_seq_length={manifest['max_seq_length']}; prepare a new directory or match it"
        )
    tokenizer = Tokenizer.load(data_dir / data_lib.TOKENIZER_FILE)
    if config.data.tokenizer:
        wanted = Tokenizer.load(config.data.tokenizer)
        if wanted.fingerprint != tokenizer.fingerprint:
            raise ConfigError(
                f"config.data.tokenizer={config.data.tokenizer!r} (fingerprint {wanted.fingerprint[:12]}) "
                f"is not the tokenizer {data_dir} was prepared with ({tokenizer.fingerprint[:12]})"
            )
    eval_examples = manifest["splits"]["eval"]["num_instances"]
    if eval_examples < eval_batch_size(config):
        raise ConfigError(
            f"config.data.eval_fraction={config.data.eval_fraction}: {data_dir} holds {eval_examples} "
            f"eval instances, fewer than one eval batch ({eval_batch_size(config)} = batch_size / "
            "grad_accum_steps); prepare with a larger eval fraction"
        )
    return data_dir, tokenizer


def eval_batch_size(config: ml_collections.ConfigDict) -> int:
    """Evaluation runs on micro-batch sized batches: they fit wherever training fits."""
    return config.batch_size // config.grad_accum_steps


# Fields that fix the parameter shapes: a checkpoint must agree on them to be usable.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "position_embedding_type",
    "scan_layers",
)


def check_compatible(meta: dict, tokenizer: Tokenizer, model_config: BertConfig, what: str) -> None:
    """Fails, naming the difference, unless a checkpoint fits this run's tokenizer and model.

    Checked on the checkpoint's small meta item before any array is read, so a config
    mistake is reported as one rather than as an unreadable checkpoint.
    """
    if meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise ConfigError(
            f"{what} was trained with tokenizer {meta['tokenizer_fingerprint'][:12]}, but the run's data "
            f"uses {tokenizer.fingerprint[:12]}; point config.data.dir at the data it was trained on"
        )
    source = meta["model_config"]
    for field in ARCHITECTURE_FIELDS:
        if source[field] != getattr(model_config, field):
            raise ConfigError(
                f"{what} has a model with {field}={source[field]!r}, this run's config.model gives "
                f"{getattr(model_config, field)!r}"
            )


def global_batch(
    local_batch: dict[str, np.ndarray], batch_sharding: jax.sharding.Sharding, process_count: int
) -> dict[str, jax.Array]:
    """Assembles each process's rows into global arrays sharded over the data axes."""
    out = {}
    for name, local in local_batch.items():
        global_shape = (local.shape[0] * process_count,) + local.shape[1:]
        out[name] = jax.make_array_from_process_local_data(batch_sharding, local, global_shape)
    return out


# ----------------------------------------------------------------------------- steps


def packed_length(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> int | None:
    """Token slots per batch shard when the encoder packs tokens, or None (packing off).

    config.token_capacity of the slots of one shard of a micro-batch, rounded up to a
    multiple of 8; None when that leaves no padding to skip.
    """
    rows = config.batch_size // config.grad_accum_steps // sharding.shards(sharding.BATCH, mesh)
    slots = rows * config.data.max_seq_length
    length = -(-math.ceil(config.token_capacity * slots) // 8) * 8
    return length if length < slots else None


def make_train_step(
    model: BertForPreTraining,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum_steps: int,
    micro_batch_sharding: jax.sharding.NamedSharding | None = None,
    packed_length: int | None = None,
) -> Callable:
    """Builds the pure `train_step(state, batch, rng) -> (state, metrics)`.

    The loss of every micro-batch is normalised by the prediction and example counts of the
    whole global batch, so summing micro-batch gradients gives exactly the gradient of one
    large batch. A step whose loss or gradient is not finite leaves the state unchanged and
    reports `train/nonfinite`=1; the loop stops on it.

    With `packed_length` the encoder skips padding (BertModel's token packing) for every
    micro-batch whose real tokens fit in that many slots per batch shard; one that does not
    fit runs unpacked, with the same result. `train/packed` is the fraction that fit.
    """

    def fits(input_mask: jax.Array) -> jax.Array:
        groups = sharding.shards(sharding.BATCH)
        return jnp.max(model_lib.tokens_per_group(input_mask, groups)) <= packed_length

    def loss_fn(params, batch, mlm_denominator, nsp_denominator, rng, length):
        output = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
            deterministic=False,
            packed_length=length,
            rngs={"dropout": rng},
        )
        sums = losses.loss_sums(output.mlm_logits, output.nsp_logits, batch)
        return losses.total_loss(sums, mlm_denominator, nsp_denominator), sums

    def grad_fn(params, batch, mlm_denominator, nsp_denominator, rng):
        def grads(length: int | None):
            return lambda params: jax.grad(loss_fn, has_aux=True)(
                params, batch, mlm_denominator, nsp_denominator, rng, length
            )

        if packed_length is None:
            return grads(None)(params)
        # The conditional is taken around the gradient rather than differentiated through:
        # a differentiated one would carry both branches' activations.
        return jax.lax.cond(fits(batch["input_mask"]), grads(packed_length), grads(None), params)

    def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        mlm_denominator = jnp.sum(batch["masked_lm_weights"])
        nsp_denominator = jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32)
        if grad_accum_steps == 1:
            grads, sums = grad_fn(state.params, batch, mlm_denominator, nsp_denominator, step_rng)
        else:
            micro_batches = jax.tree.map(lambda x: split_micro_batches(x, grad_accum_steps), batch)
            if micro_batch_sharding is not None:
                micro_batches = jax.tree.map(
                    lambda x: jax.lax.with_sharding_constraint(x, micro_batch_sharding),
                    micro_batches,
                )

            def accumulate(carry, micro):
                grads_acc, sums_acc, index = carry
                grads, sums = grad_fn(
                    state.params,
                    micro,
                    mlm_denominator,
                    nsp_denominator,
                    jax.random.fold_in(step_rng, index),
                )
                return (
                    jax.tree.map(jnp.add, grads_acc, grads),
                    jax.tree.map(jnp.add, sums_acc, sums),
                    index + 1,
                ), None

            zeros_grads = jax.tree.map(jnp.zeros_like, state.params)
            zeros_sums = losses.LossSums(
                *(jnp.zeros((), jnp.float32) for _ in losses.LossSums._fields)
            )
            (grads, sums, _), _ = jax.lax.scan(
                accumulate, (zeros_grads, zeros_sums, 0), micro_batches
            )

        loss = losses.total_loss(sums, mlm_denominator, nsp_denominator)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def apply_update(_):
            updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
            return optax.apply_updates(state.params, updates), new_opt_state

        # A non-finite step keeps the last good state, so no bad value is ever checkpointed.
        # A conditional rather than a select: the update is skipped, not computed and discarded.
        new_params, new_opt_state = jax.lax.cond(
            finite, apply_update, lambda _: (state.params, state.opt_state), None
        )
        new_state = TrainState(step=state.step + 1, params=new_params, opt_state=new_opt_state)
        metrics = losses.metrics(sums, "train")
        if packed_length is not None:
            masks = split_micro_batches(batch["input_mask"], grad_accum_steps)
            metrics["train/packed"] = jnp.mean(jax.vmap(fits)(masks).astype(jnp.float32))
        metrics.update(
            {
                "train/loss": loss,
                "train/learning_rate": schedule(state.step),
                "train/grad_norm": grad_norm,
                "train/param_norm": optax.tree.norm(new_state.params),
                "train/nonfinite": 1.0 - finite.astype(jnp.float32),
            }
        )
        return new_state, metrics

    return train_step


def split_micro_batches(x: jax.Array, num_micro: int) -> jax.Array:
    """[B, ...] -> [num_micro, B / num_micro, ...], micro-batch k = rows k, k+A, k+2A, ...

    Strided rather than contiguous, so that every device keeps its own rows in every
    micro-batch and no data moves between devices.
    """
    rows = x.shape[0] // num_micro
    return x.reshape((rows, num_micro) + x.shape[1:]).swapaxes(0, 1)  # [A, B/A, ...]


def make_eval_step(model: BertForPreTraining) -> Callable:
    def eval_step(params, batch) -> losses.LossSums:
        output = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["masked_lm_positions"],
            deterministic=True,
        )
        return losses.loss_sums(output.mlm_logits, output.nsp_logits, batch)

    return eval_step


# ----------------------------------------------------------------------------- state


@dataclasses.dataclass
class Setup:
    """What the loop needs, built once: model, optimizer, mesh, shardings, jitted steps."""

    model_config: BertConfig
    model: BertForPreTraining
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    mesh: jax.sharding.Mesh
    state_shardings: TrainState
    abstract_state: TrainState
    batch_sharding: jax.sharding.NamedSharding
    init_state: Callable[[jax.Array], TrainState]
    train_step: Callable
    eval_step: Callable


def build(config: ml_collections.ConfigDict, model_config: BertConfig, devices=None) -> Setup:
    """Creates the mesh, shardings and jitted functions for a config (nothing is allocated)."""
    mesh = sharding.make_mesh(tuple(config.mesh_shape), devices=devices)
    model = BertForPreTraining(model_config)
    opt_settings = optimizer_settings_from(config)
    tx = optim.make_optimizer(opt_settings)
    schedule = optim.make_schedule(opt_settings)
    seq_len = config.data.max_seq_length
    num_predictions = config.data.max_predictions_per_seq

    def boxed_state(rng: jax.Array) -> TrainState:
        ids = jnp.zeros((1, seq_len), jnp.int32)
        positions = jnp.zeros((1, num_predictions), jnp.int32)
        params = model.init({"params": rng}, ids, ids, ids, positions)["params"]
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    with jax.set_mesh(mesh):
        boxed_abstract = jax.eval_shape(boxed_state, jax.random.key(0))
        state_shardings = sharding.logical_shardings(boxed_abstract, mesh)
    abstract_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.meta.unbox(boxed_abstract),
        state_shardings,
    )

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    batch_sharding = sharding.batch_sharding(mesh)
    micro_batch_sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, *batch_sharding.spec)
    )
    init_state = jax.jit(lambda rng: nn.meta.unbox(boxed_state(rng)), out_shardings=state_shardings)
    train_step = jax.jit(
        make_train_step(
            model,
            tx,
            schedule,
            config.grad_accum_steps,
            micro_batch_sharding,
            packed_length(config, mesh),
        ),
        in_shardings=(state_shardings, batch_sharding, replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
    )
    eval_step = jax.jit(
        make_eval_step(model),
        in_shardings=(state_shardings.params, batch_sharding),
        out_shardings=replicated,
    )
    return Setup(
        model_config,
        model,
        tx,
        schedule,
        mesh,
        state_shardings,
        abstract_state,
        batch_sharding,
        init_state,
        train_step,
        eval_step,
    )


def load_initial_params(init_from: str, setup: Setup, tokenizer: Tokenizer) -> Any:
    """Parameters of another run (phase 1 for phase 2), placed on this run's shardings."""
    directory = pathlib.Path(init_from)
    if (directory / CHECKPOINT_DIR).is_dir():
        directory = directory / CHECKPOINT_DIR
    check_compatible(
        checkpoint_lib.read_meta(directory),
        tokenizer,
        setup.model_config,
        f"config.init_from={init_from!r}",
    )
    _, params, _ = checkpoint_lib.restore_params(
        directory, abstract_params=setup.abstract_state.params
    )
    return params


# ----------------------------------------------------------------------------- loop


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
    setup: Setup, params, loader_factory: Callable[[], Any], max_batches: int
) -> dict[str, float]:
    """Eval metrics summed over the held-out split (or its first max_batches batches)."""
    totals = None
    for index, local_batch in enumerate(loader_factory()):
        if max_batches and index >= max_batches:
            break
        sums = setup.eval_step(
            params, global_batch(local_batch, setup.batch_sharding, jax.process_count())
        )
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    if totals is None:
        return {}
    return {k: float(v) for k, v in losses.metrics(totals, "eval").items()}


def restore_or_init(
    config: ml_collections.ConfigDict,
    setup: Setup,
    checkpointer: checkpoint_lib.Checkpointer,
    train_loader: data_lib.Loader,
    tokenizer: Tokenizer,
    rng: jax.Array,
) -> tuple[TrainState, jax.Array]:
    """(state, dropout key): the latest good checkpoint's (and its loader position), else fresh."""
    if checkpointer.latest_step() is not None:
        check_compatible(
            checkpoint_lib.read_meta(checkpointer.directory),
            tokenizer,
            setup.model_config,
            f"the checkpoint in {checkpointer.directory}",
        )
    restored = checkpointer.restore(
        abstract_params=setup.abstract_state.params,
        abstract_opt_state=setup.abstract_state.opt_state,
    )
    if restored is not None:
        train_loader.set_state(restored.meta["loader_state"])
        print(f"Resumed from {checkpointer.directory} at step {restored.step}")
        step = jax.device_put(jnp.asarray(restored.step, jnp.int32), setup.state_shardings.step)
        dropout_rng = jax.random.wrap_key_data(np.asarray(restored.meta["dropout_rng"], np.uint32))
        return TrainState(
            step=step, params=restored.params, opt_state=restored.opt_state
        ), dropout_rng
    params_rng, dropout_rng = jax.random.split(rng)
    state = setup.init_state(params_rng)
    if config.init_from:
        state = state.replace(params=load_initial_params(config.init_from, setup, tokenizer))
        print(f"Initialised parameters from {config.init_from}")
    return state, dropout_rng


class Throughput:
    """Sequences/s, tokens/s and MFU over each logging interval, compilation excluded."""

    def __init__(self, config: ml_collections.ConfigDict, model_config: BertConfig, step: int):
        self._batch_size = config.batch_size
        self._seq_len = config.data.max_seq_length
        self._flops_per_sequence = perf.training_flops_per_sequence(
            model_config, config.data.max_seq_length, config.data.max_predictions_per_seq
        )
        peak = perf.peak_flops_per_device(
            jax.devices()[0].device_kind,
            model_config.dtype,
            override=config.peak_flops_per_device or None,
        )
        self._total_peak = peak * jax.device_count() if peak else None
        self.restart(step)

    def restart(self, step: int) -> None:
        self._start, self._step = time.time(), step

    def metrics(self, step: int) -> dict[str, float]:
        """Figures since the last restart (call after the device has finished `step`)."""
        if step == self._step:  # nothing timed yet (the interval was the compiling step)
            return {}
        elapsed = max(time.time() - self._start, 1e-9)
        sequences_per_sec = (step - self._step) * self._batch_size / elapsed
        out = {
            "perf/sequences_per_sec": sequences_per_sec,
            "perf/tokens_per_sec": sequences_per_sec * self._seq_len,
        }
        if self._total_peak:
            out["perf/mfu"] = self._flops_per_sequence * sequences_per_sec / self._total_peak
        self.restart(step)
        return out


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) pretraining in workdir; returns the final summary."""
    start_time = time.time()
    workdir_path = pathlib.Path(workdir)
    workdir_path.mkdir(parents=True, exist_ok=True)
    is_main_process = jax.process_index() == 0
    validate_config(config, process_count=jax.process_count())

    data_dir, tokenizer = ensure_data(config, workdir)
    model_config = model_config_from(config, tokenizer.vocab_size)
    if is_main_process:  # bertjax.load finds the tokenizer beside the checkpoints
        shutil.copyfile(
            data_dir / data_lib.TOKENIZER_FILE, workdir_path / workdir_lib.TOKENIZER_COPY
        )
    setup = build(config, model_config)

    def make_loader(split: str, global_batch_size: int, **kwargs) -> data_lib.Loader:
        return data_lib.make_loader(
            data_dir,
            split=split,
            batch_size=global_batch_size // jax.process_count(),
            seed=config.seed,
            masking=masking_settings_from(config),
            expected_max_seq_length=config.data.max_seq_length,
            expected_tokenizer_fingerprint=tokenizer.fingerprint,
            **kwargs,
        )

    train_loader = make_loader("train", config.batch_size)
    checkpointer = checkpoint_lib.Checkpointer(
        workdir_path / CHECKPOINT_DIR,
        max_to_keep=config.keep_checkpoints,
        save_interval_steps=config.checkpoint_every_steps,
    )
    writer = metrics_writer.MetricWriter(workdir_path, enabled=is_main_process)
    watcher = PreemptionWatcher(checkpointer)
    eval_metrics: dict[str, float] = {}
    preempted = False
    try:
        # Tracing the model needs the mesh in context for its sharding constraints.
        with jax.set_mesh(setup.mesh):
            state, dropout_rng = restore_or_init(
                config, setup, checkpointer, train_loader, tokenizer, jax.random.key(config.seed)
            )
            step = first_step = int(state.step)
            progress = metrics_writer.Progress(
                config.num_train_steps, initial=step, enabled=is_main_process
            )
            throughput = Throughput(config, model_config, step)
            pending: list[dict[str, jax.Array]] = []  # per-step metrics not yet logged

            def save(force: bool) -> None:
                raise_if_nonfinite(pending[-1:], step)  # the steps before were checked as they ran
                meta = {
                    "loader_state": train_loader.get_state(),
                    # Dropout keys are folded from this with the step, so it is all the RNG state.
                    "dropout_rng": np.asarray(jax.random.key_data(dropout_rng)).tolist(),
                    "model_config": model_config.to_dict(),
                    "tokenizer_fingerprint": tokenizer.fingerprint,
                    "config": config.to_dict(),
                }
                checkpointer.save(
                    step, params=state.params, opt_state=state.opt_state, meta=meta, force=force
                )

            while step < config.num_train_steps:
                batch = global_batch(next(train_loader), setup.batch_sharding, jax.process_count())
                state, metrics = setup.train_step(state, batch, dropout_rng)
                step += 1
                pending.append(metrics)
                progress.update(step)
                if len(pending) >= 2:  # the previous step has finished by now: stop on it at once
                    raise_if_nonfinite(pending[-2:-1], step - 1)
                if step == first_step + 1:  # the first step compiled: time from here on
                    jax.block_until_ready(metrics)
                    throughput.restart(step)

                at_end = step == config.num_train_steps
                if step % config.log_every_steps == 0 or at_end:
                    summary = summarise(pending, step)  # waits for the device
                    summary.update(throughput.metrics(step))
                    writer.write(step, summary)
                    progress.show(summary)
                    pending = []
                if step % config.eval_every_steps == 0 or at_end:
                    eval_metrics = evaluate(
                        setup,
                        state.params,
                        lambda: make_loader(
                            "eval", eval_batch_size(config), shuffle=False, num_epochs=1
                        ),
                        config.eval_batches,
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
                if step % config.checkpoint_every_steps == 0 or at_end:
                    save(force=at_end)
            progress.close()
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
    if is_main_process:
        print_summary(result)
    return result


class NonFiniteError(FloatingPointError):
    """Raised when a step produced a non-finite loss or gradient."""


def raise_if_nonfinite(metrics: list[dict[str, Any]], step: int) -> None:
    """Stops the run, naming the step, if any of the steps ending at `step` was not finite."""
    # Only the flags cross to the host on the per-step path; the rest only when one is bad.
    for offset, flag in enumerate(jax.device_get([m["train/nonfinite"] for m in metrics])):
        if flag:
            values = jax.device_get(metrics[offset])
            raise NonFiniteError(
                f"step {step - len(metrics) + offset + 1}: non-finite loss ({values['train/loss']}) or "
                f"gradient norm ({values['train/grad_norm']}); stopping. Its update was not applied and "
                "the last good checkpoint is kept."
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
    for key, value in sorted(result["eval"].items()):
        lines.append(f"  {key + ':':<26}{value:.4f}")
    lines += [
        f"  checkpoints: {result['checkpoint_dir']}",
        f"  metrics:     {os.path.join(result['workdir'], metrics_writer.JSONL_FILE)} (and TensorBoard events)",
        f"  data:        {result['data_dir']}",
        f"  load it:     bertjax.load({result['workdir']!r})",
    ]
    print("\n".join(lines), flush=True)
