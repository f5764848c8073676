"""bertjax.engine.host_memory: a CPU step writes into pages the step before it already mapped.

Each case runs in a fresh process: jax reads where a program runs when it creates its CPU
client, so only a process that asks before that shows the effect.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from bertjax.engine import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Twenty executions of a program with a 64 MB buffer between its two products; prints
# whether keep_freed_memory took effect and the minor page faults of those executions.
STEPS = textwrap.dedent(
    """
    import resource
    from bertjax.engine import host_memory
    kept = host_memory.keep_freed_memory()
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(x, w):
        y = jnp.tanh(x @ w)  # [8192, 2048] float32: 64 MB, freed when the program ends
        return y.T @ x

    x = jnp.ones((8192, 64), jnp.float32)
    w = jnp.ones((64, 2048), jnp.float32) / 64
    for _ in range(3):  # compiled, and the heap grown
        step(x, w).block_until_ready()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step(x, w).block_until_ready()
    print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _start_steps(switch: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in host_memory.GLIBC_VARIABLES}
    env.update({host_memory.SWITCH_VARIABLE: switch, "JAX_PLATFORMS": "cpu"})
    return subprocess.Popen(
        [sys.executable, "-c", STEPS],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish_steps(process: subprocess.Popen) -> tuple[bool, int]:
    out, err = process.communicate()
    assert process.returncode == 0, err[-2000:]
    kept, faults = out.split()[-2:]
    return kept == "True", int(faults)


@pytest.mark.slow  # two fresh processes at once: about 8 s
@pytest.mark.skipif(not host_memory.glibc(), reason="the setting is glibc's malloc's")
def test_a_step_after_the_first_faults_in_no_fresh_pages():
    # Both processes at once (a process's page faults are its own): half the wall time.
    with_setting, without = _start_steps("1"), _start_steps("0")
    kept, faults_kept = _finish_steps(with_setting)
    default, faults_default = _finish_steps(without)
    assert kept and not default
    # glibc's default maps the 64 MB afresh at every execution (16,384 pages of 4 KB each,
    # or 32 huge ones where the kernel backs them so). Kept, an execution reuses the memory
    # the one before it freed; now and then the heap grows once more where small blocks
    # took part of that memory (1,300 to 37,000 faults over the 20 in six runs of this
    # program, against about 330,000 by default).
    assert faults_default > 0
    assert faults_kept * 3 < faults_default, (faults_kept, faults_default)
