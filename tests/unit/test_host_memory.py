"""bertjax.engine.host_memory: where it leaves malloc alone, and how it reads where jax runs. That a
step then writes into pages the step before it mapped needs fresh processes:
tests/integration/test_host_memory_runs.py."""

import pytest

from bertjax.engine import host_memory


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
