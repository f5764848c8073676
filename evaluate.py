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

from bertjax import cli
from bertjax.glue import suite
from bertjax.glue.settings import SuiteSettings
from finetune import EXPECTED_FAILURES

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "glue.py")


def evaluate(config, workdir: str) -> None:
    """Runs the suite. Its runs of the same shapes (a configuration's seeds, a curve's steps,
    the next task) load their programs from the compilation cache that every command keeps
    (bertjax.engine.compilation_cache, turned on by bertjax.cli)."""
    suite.run_suite(SuiteSettings.from_config(config), workdir)


if __name__ == "__main__":
    cli.define_flags(DEFAULT_CONFIG, "runs/glue", "GLUE suite")
    cli.run(evaluate, DEFAULT_CONFIG, EXPECTED_FAILURES)
