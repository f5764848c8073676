"""Preparation by several processes: a two-file corpus, free ports, the processes' run and
their shards read back."""

import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Sequence

import pytest

from bertjax.data import prepare
from tests.helpers.corpora import write_random_corpus
from tests.helpers.xla_env import REPO as ROOT

SETTINGS = [
    "--max_seq_length=48",
    "--vocab_size=300",
    "--workers=1",
    "--eval_fraction=0.1",
    "--seed=7",
    "--chunk_mb=0.01",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    """Two files, so that chunks straddle a file boundary."""
    root = tmp_path_factory.mktemp("distributed") / "corpus"
    root.mkdir()
    write_random_corpus(root / "a.txt", 150, seed=1)
    write_random_corpus(root / "b.txt", 100, seed=2)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_in_processes(
    inputs: list[str], output: str, count: int, extra: Sequence[str] = ()
) -> list[str]:
    """Runs the prepare command line in `count` processes of one jax.distributed job, with
    SETTINGS and the `extra` flags."""
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bertjax.data.prepare",
                "--input",
                *inputs,
                "--output",
                output,
                *SETTINGS,
                *extra,
                f"--coordinator_address={address}",
                f"--num_processes={count}",
                f"--process_id={i}",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(count)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return outputs


def files_of(directory: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def single_process(corpus: pathlib.Path, out: pathlib.Path, **extra) -> dict:
    kwargs = dict(extra)
    for flag in SETTINGS:
        name, value = flag[2:].split("=")
        kwargs[name] = float(value) if "." in value else int(value)
    return prepare([str(corpus)], out, verbose=False, **kwargs)
