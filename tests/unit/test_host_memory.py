"""bertjax.host_memory: a CPU step writes into pages the step before it already mapped.

Each case runs in a fresh process: jax reads where a program runs when it creates its CPU
client, so only a process that asks before that shows the effect.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from bertjax import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Twenty executions of a program with a 64 MB buffer between its two products; prints
# whether keep_freed_memory took effect and the minor page faults of those executions.
STEPS = textwrap.dedent(
    """
    import resource
    from bertjax import host_memory
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


def _steps(switch: str) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k not in host_memory.GLIBC_VARIABLES}
    env.update({host_memory.SWITCH_VARIABLE: switch, "JAX_PLATFORMS": "cpu"})
    done = subprocess.run(
        [sys.executable, "-c", STEPS], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kept, faults = done.stdout.split()[-2:]
    return kept == "True", int(faults)


@pytest.mark.skipif(not host_memory.glibc(), reason="the setting is glibc's malloc's")
def test_a_step_after_the_first_faults_in_no_fresh_pages():
    kept, faults_kept = _steps("1")
    default, faults_default = _steps("0")
    assert kept and not default
    # glibc's default maps the 64 MB afresh at every execution (16,384 pages of 4 KB each,
    # or 32 huge ones where the kernel backs them so). Kept, an execution reuses the memory
    # the one before it freed; now and then the heap grows once more where small blocks
    # took part of that memory (1,300 to 37,000 faults over the 20 in six runs of this
    # program, against about 330,000 by default).
    assert faults_default > 0
    assert faults_kept * 3 < faults_default, (faults_kept, faults_default)


@pytest.mark.parametrize(
    "environ",
    [
        {"BERTJAX_KEEP_FREED_MEMORY": "0"},
        {"MALLOC_ARENA_MAX": "4"},
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
        {"JAX_PLATFORMS": "tpu"},
        {"JAX_PLATFORMS": "cpu,cuda"},
    ],
)
def test_it_leaves_malloc_alone_when_told_tuned_or_on_an_accelerator(environ):
    assert host_memory.keep_freed_memory(environ) is False


@pytest.mark.parametrize(
    "platforms, expected", [("cpu", False), (" cpu ", False), ("cuda", True), ("cpu,tpu", True)]
)
def test_the_platforms_variable_decides_where_jax_runs(platforms, expected):
    assert host_memory.accelerator_installed({"JAX_PLATFORMS": platforms}) is expected
