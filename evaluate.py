"""Run the GLUE suite on a pretrained model and write its table beside published rows:

    python evaluate.py --config configs/glue.py --workdir runs/glue-base \
        --config.init_from=runs/base --config.data_dir=glue/

Every present task's sweep and seeds are fine-tuning runs in <workdir>/<task>/...; the table
goes to <workdir>/results.md and results.json and is printed at the end. Rerunning the same
command resumes: finished runs are not redone. --config.steps=1000,2000 (or all) compares
pretraining checkpoints (curve.png); --config.submission=True writes submission.zip for the
GLUE server. See docs/glue.md, configs/glue.py and configs/glue_modernbert.py.

Every failure ends in one line naming what went wrong and a non-zero exit; --verbose shows
the traceback too.
"""

import os

import jax

from bertjax import cli, fs
from bertjax.glue import suite
from bertjax.glue.settings import SuiteSettings
from finetune import EXPECTED_FAILURES

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "glue.py")


# Under the suite's work directory unless JAX_COMPILATION_CACHE_DIR names one.
COMPILATION_CACHE_DIR = "compilation_cache"


def evaluate(config, workdir: str) -> None:
    settings = SuiteSettings.from_config(config)
    share_compiled_programs(workdir)
    suite.run_suite(settings, workdir)


def share_compiled_programs(workdir: str) -> None:
    """Runs of the same shapes (a configuration's seeds, a curve's steps) read their programs
    back from jax's persistent compilation cache instead of compiling them again: on two
    busy CPU cores a second seed of SST-2 compiled for 37.5 s instead of 50.8 s
    (benchmarks/glue.py). Every program is kept, however quickly it compiled: a suite's
    small ones add up."""
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", fs.join(workdir, COMPILATION_CACHE_DIR))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


if __name__ == "__main__":
    cli.define_flags(DEFAULT_CONFIG, "runs/glue", "GLUE suite")
    cli.run(evaluate, DEFAULT_CONFIG, EXPECTED_FAILURES)
