"""The model a fine-tuning run starts from: init_from opened, and a new run's first train
state with its parameters, as the head's capability takes them (bertjax.capability)."""

from __future__ import annotations

import os
from typing import Any

import jax

from bertjax import capability
from bertjax.engine import checkpoint as checkpoint_lib
from bertjax.engine import rundir, steps
from bertjax.engine.settings import ConfigError
from bertjax.finetune.objective import Finetuning


def open_source(path: str | os.PathLike, step: int | None = None) -> rundir.Run:
    """Opens what init_from is (at a checkpoint `step` of a work directory, if given): its
    architecture, tokenizer and head (parameters come later)."""
    try:
        # A fine-tuning run never uses MLM/NSP heads: a BertModel directory lacks nothing.
        return rundir.open_run(path, step, pretraining_heads=False)
    except (ValueError, FileNotFoundError, checkpoint_lib.CheckpointRestoreError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"config.init_from={str(path)!r}: {err}") from None


def initial_params(source: rundir.Run, ft: Finetuning, fresh: Any) -> tuple[Any, str, bool]:
    """The run's first parameters from init_from, placed on the mesh, as the head's capability
    takes them (the encoder, and the head if the source has this run's); a line saying what
    was taken; whether the head starts fresh."""
    _, params = rundir.read_params(source, ft.mesh)
    params, note, fresh_head = capability.of(ft.head).warm_start(
        ft.model_config, ft.head, source, params, fresh
    )
    return jax.device_put(params, ft.state.shardings.params), note, fresh_head


def first_state(
    source: rundir.Run, ft: Finetuning, rng: jax.Array
) -> tuple[steps.TrainState, str, bool]:
    """A new run's first train state: `initial_params` over `ft.state.init(rng)`, the same
    arrays, with the parameters' line and whether the head starts fresh. Where the head's
    capability takes the source's subtrees as they are (Capability.warm_start), one program
    computes only what the source does not give (a fresh head, the optimizer state): a
    random encoder is neither compiled nor computed only to be overwritten."""
    head = capability.of(ft.head)
    if type(head).warm_start is not capability.Capability.warm_start:
        # A warm start of its own (seq2seq's rearranges weights on the host) takes the
        # whole fresh initialisation.
        state = ft.state.init(rng)
        params, note, fresh_head = initial_params(source, ft, state.params)
        return state.replace(params=params), note, fresh_head
    _, given = rundir.read_params(source, ft.mesh)

    def take(given, fresh):
        return head.warm_start(ft.model_config, ft.head, source, given, fresh)[0]

    # The line and whether the head starts fresh depend on the trees' structure only.
    _, note, fresh_head = head.warm_start(
        ft.model_config, ft.head, source, given, ft.state.abstract.params
    )
    return ft.state.init_taking(rng, given, take), note, fresh_head
