"""A fine-tuning run's epochs and evaluation as finetune.py runs them, for the benchmarks
that time them beside transformers (benchmarks.finetune, benchmarks.qa).

Host batches from each epoch's order (bertjax.finetune.batches.epoch_order, seed 0), cut to the
run's training widths, assembled into global arrays, the jitted and donated train step; the
loop's evaluation (run_eval at the run's evaluation widths). `micro_batches` > 1: each batch
as micro-batches grouped by length (config.grad_accum_steps); `token_capacity` below 1: the
dense layers on packed token slots (config.token_capacity).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bertjax.capability import HeadSpec
from bertjax.engine import perf, steps
from bertjax.engine.optim import OptimizerSettings
from bertjax.finetune import batches, evaluation, warm_start, widths
from bertjax.finetune.objective import build_finetuning
from bertjax.finetune.task import Examples


class Epochs:
    """One side of a fine-tuning benchmark: a model, its train state and its epochs."""

    def __init__(
        self,
        config: Any,
        head: HeadSpec,
        examples: Examples,
        optimizer: OptimizerSettings,
        *,
        batch_size: int,
        epochs: int,
        seed: int,
        token_capacity: float = 1.0,
        length_bucket: int = 32,
        micro_batches: int = 1,
        source: Any = None,
    ):
        """`epochs`: how many the benchmark runs (its widths are the run's, as finetune.py
        chooses them for that many); `length_bucket` 0: every batch at full length;
        `source`: a run or transformers directory whose encoder the model starts from."""
        self.examples, self.batch_size = examples, batch_size
        self.length_bucket, self.micro_batches = length_bucket, micro_batches
        self.train_widths = widths.training_widths(
            examples, (0,), epochs, batch_size, micro_batches, length_bucket
        )
        self.eval_widths = widths.evaluation_widths([examples], length_bucket)
        self.ft = build_finetuning(
            config,
            head,
            optimizer,
            mesh_shape=(-1, 1, 1),
            grad_accum_steps=micro_batches,
            micro_batch_size=batch_size // micro_batches,
            max_seq_length=examples.features["input_mask"].shape[1],
            token_capacity=token_capacity,
        )
        with jax.set_mesh(self.ft.mesh):
            self.state = self.ft.state.init(jax.random.key(seed))
            if source is not None:  # the encoder's real weights, a fresh head
                params, _, _ = warm_start.initial_params(source, self.ft, self.state.params)
                self.state = self.state.replace(params=params)
        self.rng = jax.random.key(seed + 1)
        self.epoch = 0
        self.packed = 0.0  # the share of the last step's micro-batches that ran packed

    def widths(self) -> str:
        """The run's training and evaluation widths, as a line."""
        return (
            f"training {', '.join(map(str, self.train_widths or ('full',)))}; "
            f"evaluation {', '.join(map(str, self.eval_widths or ('full',)))}"
        )

    def compile_widths(self) -> None:
        """Compiles the train step and the evaluation at every width the run meets, as a long
        run has after its first steps (an epoch of a few steps would meet new widths in the
        timed rounds). The steps run on a throwaway state."""
        features = self.examples.features
        seq = features["input_mask"].shape[1]
        rows = self.batch_size // self.micro_batches

        def cut(count: int, width: int) -> dict[str, np.ndarray]:
            batch = {
                k: v[:count, :width] if v.ndim == 2 else v[:count] for k, v in features.items()
            }
            batch["weights"] = np.ones(count, np.float32)
            return batch

        with jax.set_mesh(self.ft.mesh):
            state = self.ft.state.init(jax.random.key(0))
            metrics = None
            for width in self.train_widths or (seq,):
                micro = cut(rows, width)
                batch = [micro] * self.micro_batches if self.micro_batches > 1 else micro
                state, metrics = self.ft.steps.take_step(state, batch, self.rng)
            jax.block_until_ready(metrics)
            for width in self.eval_widths or (seq,):  # run_eval's widths and rows per call
                batch = cut(perf.rows_per_call(width, self.batch_size), width)
                global_batch = steps.global_batch(batch, self.ft.batch_sharding, 1)
                jax.block_until_ready(self.ft.eval_step(state.params, global_batch))

    def run_epoch(self) -> float:
        """Trains one epoch; the last step's loss (which waits for the device)."""
        order = batches.epoch_order(0, self.epoch, len(self.examples))
        metrics = None
        with jax.set_mesh(self.ft.mesh):
            for index in range(len(self.examples) // self.batch_size):
                if self.micro_batches > 1:
                    local = batches.train_micro_batches(
                        self.examples,
                        order,
                        index,
                        self.batch_size,
                        self.micro_batches,
                        self.length_bucket,
                        self.train_widths,
                    )
                else:
                    local = batches.train_batch(
                        self.examples,
                        order,
                        index,
                        self.batch_size,
                        self.length_bucket,
                        self.train_widths,
                    )
                self.state, metrics = self.ft.steps.take_step(self.state, local, self.rng)
        self.epoch += 1
        self.packed = float(metrics.get("train/packed", 0.0))
        loss = float(metrics["train/loss"])
        if not np.isfinite(loss):
            raise FloatingPointError(f"bertjax's epoch ended with loss {loss}")
        return loss

    def predict(self) -> dict[str, np.ndarray]:
        """The loop's evaluation of every example: the objective's outputs, in order."""
        with jax.set_mesh(self.ft.mesh):
            _, outputs = evaluation.run_eval(
                self.ft,
                self.state.params,
                self.examples,
                self.batch_size,
                self.length_bucket or 32,
                self.eval_widths,
            )
        return outputs
