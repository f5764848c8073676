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

from bertjax.encoders.bert import hf as bert_hf
from bertjax.encoders.bert.config import BertConfig
from bertjax.engine.optim import OptimizerSettings
from bertjax.finetune.batches import epoch_order

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


class TorchEpochs:
    """Fine-tuning epochs of a transformers model as a torch user's loop runs them, on
    bertjax's examples in the order bertjax's epochs take them, three ways:

    padded: every batch at max_seq_length (run_glue.py's default, --pad_to_max_length);
    dynamic: each batch padded to its longest example (DataCollatorWithPadding);
    grouped: each batch sorted by length and run as `micro_batches` slices, each padded to
        its longest, each slice's loss weighted by its share, one update (the careful loop).

    AdamW with google's decay mask, a linear schedule, clipping at 1.0; `targets` are the
    features the model's loss reads (labels, or start and end positions).
    """

    MODES = ("padded", "dynamic", "grouped")

    def __init__(
        self,
        model: torch.nn.Module,
        examples: Any,
        settings: OptimizerSettings,
        mode: str,
        *,
        batch_size: int,
        micro_batches: int,
        targets: Sequence[str],
        autocast: torch.dtype | None = None,
    ):
        if mode not in self.MODES:
            raise ValueError(f"mode {mode!r}: choose from {self.MODES}")
        self.model = model.to(device())
        self.examples, self.mode = examples, mode
        self.batch_size, self.micro_batches = batch_size, micro_batches
        self.targets, self.autocast = tuple(targets), autocast
        self.optimizer = adamw(self.model, settings)
        self.schedule = linear_schedule(self.optimizer, settings)
        self.epoch = 0

    def inputs(self, rows: np.ndarray, with_targets: bool = True) -> dict[str, torch.Tensor]:
        """The rows as the model's inputs, padded as the mode pads."""
        features = self.examples.features
        width = None
        if self.mode != "padded":
            width = int(features["input_mask"][rows].sum(axis=1).max())
        names = {**INPUT_NAMES, **({t: t for t in self.targets} if with_targets else {})}
        return tensors(features, rows, width, names)

    def steps(self) -> Iterable[Step]:
        """The epoch's steps (bertjax.finetune.batches.epoch_order's order, seed 0)."""
        order = epoch_order(0, self.epoch, len(self.examples))
        lengths = self.examples.features["input_mask"].sum(axis=1)
        for index in range(len(self.examples) // self.batch_size):
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            if self.mode != "grouped":
                yield self.inputs(rows)
                continue
            ordered = rows[np.argsort(lengths[rows], kind="stable")]
            yield [
                (self.inputs(part), len(part) / len(rows))
                for part in np.array_split(ordered, self.micro_batches)
            ]

    def run_epoch(self) -> float:
        loss = train(
            self.model,
            self.steps(),
            self.optimizer,
            schedule=self.schedule,
            max_grad_norm=1.0,
            autocast=self.autocast,
        )
        self.epoch += 1
        return loss

    def forward(self) -> Iterable[tuple[np.ndarray, Any]]:
        """(rows, the model's output) of no-grad passes over every example in batches, the
        grouped mode's sorted by length first (torch's sorted prediction)."""
        self.model.eval()
        order = np.arange(len(self.examples))
        if self.mode == "grouped":
            order = np.argsort(self.examples.features["input_mask"].sum(axis=1), kind="stable")
        kind = next(self.model.parameters()).device.type
        with torch.no_grad():
            for first in range(0, len(order), self.batch_size):
                rows = order[first : first + self.batch_size]
                enabled = self.autocast is not None
                with torch.autocast(kind, dtype=self.autocast, enabled=enabled):
                    yield rows, self.model(**self.inputs(rows, with_targets=False))
