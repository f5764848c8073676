"""Pretrain BERT: `python train.py --config configs/tiny.py --workdir runs/tiny [--config.K=V ...]`.

With no arguments it trains the tiny config on the built-in demo corpus in runs/tiny.
Rerunning the same command resumes from the latest checkpoint. On a Cloud TPU pod slice or a
multi-node GPU job, pass --distributed on every host (JAX finds its peers itself); elsewhere
give --coordinator_address, --num_processes and --process_id.

Every failure ends in one line naming what went wrong and a non-zero exit; --verbose shows
the traceback too.
"""

import os

import jax

from bertjax import cli
from bertjax.engine import checkpoint, loop, rundir
from bertjax.engine.settings import ConfigError
from bertjax.pretrain import loop as pretrain_loop
from bertjax.pretrain.settings import PretrainSettings

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "tiny.py")

# Failures whose message names the cause and what to do: bad config or input (data
# preparation reports bad input as ValueError), a non-finite loss, a busy work directory, a
# checkpoint that could not be written or read.
EXPECTED_FAILURES = (
    ConfigError,
    ValueError,
    loop.NonFiniteError,
    rundir.WorkdirLockedError,
    checkpoint.CheckpointSaveError,
    checkpoint.CheckpointRestoreError,
)


def pretrain(config, workdir_path: str) -> None:
    settings = PretrainSettings.from_config(config, process_count=jax.process_count())
    pretrain_loop.train_and_evaluate(settings, workdir_path)


if __name__ == "__main__":
    cli.define_flags(DEFAULT_CONFIG, "runs/tiny", "Training")
    cli.run(pretrain, DEFAULT_CONFIG, EXPECTED_FAILURES)
