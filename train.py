"""Pretrain BERT: `python train.py --config configs/tiny.py --workdir runs/tiny [--config.K=V ...]`.

With no arguments it trains the tiny config on the built-in demo corpus in runs/tiny.
Rerunning the same command resumes from the latest checkpoint. On a Cloud TPU pod slice or a
multi-node GPU job, pass --distributed on every host (JAX finds its peers itself); elsewhere
give --coordinator_address, --num_processes and --process_id.
"""

import os

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import trainer

_REPO = os.path.dirname(os.path.abspath(__file__))

config_flags.DEFINE_config_file(
    "config", os.path.join(_REPO, "configs", "tiny.py"), "Training config file.", lock_config=True
)
flags.DEFINE_string("workdir", "runs/tiny", "Where data, checkpoints and metrics go.")
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (multi-host).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes, for multi-process runs.")
flags.DEFINE_integer("process_id", None, "This process's index, for multi-process runs.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # Library chatter (Orbax logs every save at INFO) would drown the progress bar.
    logging.set_verbosity(logging.WARNING)
    # The distributed runtime must start before anything touches a device.
    if FLAGS.distributed or FLAGS.coordinator_address:
        jax.distributed.initialize(
            coordinator_address=FLAGS.coordinator_address,
            num_processes=FLAGS.num_processes,
            process_id=FLAGS.process_id,
        )
    try:
        trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except trainer.ConfigError as e:
        # A config mistake is the user's to fix: say what, without a traceback.
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    app.run(main)
