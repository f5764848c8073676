"""Compile once: a second process of a command or a notebook loads the programs the first
compiled, from the user's default cache directory, unless the setting turns it off (where
the setting points it, and who decides, is tests/unit/test_compilation_cache.py's)."""

import pathlib
import re
import subprocess
import sys

import pytest

from tests.helpers.corpora import write_topic_csv
from tests.helpers.xla_env import subprocess_env

REPO = pathlib.Path(__file__).resolve().parents[2]
# finetune.py's summary: "... (12 %, 9 programs compiled, 0 loaded from the compilation cache)"
SUMMARY = re.compile(r"(\d+) programs compiled, (\d+) loaded from the compilation cache")
# A notebook session: open the run, predict, and count what jax compiled and loaded.
NOTEBOOK = """
import sys
import bertjax
from bertjax.engine import perf
with perf.CompileTime() as counted:
    print(bertjax.Model.load(sys.argv[1]).predict(["w1 w2 w3", "w4"]))
print(f"compiled {counted.programs} loaded {counted.loaded}")
"""


def users_environment(cache_home: pathlib.Path) -> dict[str, str]:
    """A process as a user starts it: the suite's flags, but no compilation cache of the
    suite's, and `cache_home` as the user's cache directory."""
    env = subprocess_env(1)
    for variable in list(env):
        if variable.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "BERTJAX_COMP")):
            del env[variable]
    env["XDG_CACHE_HOME"] = str(cache_home)
    return env


def finetune(pretrained_run, data: pathlib.Path, workdir, env, *flags) -> tuple[int, int]:
    """(programs compiled, programs loaded) of one finetune.py command."""
    process = subprocess.run(
        [
            sys.executable,
            str(REPO / "finetune.py"),
            f"--workdir={workdir}",
            f"--config.init_from={pretrained_run[0]}",
            "--config.task=classification",
            f"--config.data.train={data / 'train.csv'}",
            f"--config.data.validation={data / 'dev.csv'}",
            "--config.num_epochs=1",
            "--config.batch_size=8",
            "--config.eval_batch_size=8",
            "--config.data.max_seq_length=32",
            "--config.mesh_shape=(1,1,1)",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    compiled, loaded = SUMMARY.search(process.stdout).groups()
    return int(compiled), int(loaded)


def entries(directory: pathlib.Path) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


@pytest.mark.slow
def test_a_second_run_or_seed_compiles_nothing_unless_the_cache_is_off(pretrained_run, tmp_path):
    topics = pretrained_run[1]
    write_topic_csv(tmp_path / "train.csv", topics, 32, seed=1)
    write_topic_csv(tmp_path / "dev.csv", topics, 16, seed=2)
    env = users_environment(tmp_path / "home")
    default = tmp_path / "home" / "bertjax" / "xla"

    compiled, loaded = finetune(pretrained_run, tmp_path, tmp_path / "first", env)
    assert compiled >= 2 and loaded == 0  # a train and an evaluation step at least
    written = entries(default)
    assert written
    # The same command again, as another seed in another directory: every program is loaded.
    second = finetune(pretrained_run, tmp_path, tmp_path / "again", env, "--config.seeds=2")
    assert second == (0, compiled)
    assert entries(default) == written

    # Distilling from that run: the teacher's program is kept and loaded as the steps' are.
    teacher = f"--config.distill.teacher={tmp_path / 'first'}"
    distilled = finetune(pretrained_run, tmp_path, tmp_path / "distilled", env, teacher)
    assert distilled[0] > 0
    again = finetune(pretrained_run, tmp_path, tmp_path / "again_distilled", env, teacher)
    assert again == (0, sum(distilled))
    written = entries(default)

    # Turned off by the flag, which wins over the variable: nothing loaded or written.
    moved = tmp_path / "moved"
    env_moved = {**env, "BERTJAX_COMPILATION_CACHE": str(moved)}
    off = finetune(pretrained_run, tmp_path, tmp_path / "off", env_moved, "--compilation_cache=off")
    assert off == (compiled, 0)
    assert entries(default) == written and not entries(moved)

    # A notebook: Model.load keeps its programs for the next session.
    counts = []
    for _ in range(2):
        process = subprocess.run(
            [sys.executable, "-c", NOTEBOOK, str(tmp_path / "first")],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=True,
        )
        found = re.search(r"compiled (\d+) loaded (\d+)", process.stdout)
        counts.append(tuple(map(int, found.groups())))
    (compiled, loaded), again = counts
    assert compiled > 0  # the notebook's own programs: not a training run's
    assert again == (0, compiled + loaded)
