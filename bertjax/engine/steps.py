"""Train state, sharded state creation, and the jitted train and eval steps.

The engine under every run: a run describes what it minimises as a `Loss` (sums
over examples, so that micro-batches add up to exactly the full batch) and gets back from
`build` a pure `train_step(state, batch, rng) -> (state, metrics)`, an
`eval_step(params, batch)` and the sharded state layout, all jitted for its mesh. It knows
no task: bertjax.pretrain and bertjax.finetune bring their objectives.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.engine import optim
from bertjax.nn import sharding, unpadding

# The name scope of the optimizer update's operations in a compiled step (profiles classify
# its kernels by it).
OPTIMIZER_SCOPE = "optimizer_update"


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training, as one pytree."""

    step: jax.Array
    params: Any
    opt_state: Any


# ----------------------------------------------------------------------------- state


@dataclasses.dataclass(frozen=True)
class StateFactory:
    """How a train state is laid out on the mesh, and a jitted function that creates it there.

    `abstract` holds a `jax.ShapeDtypeStruct` (with its sharding) per leaf: the target for
    restoring a checkpoint. `init(rng)` allocates every array directly on its shards, so
    no device ever holds a full replica.
    """

    abstract: TrainState
    shardings: TrainState
    init: Callable[[jax.Array], TrainState]
    # The state before its arrays are placed (boxed with their logical axis names).
    boxed_state: Callable[[jax.Array], TrainState]

    def init_taking(self, rng: jax.Array, given: Any, take: Callable[[Any, Any], Any]):
        """`init(rng)` with the parameters `take(given, fresh)` in place of the fresh ones
        (`given`: arrays, e.g. an init_from's parameters): one program, in which XLA drops
        the initialisation of whatever `take` replaces, so that a fine-tuning run does not
        compile (nor compute) a random encoder only to overwrite it. The optimizer state is
        `init`'s, as it would be for the fresh parameters."""

        def state(rng, given):
            fresh = nn.meta.unbox(self.boxed_state(rng))
            return fresh.replace(params=take(given, fresh.params))

        return jax.jit(state, out_shardings=self.shardings)(rng, given)


def make_state(
    init_params: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation | None,
    mesh: jax.sharding.Mesh,
) -> StateFactory:
    """The one state-initialisation path: shapes first, then shardings, then a jitted init.

    `init_params(rng)` returns the model's parameters boxed with their logical axis names
    (`model.init(...)["params"]`); the optimizer state inherits their shardings. With
    `tx=None` the state has no optimizer state (parameters only).
    """

    def boxed_state(rng: jax.Array) -> TrainState:
        params = init_params(rng)
        opt_state = tx.init(params) if tx is not None else None
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)

    with jax.set_mesh(mesh):
        boxed_abstract = jax.eval_shape(boxed_state, jax.random.key(0))
        shardings = sharding.logical_shardings(boxed_abstract, mesh)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.meta.unbox(boxed_abstract),
        shardings,
    )
    init = jax.jit(lambda rng: nn.meta.unbox(boxed_state(rng)), out_shardings=shardings)
    return StateFactory(abstract=abstract, shardings=shardings, init=init, boxed_state=boxed_state)


# ----------------------------------------------------------------------------- batches


def global_batch(
    local_batch: dict[str, np.ndarray], batch_sharding: jax.sharding.Sharding, process_count: int
) -> dict[str, jax.Array]:
    """Assembles each process's rows into global arrays sharded over the data axes."""
    out = {}
    for name, local in local_batch.items():
        global_shape = (local.shape[0] * process_count,) + local.shape[1:]
        out[name] = jax.make_array_from_process_local_data(batch_sharding, local, global_shape)
    return out


def split_micro_batches(x: jax.Array, num_micro: int) -> jax.Array:
    """[B, ...] -> [num_micro, B / num_micro, ...], micro-batch k = rows k, k+A, k+2A, ...

    Strided rather than contiguous, so that every device keeps its own rows in every
    micro-batch and no data moves between devices.
    """
    rows = x.shape[0] // num_micro
    return x.reshape((rows, num_micro) + x.shape[1:]).swapaxes(0, 1)  # [A, B/A, ...]


def packed_length_for_capacity(
    micro_batch_size: int, seq_len: int, token_capacity: float, mesh: jax.sharding.Mesh
) -> int | None:
    """Token slots per batch shard when the encoder packs tokens, or None (packing off).

    `token_capacity` of the slots of one shard of a micro-batch, rounded up to a multiple
    of 8; None when that leaves no padding to skip.
    """
    rows = micro_batch_size // sharding.shards(sharding.BATCH, mesh)
    slots = rows * seq_len
    length = -(-math.ceil(token_capacity * slots) // 8) * 8
    return length if length < slots else None


# ----------------------------------------------------------------------------- steps


class Loss:
    """What a step minimises, as sums over the examples of a (micro-)batch.

    The loss of a micro-batch is `loss(sums, denominators)` with the denominators of the
    whole global batch, so the micro-batch gradients add up to exactly the gradient of one
    large batch.
    """

    def sums(self, params, batch, *, rng, deterministic: bool, packed_length=None) -> Any:
        raise NotImplementedError

    def zero_sums(self) -> Any:
        raise NotImplementedError

    def denominators(self, batch) -> Any:
        raise NotImplementedError

    def loss(self, sums, denominators) -> jax.Array:
        raise NotImplementedError

    def metrics(self, sums, prefix: str) -> dict[str, jax.Array]:
        raise NotImplementedError

    # Whether `evaluate` returns (sums, per-example outputs) rather than sums alone.
    eval_outputs = False
    # None: evaluation batches keep every position, in the examples' order. A tuple: batches
    # may be grouped by length and cut to the positions they need (padding changes no output
    # at a real position); it names the outputs that hold one value per position, which are
    # padded back to the full length.
    position_outputs: tuple[str, ...] | None = None

    def evaluate(self, params, batch) -> Any:
        """What the eval step returns for a batch, without dropout; sums add up over batches."""
        return self.sums(params, batch, rng=None, deterministic=True)


def apply_gradients(state: TrainState, grads, sums, loss, objective: Loss, tx, schedule):
    """One optimizer update from a step's gradients, and the step's train metrics.

    A non-finite loss or gradient keeps the last good state (train/nonfinite=1), so no bad
    value is ever checkpointed; a conditional rather than a select, so the update is skipped,
    not computed and discarded. The update's operations carry OPTIMIZER_SCOPE in their names
    (the compiled program's op names, which profiles show).
    """
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply_update(_):
        with jax.named_scope(OPTIMIZER_SCOPE):
            updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
            return optax.apply_updates(state.params, updates), new_opt_state

    new_params, new_opt_state = jax.lax.cond(
        finite, apply_update, lambda _: (state.params, state.opt_state), None
    )
    new_state = TrainState(step=state.step + 1, params=new_params, opt_state=new_opt_state)
    metrics = objective.metrics(sums, "train")
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


def make_train_step(
    objective: Loss,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum_steps: int,
    micro_batch_sharding: jax.sharding.NamedSharding | None = None,
    packed_length: int | None = None,
    every_batch_fits: bool = False,
) -> Callable:
    """Builds the pure `train_step(state, batch, rng) -> (state, metrics)`.

    A step whose loss or gradient is not finite leaves the state unchanged and reports
    `train/nonfinite`=1; the loop stops on it.

    With `packed_length` the encoder skips padding (BertModel's token packing) for every
    micro-batch whose real tokens fit in that many slots per batch shard; one that does not
    fit runs unpacked, with the same result. `train/packed` is the fraction that fit. A
    batch of at most `packed_length` slots per shard runs unpacked (and counts as fitting).
    `every_batch_fits` says the caller chose `packed_length` so that every batch the step
    will meet fits (fine-tuning does, from its known batches): the step then runs packed
    without the conditional, so its program holds one gradient instead of two (about half
    the compiling); `train/packed` still reports the fraction that fit.
    """

    def fits(input_mask: jax.Array) -> jax.Array:
        groups = sharding.shards(sharding.BATCH)
        return jnp.max(unpadding.tokens_per_group(input_mask, groups)) <= packed_length

    def loss_fn(params, batch, denominators, rng, length):
        sums = objective.sums(params, batch, rng=rng, deterministic=False, packed_length=length)
        return objective.loss(sums, denominators), sums

    def grad_fn(params, batch, denominators, rng):
        def grads(length: int | None):
            return lambda params: jax.grad(loss_fn, has_aux=True)(
                params, batch, denominators, rng, length
            )

        # A batch cut to few positions (fine-tuning's length buckets) may have no more slots
        # than packing would keep: it runs unpacked.
        groups = sharding.shards(sharding.BATCH)
        if packed_length is None or packed_length >= batch["input_mask"].size // groups:
            return grads(None)(params)
        if every_batch_fits:
            return grads(packed_length)(params)
        # The conditional is taken around the gradient rather than differentiated through:
        # a differentiated one would carry both branches' activations.
        return jax.lax.cond(fits(batch["input_mask"]), grads(packed_length), grads(None), params)

    def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        denominators = objective.denominators(batch)
        if grad_accum_steps == 1:
            grads, sums = grad_fn(state.params, batch, denominators, step_rng)
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
                    state.params, micro, denominators, jax.random.fold_in(step_rng, index)
                )
                return (
                    jax.tree.map(jnp.add, grads_acc, grads),
                    jax.tree.map(jnp.add, sums_acc, sums),
                    index + 1,
                ), None

            zeros_grads = jax.tree.map(jnp.zeros_like, state.params)
            (grads, sums, _), _ = jax.lax.scan(
                accumulate, (zeros_grads, objective.zero_sums(), 0), micro_batches
            )

        new_state, metrics = apply_gradients(
            state, grads, sums, objective.loss(sums, denominators), objective, tx, schedule
        )
        if packed_length is not None:
            masks = split_micro_batches(batch["input_mask"], grad_accum_steps)
            metrics["train/packed"] = jnp.mean(jax.vmap(fits)(masks).astype(jnp.float32))
        return new_state, metrics

    return train_step


def make_micro_batch_steps(
    objective: Loss,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    state_shardings: TrainState,
    batch_sharding: jax.sharding.NamedSharding,
) -> MicroBatchSteps:
    """The jitted parts of a batch taken as micro-batches of their own widths.

    Each micro-batch is traced at its own shape (one compile per width), so a batch split by
    length pays attention and feed-forward only for its micro-batches' longest examples. The
    update is the batch's: every micro-batch's loss is divided by the whole batch's
    denominators, so the gradients add up to the one-batch gradient.
    """
    replicated = jax.sharding.NamedSharding(batch_sharding.mesh, jax.sharding.PartitionSpec())
    params_shardings = state_shardings.params

    def accumulate(params, grads_acc, sums_acc, micro, denominators, rng, step, index):
        rng = jax.random.fold_in(jax.random.fold_in(rng, step), index)

        def loss_fn(params):
            sums = objective.sums(params, micro, rng=rng, deterministic=False)
            return objective.loss(sums, denominators), sums

        grads, sums = jax.grad(loss_fn, has_aux=True)(params)
        return jax.tree.map(jnp.add, grads_acc, grads), jax.tree.map(jnp.add, sums_acc, sums)

    def apply(state, grads, sums, denominators):
        loss = objective.loss(sums, denominators)
        return apply_gradients(state, grads, sums, loss, objective, tx, schedule)

    return MicroBatchSteps(
        denominators=jax.jit(
            objective.denominators, in_shardings=(batch_sharding,), out_shardings=replicated
        ),
        zeros=jax.jit(
            lambda params: (jax.tree.map(jnp.zeros_like, params), objective.zero_sums()),
            in_shardings=(params_shardings,),
            out_shardings=(params_shardings, replicated),
        ),
        accumulate=jax.jit(
            accumulate,
            in_shardings=(
                params_shardings,
                params_shardings,
                replicated,
                batch_sharding,
                replicated,
                replicated,
                replicated,
                replicated,
            ),
            out_shardings=(params_shardings, replicated),
            donate_argnums=(1, 2),
            # The micro-batch's index is traced, not static: one program per width, whichever
            # micro-batches meet it (with a static index, one per index and width).
        ),
        apply=jax.jit(
            apply,
            in_shardings=(state_shardings, params_shardings, replicated, replicated),
            out_shardings=(state_shardings, replicated),
            donate_argnums=(0,),
        ),
    )


@dataclasses.dataclass(frozen=True)
class MicroBatchSteps:
    """One optimizer step over micro-batches of different widths (see make_micro_batch_steps).

    Calling it does what `train_step` does for one batch: the micro-batches' gradients and
    sums are accumulated one call each, then one update is applied.
    """

    denominators: Callable  # (micro-batch) -> its part of the batch's denominators
    zeros: Callable  # (params) -> (zero gradients, zero sums)
    accumulate: Callable  # (params, grads, sums, micro, denominators, rng, step, index)
    apply: Callable  # (state, grads, sums, denominators) -> (state, metrics)

    def __call__(self, state: TrainState, micro_batches: list[dict[str, jax.Array]], rng):
        denominators = None
        for micro in micro_batches:
            part = self.denominators(micro)
            denominators = (
                part if denominators is None else jax.tree.map(jnp.add, denominators, part)
            )
        grads, sums = self.zeros(state.params)
        for index, micro in enumerate(micro_batches):
            grads, sums = self.accumulate(
                state.params, grads, sums, micro, denominators, rng, state.step, index
            )
        return self.apply(state, grads, sums, denominators)


# ----------------------------------------------------------------------------- a run's steps


@dataclasses.dataclass(frozen=True)
class Steps:
    """What a loop needs, built once: mesh, state layout, optimizer and the jitted steps."""

    mesh: jax.sharding.Mesh
    tx: optax.GradientTransformation
    state: StateFactory
    batch_sharding: jax.sharding.NamedSharding
    train_step: Callable  # (state, batch, rng) -> (state, metrics)
    eval_step: Callable  # (params, batch) -> objective.evaluate's result
    # (state, [micro-batch, ...], rng) -> (state, metrics): one step over micro-batches of
    # their own widths (fine-tuning's micro-batches grouped by length).
    micro_batch_step: MicroBatchSteps | None = None
    # (global batch) -> {feature: array}: what a frozen network computes from each training
    # batch on the devices, added to the batch before its step (distillation's teacher
    # outputs); None: the batches go as they are.
    batch_features: Callable | None = None

    def take_step(
        self, state: TrainState, local: dict[str, np.ndarray] | list[dict[str, np.ndarray]], rng
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One training step on this process's rows: one batch, or a list of micro-batches
        whose gradients add up to their batch's."""
        count = jax.process_count()
        if isinstance(local, dict):
            batch = self.with_features(global_batch(local, self.batch_sharding, count))
            return self.train_step(state, batch, rng)
        micro_batches = [
            self.with_features(global_batch(micro, self.batch_sharding, count)) for micro in local
        ]
        return self.micro_batch_step(state, micro_batches, rng)

    def with_features(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """`batch` with `batch_features`' outputs added (itself when there are none)."""
        if self.batch_features is None:
            return batch
        return {**batch, **self.batch_features(batch)}


def build(
    objective: Loss,
    init_params: Callable[[jax.Array], Any],
    optimizer: optim.OptimizerSettings,
    mesh: jax.sharding.Mesh,
    *,
    grad_accum_steps: int,
    packed_length: int | None,
    every_batch_fits: bool = False,
) -> Steps:
    """The sharded state layout and the jitted train and eval steps (nothing is allocated).

    `init_params(rng)` gives the model's boxed parameters. The eval step is
    `objective.evaluate`: sums (replicated), or (sums, per-example outputs) sharded by rows
    when `objective.eval_outputs`. `packed_length` and `every_batch_fits`: make_train_step.
    """
    tx = optim.make_optimizer(optimizer)
    state = make_state(init_params, tx, mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    batch_sharding = sharding.batch_sharding(mesh)
    micro_batch_sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, *batch_sharding.spec)
    )
    train_step = jax.jit(
        make_train_step(
            objective,
            tx,
            optim.make_schedule(optimizer),
            grad_accum_steps,
            micro_batch_sharding,
            packed_length,
            every_batch_fits,
        ),
        in_shardings=(state.shardings, batch_sharding, replicated),
        out_shardings=(state.shardings, replicated),
        donate_argnums=(0,),
    )
    eval_step = jax.jit(
        objective.evaluate,
        in_shardings=(state.shardings.params, batch_sharding),
        out_shardings=(replicated, batch_sharding) if objective.eval_outputs else replicated,
    )
    micro_batch_step = make_micro_batch_steps(
        objective, tx, optim.make_schedule(optimizer), state.shardings, batch_sharding
    )
    return Steps(mesh, tx, state, batch_sharding, train_step, eval_step, micro_batch_step)
