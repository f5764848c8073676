"""Optimizers (AdamW, LAMB, StableAdamW), learning-rate schedules and the weight-decay mask.

Gradient accumulation is not an optimizer concern here: the trainer sums the gradients
of micro-batches whose losses are already divided by the whole batch's denominators
(see bertjax.nn.losses), then applies one optimizer update.

AdamW note: google-research/bert's AdamWeightDecayOptimizer has no bias correction of
the Adam moments. We keep optax's bias-corrected Adam, as NVIDIA's and Hugging Face's
BERT trainers do; it differs only in the first few thousand steps, which warmup covers.

StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
vision-language models"; the optimizer of ModernBERT) is AdamW with Adafactor's update
clipping per tensor instead of global gradient clipping: each tensor's step (weight decay
included) is divided by max(1, sqrt(mean(g^2 / max(v, eps^2)))), with g the step's gradient
and v the bias-corrected second moment that already includes g. The bias-corrected moments
here equal the "debiased betas" of the published code exactly.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertjax.encoders.bert.config import STACKED_LAYERS

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
SCHEDULES = ("linear", "polynomial", "cosine", "google", "constant", "wsd")
# Leaves below the scanned encoder's STACKED_LAYERS key carry a leading [layers] axis, and
# LAMB's trust ratio is computed per layer along it.


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """Optimizer, schedule and clipping settings (validated on construction)."""

    name: str = "adamw"  # "adamw" | "lamb" | "stable_adamw"
    learning_rate: float = 1e-4  # peak, reached at the end of warmup
    warmup_steps: int = 10_000
    total_steps: int = 1_000_000
    # "linear" | "polynomial" | "cosine" | "google" | "constant" | "wsd" (warmup-stable-decay)
    schedule: str = "linear"
    end_learning_rate: float = 0.0
    polynomial_power: float = 0.5
    # wsd: the 1 - sqrt decay takes the last decay_steps of total_steps; 0 stays at the peak
    # (a run that a longer continuation decays later).
    decay_steps: int = 0
    weight_decay: float = 0.01
    # False: each step removes learning_rate(step) * weight_decay of a weight (AdamW as in
    # optax and PyTorch). True: weight_decay is the share removed per step at the peak rate,
    # following the schedule's shape but not its size (optimi's decouple_lr, Composer's
    # decoupled optimizers; ModernBERT's decoupled_stableadamw with weight_decay 1e-5).
    lr_decoupled_weight_decay: bool = False
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    max_grad_norm: float | None = 1.0  # None or 0 disables clipping
    # Top-level parameter subtrees (slash-joined path prefixes, e.g. "nsp_head") that no update
    # touches, weight decay included: heads that the objective does not train.
    frozen: tuple[str, ...] = ()

    def __post_init__(self):
        def fail(field: str, valid: str):
            raise ValueError(
                f"OptimizerSettings.{field}={getattr(self, field)!r} is invalid; {valid}"
            )

        if self.name not in OPTIMIZERS:
            fail("name", f"valid values are {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            fail("schedule", f"valid values are {SCHEDULES}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            fail("learning_rate", "must be a finite number > 0")
        if not _is_int(self.total_steps) or self.total_steps < 1:
            fail("total_steps", "must be an integer >= 1")
        if not _is_int(self.warmup_steps) or not 0 <= self.warmup_steps <= self.total_steps:
            fail("warmup_steps", f"must be an integer in [0, total_steps={self.total_steps}]")
        free_steps = self.total_steps - self.warmup_steps
        if not _is_int(self.decay_steps) or not 0 <= self.decay_steps <= free_steps:
            fail(
                "decay_steps", f"must be an integer in [0, total_steps - warmup_steps={free_steps}]"
            )
        if not 0 <= self.end_learning_rate <= self.learning_rate:
            fail("end_learning_rate", f"must be in [0, learning_rate={self.learning_rate}]")
        if not (math.isfinite(self.polynomial_power) and self.polynomial_power > 0):
            fail("polynomial_power", "must be a finite number > 0")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            fail("weight_decay", "must be a finite number >= 0")
        for field in ("b1", "b2"):
            if not 0 <= getattr(self, field) < 1:
                fail(field, "must be in [0, 1)")
        if not (math.isfinite(self.eps) and self.eps >= 0):
            fail("eps", "must be a finite number >= 0")
        if self.max_grad_norm is not None and not (
            math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0
        ):
            fail("max_grad_norm", "must be None, 0 (no clipping) or a finite number > 0")
        if not isinstance(self.lr_decoupled_weight_decay, bool):
            fail("lr_decoupled_weight_decay", "must be True or False")
        if self.lr_decoupled_weight_decay and self.name == "lamb":
            fail("lr_decoupled_weight_decay", "applies to adamw and stable_adamw, not lamb")
        if not isinstance(self.frozen, tuple) or not all(
            isinstance(p, str) and p for p in self.frozen
        ):
            fail("frozen", "must be a tuple of parameter path prefixes such as ('nsp_head',)")


def make_schedule(s: OptimizerSettings) -> optax.Schedule:
    """Learning rate as a function of the step (the number of updates applied so far).

    All schedules warm up linearly, lr * step / warmup_steps for step < warmup_steps, then:
      linear:     end + (lr - end) * (1 - f)             f = (step - W) / (T - W), clipped to [0, 1]
      polynomial: end + (lr - end) * (1 - f) ** power    (NVIDIA's BERT uses power 0.5)
      cosine:     end + (lr - end) * (1 + cos(pi f)) / 2
      constant:   lr
      wsd:        lr until the last D = decay_steps steps of T, then
                  end + (lr - end) * (1 - sqrt(d))    d = (step - (T - D)) / D, clipped to [0, 1]
                  (warmup-stable-decay with Hägele et al.'s 1 - sqrt cooldown, as ModernBERT's
                  one_minus_sqrt). With D = 0 the rate stays at lr: such a run can be resumed
                  with a larger T and D > 0, and its steps so far had exactly the rates of the
                  longer schedule as long as T - D is not before the step it resumes from.
      google:     end + (lr - end) * (1 - min(step, T) / T)   -- google-research/bert:
                  the linear decay is counted from step 0, so right after warmup the rate is
                  lr * (1 - W / T) rather than lr.
    Past total_steps every decaying schedule stays at end_learning_rate. NVIDIA's
    PolyWarmUpScheduler measures polynomial progress from step 0; here it starts at the end
    of warmup, so the rate is continuous at the peak.
    """
    lr = float(s.learning_rate)
    end = float(s.end_learning_rate)
    warmup = int(s.warmup_steps)
    total = int(s.total_steps)
    decay_steps = total - warmup
    kind = s.schedule
    power = float(s.polynomial_power)
    cooldown = int(s.decay_steps)

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        # google: warmup_percent_done = global_step / num_warmup_steps.
        warmup_lr = lr * step / max(warmup, 1)
        if kind == "google":
            decayed = end + (lr - end) * (1.0 - jnp.minimum(step, total) / total)
        elif kind == "constant" or (kind == "wsd" and cooldown == 0):
            decayed = jnp.full_like(step, lr)
        elif kind == "wsd":
            frac = jnp.clip((step - (total - cooldown)) / cooldown, 0.0, 1.0)
            decayed = end + (lr - end) * (1.0 - jnp.sqrt(frac))
        else:
            if decay_steps > 0:
                frac = jnp.clip((step - warmup) / decay_steps, 0.0, 1.0)
            else:
                frac = jnp.ones_like(step)  # no room to decay: straight to the end rate
            if kind == "linear":
                decayed = end + (lr - end) * (1.0 - frac)
            elif kind == "polynomial":
                decayed = end + (lr - end) * (1.0 - frac) ** power
            else:  # cosine
                decayed = end + (lr - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
        return jnp.where(step < warmup, warmup_lr, decayed)

    return schedule


def _key_name(entry) -> str | None:
    """The name of one path entry: a dict key or an attribute; None for sequence indices."""
    if isinstance(entry, jax.tree_util.DictKey):
        return str(entry.key)
    if isinstance(entry, jax.tree_util.GetAttrKey):
        return entry.name
    return None


def _param_names(path) -> list[str]:
    """Names along a parameter path, without the `.value` of flax metadata boxes."""
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]
    return [n for n in map(_key_name, path) if n is not None]


def _decays(path) -> bool:
    names = _param_names(path)
    if any("layer_norm" in n.lower() or "layernorm" in n.lower() for n in names):
        return False
    # A norm's scale, whatever the norm is called (ModernBERT's attn_norm, final_norm, ...):
    # in every family only norms have a "scale" parameter.
    if names and names[-1] == "scale":
        return False
    # google-research/bert excludes any variable whose name contains "bias", which
    # covers both dense biases and the MLM head's output_bias.
    return not (names and "bias" in names[-1].lower())


def weight_decay_mask(params: Any) -> Any:
    """Tree of bools: True where weight decay (and LAMB's trust ratio) applies.

    False for biases and norm parameters, True for kernels and embeddings, as in
    google-research/bert (which decays embeddings too). Works on plain parameter trees and
    on trees of flax metadata boxes (nn.Partitioned), keeping the boxes.
    """
    return jax.tree_util.tree_map_with_path(lambda path, _: _decays(path), params)


def _is_stacked(path) -> bool:
    return STACKED_LAYERS in _param_names(path)


def scale_by_layerwise_trust_ratio() -> optax.GradientTransformation:
    """LAMB's trust ratio ||w|| / ||u||, per parameter tensor and per layer of stacked layers.

    The ratio is 1 where either norm is 0 (fresh zero-initialised tensors keep moving).
    Leaves under the scanned encoder's "layers" key hold all layers along axis 0, so their
    norms are taken per layer; this makes LAMB identical for scanned and unrolled layers.
    """

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("scale_by_layerwise_trust_ratio needs params in update()")

        def scale(path, update, param):
            axes = tuple(range(1, param.ndim)) if _is_stacked(path) and param.ndim > 0 else None
            p32 = param.astype(jnp.float32)
            u32 = update.astype(jnp.float32)
            param_norm = jnp.sqrt(jnp.sum(p32 * p32, axis=axes, keepdims=axes is not None))
            update_norm = jnp.sqrt(jnp.sum(u32 * u32, axis=axes, keepdims=axes is not None))
            zero = (param_norm == 0.0) | (update_norm == 0.0)
            ratio = jnp.where(zero, 1.0, param_norm / jnp.where(zero, 1.0, update_norm))
            return (u32 * ratio).astype(update.dtype)

        return jax.tree_util.tree_map_with_path(scale, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def _rms_divisor(path, grad, nu_hat, eps: float):
    """max(1, sqrt(mean(g^2 / max(v, eps^2)))) of one tensor, per layer of stacked layers."""
    axes = tuple(range(1, grad.ndim)) if _is_stacked(path) and grad.ndim > 0 else None
    g2 = jnp.square(grad.astype(jnp.float32))
    floor = jnp.maximum(nu_hat.astype(jnp.float32), eps * eps)
    # Where v and eps are both 0 the gradient is 0 too (v includes it): no contribution.
    ratio = jnp.where(floor > 0, g2 / jnp.where(floor > 0, floor, 1.0), 0.0)
    rms = jnp.sqrt(jnp.mean(ratio, axis=axes, keepdims=axes is not None))
    return jnp.maximum(1.0, rms)


def scale_by_stable_adam(
    b1: float, b2: float, eps: float, weight_decay: float = 0.0, weight_decay_mask=None
) -> optax.GradientTransformation:
    """StableAdamW's step before the learning rate: (Adam direction + weight_decay * w), divided
    per tensor by max(1, RMS of g / sqrt(max(v, eps^2))); the learning rate scaling follows.

    The state is optax.scale_by_adam's. `weight_decay_mask` is a tree of bools or a function of
    the params giving one, as for optax.add_decayed_weights. Leaves under the scanned encoder's
    "layers" key hold all layers along axis 0 and get one divisor per layer, so scanned and
    unrolled layers are updated alike.
    """
    adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

    def update_fn(grads, state, params=None):
        if params is None:
            raise ValueError("scale_by_stable_adam needs params in update()")
        directions, state = adam.update(grads, state, params)
        nu_hat = optax.tree.bias_correction(state.nu, b2, state.count)
        if weight_decay and weight_decay_mask is not None:
            decays = weight_decay_mask(params) if callable(weight_decay_mask) else weight_decay_mask
        else:
            decays = jax.tree.map(lambda _: bool(weight_decay), params)

        def step(path, grad, direction, v, param, decay):
            if decay:
                direction = direction + weight_decay * param.astype(direction.dtype)
            divisor = _rms_divisor(path, grad, v, eps)
            return (direction / divisor).astype(direction.dtype)

        updates = jax.tree_util.tree_map_with_path(step, grads, directions, nu_hat, params, decays)
        return updates, state

    return optax.GradientTransformation(adam.init, update_fn)


def _frozen_mask(prefixes: tuple[str, ...]):
    def mask(params):
        def frozen(path, _):
            name = "/".join(_param_names(path))
            return any(name == p or name.startswith(p + "/") for p in prefixes)

        return jax.tree_util.tree_map_with_path(frozen, params)

    return mask


def freeze(prefixes: tuple[str, ...]) -> optax.GradientTransformation:
    """Zero updates for the parameters under the given slash-joined path prefixes."""
    mask = _frozen_mask(prefixes)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("freeze needs params in update()")
        return jax.tree.map(
            lambda u, frozen: jnp.zeros_like(u) if frozen else u, updates, mask(params)
        ), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_optimizer(s: OptimizerSettings) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW, LAMB or StableAdamW with the weight-decay mask and
    schedule, then the frozen parameters' updates set to zero."""
    schedule = make_schedule(s)
    # Decay added before the learning rate is applied is multiplied by learning_rate(step);
    # dividing by the peak leaves (learning_rate(step) / peak) * weight_decay.
    weight_decay = (
        s.weight_decay / s.learning_rate if s.lr_decoupled_weight_decay else s.weight_decay
    )
    if s.name == "adamw":
        core = optax.adamw(
            schedule,
            b1=s.b1,
            b2=s.b2,
            eps=s.eps,
            weight_decay=weight_decay,
            mask=weight_decay_mask,
        )
    elif s.name == "stable_adamw":
        core = optax.chain(
            scale_by_stable_adam(s.b1, s.b2, s.eps, weight_decay, weight_decay_mask),
            optax.scale_by_learning_rate(schedule),
        )
    else:
        # You et al.'s LAMB as in NVIDIA's BERT: Adam moments, decoupled weight decay, then
        # the layer-wise trust ratio; parameters excluded from weight decay are also
        # excluded from layer adaptation (their trust ratio is 1).
        core = optax.chain(
            optax.scale_by_adam(b1=s.b1, b2=s.b2, eps=s.eps),
            optax.add_decayed_weights(s.weight_decay, mask=weight_decay_mask),
            optax.masked(scale_by_layerwise_trust_ratio(), weight_decay_mask),
            optax.scale_by_learning_rate(schedule),
        )
    if s.frozen:
        core = optax.chain(core, freeze(s.frozen))
    if s.max_grad_norm:
        return optax.chain(optax.clip_by_global_norm(s.max_grad_norm), core)
    return core
