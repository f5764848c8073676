"""Fine-tune a pretrained BERT on a task:

    python finetune.py --workdir runs/sst2 --config.init_from=runs/tiny \
        --config.data.glue_task=sst2 --config.data.dir=glue/SST-2

See configs/finetune.py for every field: your own CSV/TSV/JSON Lines/CoNLL files, the task,
several seeds (--config.seeds=1,2,3). Rerunning the same command resumes. On a pod slice or
a multi-node GPU job pass --distributed on every host, as for train.py.

Every failure ends in one line naming what went wrong and a non-zero exit; --verbose shows
the traceback too.
"""

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import settings as settings_lib
from bertjax import trainer
from bertjax.checkpoint import CheckpointRestoreError, CheckpointSaveError
from bertjax.finetune import data, loop
from bertjax.inference import InferenceError

_REPO = os.path.dirname(os.path.abspath(__file__))
_DEFAULT_CONFIG = os.path.join(_REPO, "configs", "finetune.py")

# The --config flag is defined by define_config_flag(), which reports bad overrides.
flags.DEFINE_string("workdir", "runs/finetune", "Where checkpoints, metrics and predictions go.")
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (multi-host).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes, for multi-process runs.")
flags.DEFINE_integer("process_id", None, "This process's index, for multi-process runs.")
flags.DEFINE_bool("verbose", False, "Show the traceback of a failure, not just its message.")
FLAGS = flags.FLAGS

# Failures whose message says what to fix; anything else also names its type.
_EXPECTED = (
    settings_lib.ConfigError,
    data.TaskDataError,
    trainer.NonFiniteError,
    InferenceError,
    CheckpointRestoreError,
    CheckpointSaveError,
    FileNotFoundError,
)


def _config_path(argv: list[str]) -> str:
    for index, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
    return _DEFAULT_CONFIG


def _unknown_field(argv: list[str]) -> str | None:
    """A message naming the first --config.FIELD override that the config does not have."""
    spec = importlib.util.spec_from_file_location("_config", _config_path(argv))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        field = arg[len("--config.") :].split("=", 1)[0]
        try:
            settings_lib.config_value(config, field)
        except (KeyError, AttributeError):
            guess = settings_lib.suggest_field(config, field)
            hint = f"; did you mean config.{guess}?" if guess else ""
            return f"config.{field} is not a field of {_config_path(argv)}{hint}"
    return None


def _reporting_bad_overrides(parse: Callable[[], Any], argv: list[str]) -> Any:
    """Runs a step of flag parsing; a bad --config override ends in one line."""
    try:
        return parse()
    except flags.Error as e:
        raise SystemExit(f"error: {e}") from None
    except (AttributeError, KeyError, ValueError, TypeError) as e:
        message = _unknown_field(argv) or f"bad --config override: {e}"
        raise SystemExit(f"error: {message}") from None


def define_config_flag() -> None:
    # ml_collections applies the --config.FIELD overrides of sys.argv as the flag is defined.
    _reporting_bad_overrides(
        lambda: config_flags.DEFINE_config_file(
            "config", _DEFAULT_CONFIG, "Fine-tuning config file.", lock_config=True
        ),
        sys.argv,
    )


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a bad config override reported in one line."""
    return _reporting_bad_overrides(lambda: FLAGS(argv), argv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # Library chatter (Orbax logs every save at INFO) would drown the progress bar.
    logging.set_verbosity(logging.WARNING)
    try:
        if FLAGS.distributed or FLAGS.coordinator_address:
            jax.distributed.initialize(
                coordinator_address=FLAGS.coordinator_address,
                num_processes=FLAGS.num_processes,
                process_id=FLAGS.process_id,
            )
        settings = settings_lib.FinetuneSettings.from_config(
            FLAGS.config, process_count=jax.process_count()
        )
        loop.finetune(settings, FLAGS.workdir)
    except KeyboardInterrupt:
        raise SystemExit("interrupted") from None
    except Exception as e:
        if FLAGS.verbose:
            raise
        message = str(e) if isinstance(e, _EXPECTED) else f"{type(e).__name__}: {e}"
        if not isinstance(e, _EXPECTED):
            message += " (--verbose shows where)"
        raise SystemExit(f"error: {message}") from None


if __name__ == "__main__":
    define_config_flag()
    app.run(main, flags_parser=parse_flags)
