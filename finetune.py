"""Fine-tune a pretrained BERT on a task:

    python finetune.py --workdir runs/sst2 --config.init_from=runs/tiny \
        --config.data.glue_task=sst2 --config.data.dir=glue/SST-2

See configs/finetune.py for every field: your own CSV/TSV/JSON Lines/CoNLL files, the task,
several seeds (--config.seeds=1,2,3). Rerunning the same command resumes. On a pod slice or
a multi-node GPU job pass --distributed on every host, as for train.py.

Every failure ends in one line naming what went wrong and a non-zero exit; --verbose shows
the traceback too.
"""

import os

import jax

from bertjax import cli
from bertjax.engine.checkpoint import CheckpointRestoreError, CheckpointSaveError
from bertjax.engine.loop import NonFiniteError
from bertjax.engine.rundir import WorkdirLockedError
from bertjax.engine.settings import ConfigError
from bertjax.finetune import data, loop
from bertjax.finetune.settings import FinetuneSettings
from bertjax.inference import InferenceError
from bertjax.storage import fs

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "finetune.py")

# Failures whose message says what to fix; anything else also names its type.
EXPECTED_FAILURES = (
    ConfigError,
    data.TaskDataError,
    NonFiniteError,
    InferenceError,
    CheckpointRestoreError,
    CheckpointSaveError,
    WorkdirLockedError,
    FileNotFoundError,
    fs.StorageError,
)


def finetune(config, workdir: str) -> None:
    settings = FinetuneSettings.from_config(config, process_count=jax.process_count())
    loop.finetune(settings, workdir)


if __name__ == "__main__":
    cli.define_flags(DEFAULT_CONFIG, "runs/finetune", "Fine-tuning")
    cli.run(finetune, DEFAULT_CONFIG, EXPECTED_FAILURES)
