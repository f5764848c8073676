"""Training sentence embeddings: contrastive and regression losses over a bi-encoder.

Batch features (bertjax.tasks.embed.model's BiEncoder embeds every text on its own):
  input_ids, input_mask, segment_ids  [batch, texts, seq] int32; texts is 2 (anchor,
                                      positive) or 3 (anchor, positive, hard negative)
  weights                             [batch] float32; 0 for rows that only pad a batch
  scores                              [batch] float32 gold similarity (cosine regression)

Losses (`LossSettings`):
  in_batch_negatives  softmax cross-entropy over scale * cosine similarity: each anchor
                      against every positive (and hard negative) of the GLOBAL batch, its own
                      positive the target (sentence-transformers' MultipleNegativesRankingLoss);
                      `symmetric` averages it with each positive against every anchor
                      (MultipleNegativesSymmetricRankingLoss)
  cosine_regression   squared error of cos(anchor, positive) against the gold score divided by
                      `score_max` (1 for [0, 1] labels, 5 for STS-B's [0, 5]), as
                      sentence-transformers' CosineSimilarityLoss

Negatives across the mesh: under jit every array is global, so the plain loss already
compares each anchor with every positive of the batch; with a mesh, `loss_sums` runs it
inside `jax.shard_map`, each device gathering the (small) positives of all devices and
scoring only its own anchors, so no device holds more than [local rows, global rows] of the
similarity matrix. Gradients flow back through the gather (a reduce-scatter): both are exact.

A global batch larger than memory trains with `make_cached_train_step` (GradCache, Gao et al.
2021): embeddings in chunks without gradients, the loss and its gradient with respect to
the embeddings of the whole batch, then each chunk's backward pass from that gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from bertjax.encoders.family import EncoderConfig
from bertjax.engine import optim, steps
from bertjax.inference import vectors
from bertjax.nn import sharding
from bertjax.tasks.embed import model as embedding
from bertjax.tasks.embed.model import BiEncoder, EmbeddingSpec

IN_BATCH_NEGATIVES = "in_batch_negatives"
COSINE_REGRESSION = "cosine_regression"
LOSSES = (IN_BATCH_NEGATIVES, COSINE_REGRESSION)
# Logit of a candidate that is only padding: never chosen, no gradient, no inf arithmetic.
_MASKED_LOGIT = -1e9


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """What an embedding model is trained to minimise (see the module docstring)."""

    loss: str = IN_BATCH_NEGATIVES
    scale: float = 20.0  # inverse temperature of the in-batch softmax
    symmetric: bool = False  # also each positive against every anchor
    score_max: float = 1.0  # cosine regression: gold scores are divided by it

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"LossSettings.loss={self.loss!r} is invalid: must be one of {LOSSES}")
        for name in ("scale", "score_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"LossSettings.{name}={value!r} is invalid: must be a number > 0")
        if not isinstance(self.symmetric, bool):
            raise ValueError(
                f"LossSettings.symmetric={self.symmetric!r} is invalid: must be True or False"
            )
        if self.symmetric and self.loss != IN_BATCH_NEGATIVES:
            raise ValueError(
                f"LossSettings.symmetric=True applies to loss={IN_BATCH_NEGATIVES!r}, not "
                f"{self.loss!r}"
            )


class EmbeddingSums(NamedTuple):
    """Additive statistics of a batch: the loss is loss / count."""

    loss: jax.Array  # summed per-pair loss
    count: jax.Array  # pairs (sum of weights)


# ----------------------------------------------------------------------------- losses


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-row softmax cross-entropy of [r, c] float32 logits against int [r] targets."""
    target = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]  # [r]
    return jax.nn.logsumexp(logits, axis=1) - target


def _contrastive_rows(
    local: jax.Array,
    local_weights: jax.Array,
    everyone: jax.Array,
    all_weights: jax.Array,
    offset: jax.Array | int,
    scale: float,
    symmetric: bool,
) -> jax.Array:
    """Per local row, the in-batch-negatives loss: [r].

    local [r, t, h] and everyone [R, t, h] hold unit vectors (anchor, positive, negative...);
    local row i is row offset + i of everyone. Candidates whose weight is 0 are masked out.
    """
    anchors = local[:, 0]  # [r, h]
    candidates = everyone[:, 1:].swapaxes(0, 1).reshape(-1, everyone.shape[-1])  # [(t-1) R, h]
    valid = jnp.tile(all_weights > 0, everyone.shape[1] - 1)  # [(t-1) R]
    dot = lambda a, b: jnp.einsum(  # noqa: E731
        "rh,ch->rc", a, b, precision=jax.lax.Precision.HIGHEST
    )
    logits = jnp.where(valid[None, :], scale * dot(anchors, candidates), _MASKED_LOGIT)
    labels = offset + jnp.arange(local.shape[0])  # [r]: own positive, block 0
    loss = _cross_entropy(logits, labels)  # [r]
    if symmetric:
        # Each positive against every anchor of the batch (not the hard negatives).
        back = dot(local[:, 1], everyone[:, 0])  # [r, R]
        back = jnp.where((all_weights > 0)[None, :], scale * back, _MASKED_LOGIT)
        loss = 0.5 * (loss + _cross_entropy(back, labels))
    return loss * local_weights


def in_batch_negatives_sums(
    embeddings: jax.Array, weights: jax.Array, scale: float = 20.0, symmetric: bool = False
) -> EmbeddingSums:
    """The in-batch-negatives loss of [batch, texts, hidden] embeddings, as sums.

    Under jit with a batch sharded over the mesh the arrays are global: the compiler gathers
    what each device needs. `gathered_in_batch_negatives_sums` does so explicitly.
    """
    units = vectors.l2_normalize(embeddings.astype(jnp.float32))  # [b, t, h]
    weights = weights.astype(jnp.float32)
    rows = _contrastive_rows(units, weights, units, weights, 0, scale, symmetric)
    return EmbeddingSums(jnp.sum(rows), jnp.sum(weights))


def gathered_in_batch_negatives_sums(
    embeddings: jax.Array,
    weights: jax.Array,
    mesh: jax.sharding.Mesh,
    scale: float = 20.0,
    symmetric: bool = False,
) -> EmbeddingSums:
    """`in_batch_negatives_sums` with the gather spelled out: `jax.shard_map` over the
    mesh's batch axes, each device all-gathering every device's (unit) embeddings and
    scoring its own anchors against them, the sums added with psum."""
    axes = sharding.logical_to_spec((sharding.BATCH,))[0]
    axes = axes if isinstance(axes, tuple) else (axes,)
    spec = PartitionSpec(axes)

    def local_sums(local: jax.Array, local_weights: jax.Array) -> EmbeddingSums:
        units = vectors.l2_normalize(local.astype(jnp.float32))  # [r, t, h]
        local_weights = local_weights.astype(jnp.float32)
        everyone = jax.lax.all_gather(units, axes, tiled=True)  # [R, t, h]
        all_weights = jax.lax.all_gather(local_weights, axes, tiled=True)  # [R]
        offset = jax.lax.axis_index(axes) * local.shape[0]
        rows = _contrastive_rows(
            units, local_weights, everyone, all_weights, offset, scale, symmetric
        )
        return EmbeddingSums(
            jax.lax.psum(jnp.sum(rows), axes), jax.lax.psum(jnp.sum(local_weights), axes)
        )

    return jax.shard_map(
        local_sums,
        mesh=mesh,
        in_specs=(spec, spec),
        out_specs=EmbeddingSums(PartitionSpec(), PartitionSpec()),
    )(embeddings, weights)


def cosine_regression_sums(
    embeddings: jax.Array, scores: jax.Array, weights: jax.Array, score_max: float = 1.0
) -> EmbeddingSums:
    """Squared error of cos(anchor, positive) against scores / score_max, as sums."""
    units = vectors.l2_normalize(embeddings.astype(jnp.float32))  # [b, t, h]
    cosine = jnp.sum(units[:, 0] * units[:, 1], axis=-1)  # [b]
    error = cosine - scores.astype(jnp.float32) / score_max
    weights = weights.astype(jnp.float32)
    return EmbeddingSums(jnp.sum(weights * error**2), jnp.sum(weights))


def loss_sums(
    settings: LossSettings,
    embeddings: jax.Array,
    batch: dict[str, jax.Array],
    mesh: jax.sharding.Mesh | None = None,
) -> EmbeddingSums:
    """The settings' loss of a batch's [batch, texts, hidden] embeddings, as sums.

    With a mesh whose batch axes split the batch, in-batch negatives are gathered explicitly
    (gathered_in_batch_negatives_sums).
    """
    if settings.loss == COSINE_REGRESSION:
        return cosine_regression_sums(
            embeddings, batch["scores"], batch["weights"], settings.score_max
        )
    if mesh is not None and sharding.shards(sharding.BATCH, mesh) > 1:
        return gathered_in_batch_negatives_sums(
            embeddings, batch["weights"], mesh, settings.scale, settings.symmetric
        )
    return in_batch_negatives_sums(embeddings, batch["weights"], settings.scale, settings.symmetric)


# ----------------------------------------------------------------------------- objective


def embed_pairs(
    model: BiEncoder, params, batch: dict[str, jax.Array], *, rng, deterministic: bool
) -> jax.Array:
    """[batch, texts, hidden] float32 embeddings of a batch's texts (one encoder call).

    The texts of a row stay next to each other, so a batch sharded by rows is embedded
    without moving any input between devices.
    """
    rows, texts, seq = batch["input_ids"].shape
    flat = lambda name: batch[name].reshape(rows * texts, seq)  # noqa: E731  [b t, s]
    vectors = model.apply(
        {"params": params},
        flat("input_ids"),
        flat("segment_ids"),
        flat("input_mask"),
        deterministic=deterministic,
        rngs={"dropout": rng} if rng is not None else {},
    )  # [b t, h]
    return vectors.reshape(rows, texts, -1)  # [b, t, h]


class EmbeddingObjective(steps.Loss):
    """The embedding loss as a steps.Loss: its sums are over the whole batch.

    A contrastive loss does not split into independent micro-batches (each needs the others'
    negatives): train it with grad_accum_steps=1, or with make_cached_train_step.
    """

    def __init__(
        self, model: BiEncoder, settings: LossSettings, mesh: jax.sharding.Mesh | None = None
    ):
        self.model = model
        self.settings = settings
        self.mesh = mesh

    def embeddings(self, params, batch, *, rng, deterministic: bool) -> jax.Array:
        return embed_pairs(self.model, params, batch, rng=rng, deterministic=deterministic)

    def sums_of(self, embeddings: jax.Array, batch) -> EmbeddingSums:
        """The loss sums of a whole batch from its embeddings."""
        return loss_sums(self.settings, embeddings, batch, self.mesh)

    def sums(self, params, batch, *, rng, deterministic, packed_length=None) -> EmbeddingSums:
        if packed_length is not None:
            raise ValueError("embedding training does not pack tokens; pass packed_length=None")
        vectors = self.embeddings(params, batch, rng=rng, deterministic=deterministic)
        return self.sums_of(vectors, batch)

    def zero_sums(self) -> EmbeddingSums:
        return EmbeddingSums(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))

    def denominators(self, batch) -> jax.Array:
        return jnp.sum(batch["weights"].astype(jnp.float32))

    def loss(self, sums: EmbeddingSums, denominators: jax.Array) -> jax.Array:
        return sums.loss / jnp.maximum(denominators, 1.0)

    def metrics(self, sums: EmbeddingSums, prefix: str) -> dict[str, jax.Array]:
        return {f"{prefix}/loss": sums.loss / jnp.maximum(sums.count, 1.0)}


# ----------------------------------------------------------------------------- GradCache


def _merge_chunks(x: jax.Array) -> jax.Array:
    """Inverse of steps.split_micro_batches: [chunks, B / chunks, ...] -> [B, ...]."""
    return x.swapaxes(0, 1).reshape((-1,) + x.shape[2:])


def cached_gradients(
    objective: EmbeddingObjective,
    params,
    batch: dict[str, jax.Array],
    rng: jax.Array | None,
    chunks: int,
    chunk_sharding: jax.sharding.NamedSharding | None = None,
) -> tuple[Any, EmbeddingSums]:
    """(d loss / d params, sums) of the whole batch, holding one chunk's activations at once.

    1. embed each chunk without gradients; 2. the loss of all embeddings and its gradient
    with respect to them; 3. per chunk, the encoder's backward pass (jax.vjp) from that
    gradient, accumulated. Chunk k uses dropout key fold_in(rng, k) in steps 1 and 3, so the
    recomputed forward pass is the one whose embeddings the loss saw.
    """
    deterministic = rng is None
    split = lambda x: steps.split_micro_batches(x, chunks)  # noqa: E731  [c, B/c, ...]
    micro = jax.tree.map(split, batch)
    if chunk_sharding is not None:
        micro = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, chunk_sharding), micro)
    denominators = objective.denominators(batch)
    indices = jnp.arange(chunks)

    def embed_chunk(p, chunk, index):
        key = None if deterministic else jax.random.fold_in(rng, index)
        return objective.embeddings(p, chunk, rng=key, deterministic=deterministic)

    def forward(_, xs):
        chunk, index = xs
        return None, jax.lax.stop_gradient(embed_chunk(params, chunk, index))

    _, vectors = jax.lax.scan(forward, None, (micro, indices))  # [c, B/c, t, h]

    def loss_of(everything):
        sums = objective.sums_of(everything, batch)
        return objective.loss(sums, denominators), sums

    (_, sums), cotangent = jax.value_and_grad(loss_of, has_aux=True)(_merge_chunks(vectors))
    cotangents = split(cotangent)  # [c, B/c, t, h]

    def backward(total, xs):
        chunk, index, chunk_cotangent = xs
        _, vjp = jax.vjp(lambda p: embed_chunk(p, chunk, index), params)
        (grads,) = vjp(chunk_cotangent)
        return jax.tree.map(jnp.add, total, grads), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, _ = jax.lax.scan(backward, zeros, (micro, indices, cotangents))
    return grads, sums


def make_cached_train_step(
    objective: EmbeddingObjective,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    chunks: int,
    chunk_sharding: jax.sharding.NamedSharding | None = None,
) -> Callable:
    """`train_step(state, batch, rng) -> (state, metrics)` with GradCache gradients.

    The same contract as steps.make_train_step (a non-finite step leaves the state unchanged
    and reports train/nonfinite=1), for a global batch embedded `chunks` chunks at a time.
    """

    def train_step(state: steps.TrainState, batch: dict[str, jax.Array], rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        grads, sums = cached_gradients(
            objective, state.params, batch, step_rng, chunks, chunk_sharding
        )
        loss = objective.loss(sums, objective.denominators(batch))
        return steps.apply_gradients(state, grads, sums, loss, objective, tx, schedule)

    return train_step


# ----------------------------------------------------------------------------- a run's steps


@dataclasses.dataclass(frozen=True)
class EmbeddingTraining:
    """A run's model, mesh, state layout and jitted steps, built once (nothing allocated)."""

    model_config: EncoderConfig
    spec: EmbeddingSpec
    settings: LossSettings
    model: BiEncoder
    mesh: jax.sharding.Mesh
    state: steps.StateFactory
    batch_sharding: jax.sharding.NamedSharding
    train_step: Callable  # (state, batch, rng) -> (state, metrics)
    embed_step: Callable  # (params, [b, s] input_ids/input_mask/segment_ids) -> [b, h]


def build_embedding_training(
    model_config: EncoderConfig,
    spec: EmbeddingSpec,
    settings: LossSettings,
    optimizer: optim.OptimizerSettings,
    *,
    mesh_shape: tuple[int, ...],
    cache_chunks: int = 1,
    devices=None,
) -> EmbeddingTraining:
    """The mesh, sharded state layout and jitted steps of an embedding run.

    `cache_chunks` > 1 embeds each global batch in that many chunks (GradCache); the batch
    size must then divide by chunks x the mesh's batch shards.
    """
    spec.check(model_config)
    if isinstance(cache_chunks, bool) or not isinstance(cache_chunks, int) or cache_chunks < 1:
        raise ValueError(f"cache_chunks={cache_chunks!r} is invalid: must be an int >= 1")
    mesh = sharding.make_mesh(mesh_shape, devices=devices)
    model = embedding.make_model(model_config, spec)
    tx = optim.make_optimizer(optimizer)
    state = steps.make_state(lambda rng: embedding.init_params(model, rng), tx, mesh)
    replicated = jax.sharding.NamedSharding(mesh, PartitionSpec())
    batch_sharding = sharding.batch_sharding(mesh)
    objective = EmbeddingObjective(model, settings, mesh)
    schedule = optim.make_schedule(optimizer)
    if cache_chunks == 1:
        step = steps.make_train_step(objective, tx, schedule, 1)
    else:
        chunk_sharding = jax.sharding.NamedSharding(mesh, PartitionSpec(None, *batch_sharding.spec))
        step = make_cached_train_step(objective, tx, schedule, cache_chunks, chunk_sharding)
    train_step = jax.jit(
        step,
        in_shardings=(state.shardings, batch_sharding, replicated),
        out_shardings=(state.shardings, replicated),
        donate_argnums=(0,),
    )
    embed_step = jax.jit(
        lambda params, batch: model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            deterministic=True,
        ),
        in_shardings=(state.shardings.params, batch_sharding),
        out_shardings=batch_sharding,
    )
    return EmbeddingTraining(
        model_config,
        spec,
        settings,
        model,
        mesh,
        state,
        batch_sharding,
        train_step,
        embed_step,
    )
