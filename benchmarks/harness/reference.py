"""The reference library's side of a benchmark: transformers' configs, inputs in its names,
torch's AdamW as google's recipe sets it, and the one torch training loop.

Every benchmark that trains a transformers model beside bertjax trains it with `train`: per
step, the gradients zeroed, each micro-batch's loss (weighted by its share of the batch)
back-propagated, the gradient clipped, the optimizer and its schedule stepped; the last
step's loss is returned as a float, which waits for the device, so `train` is timed by
benchmarks.harness.timing like any jax side.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import transformers

from bertjax.encoders.bert import transformers as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine.optim import OptimizerSettings

# bertjax's feature names and transformers' for the same inputs.
INPUT_NAMES = {
    "input_ids": "input_ids",
    "input_mask": "attention_mask",
    "segment_ids": "token_type_ids",
}

Batch = Mapping[str, torch.Tensor]
# One step's input: a batch, or micro-batches as (batch, weight) pairs whose weighted losses'
# gradients add up to the step's one update (weights: each micro-batch's share of the batch).
Step = Batch | Sequence[tuple[Batch, float]]


def use_threads(count: int | None = None) -> int:
    """torch's threads: every core by default, as bertjax's side gets them."""
    torch.set_num_threads(count or os.cpu_count() or 1)
    return torch.get_num_threads()


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bert_config(config: BertConfig, **overrides: Any) -> transformers.BertConfig:
    """transformers' BertConfig of the same architecture as `config` (and `overrides`, e.g.
    num_labels)."""
    return transformers.BertConfig(**{**bert_hf.config_to_hf(config), **overrides})


def tensors(
    features: Mapping[str, np.ndarray],
    rows: np.ndarray | slice = slice(None),
    width: int | None = None,
    names: Mapping[str, str] = INPUT_NAMES,
    on: torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """The `rows` of bertjax features as transformers' int64 inputs (renamed by `names`),
    each 2-D feature cut to `width` positions."""
    out = {}
    for ours, theirs in names.items():
        array = np.asarray(features[ours])[rows]
        if array.ndim == 2 and width is not None:
            array = array[:, :width]
        out[theirs] = torch.from_numpy(array.astype(np.int64)).to(on or device())
    return out


def no_decay(name: str) -> bool:
    """google's decay mask: biases and LayerNorm take no weight decay."""
    return "bias" in name or "LayerNorm" in name


def adamw(
    model: torch.nn.Module, settings: OptimizerSettings, *, decay_mask: bool = True
) -> torch.optim.AdamW:
    """torch's AdamW with the settings' rate, betas, eps and weight decay (none on biases and
    LayerNorm with `decay_mask`, as BERT's recipe)."""
    named = list(model.named_parameters())
    if decay_mask:
        groups = [
            {"params": [p for n, p in named if not no_decay(n)]},
            {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": [p for _, p in named]}]
    return torch.optim.AdamW(
        groups,
        lr=settings.learning_rate,
        betas=(settings.b1, settings.b2),
        eps=settings.eps,
        weight_decay=settings.weight_decay,
    )


def linear_schedule(optimizer: torch.optim.Optimizer, settings: OptimizerSettings):
    """transformers' linear warm-up and decay over the settings' steps."""
    return transformers.get_linear_schedule_with_warmup(
        optimizer, settings.warmup_steps, settings.total_steps
    )


def model_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The loss a transformers model computes from its labels in the batch."""
    return model(**batch).loss


def train(
    model: torch.nn.Module,
    steps: Iterable[Step],
    optimizer: torch.optim.Optimizer,
    *,
    schedule: Any = None,
    max_grad_norm: float | None = None,
    autocast: torch.dtype | None = None,
    loss: Callable[[torch.nn.Module, Batch], torch.Tensor] = model_loss,
) -> float:
    """Trains `model` one step per item of `steps` (a batch, or (batch, weight) micro-batches)
    and returns the last step's loss (the sum of its micro-batches' weighted losses)."""
    model.train()
    kind = next(model.parameters()).device.type
    last = None
    for step in steps:
        parts = [(step, 1.0)] if isinstance(step, Mapping) else step
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for batch, weight in parts:
            with torch.autocast(kind, dtype=autocast, enabled=autocast is not None):
                value = loss(model, batch) * weight
            value.backward()
            total = total + value.detach()
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        last = total
    if last is None:
        raise ValueError("train() was given no step")
    value = float(last)  # waits for the device
    if not math.isfinite(value):
        raise FloatingPointError(f"the torch loop's loss is {value}")
    return value
