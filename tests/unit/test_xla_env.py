"""The suite's own compilation settings (tests/helpers/xla_env.py): one shared compilation cache
(kept under its size limit by bertjax.engine.compilation_cache.prune, tested with it), and compiled
programs released before a worker runs out of memory mappings, and XLA's collectives given the
time a loaded host needs before they abort the process."""

import os
import re

import jax

from tests.helpers.xla_env import (
    COLLECTIVE_FLAGS,
    COMPILATION_CACHE_DIR,
    OPTIMIZED_FLAGS,
    RESIDENT_GROWTH_BYTES,
    compiled_programs_crowd_memory,
    memory_in_a_line,
    memory_maps,
    memory_maps_near_limit,
    optimized_compiles,
    resident_bytes,
    subprocess_env,
)


def test_the_suite_and_the_processes_it_starts_share_one_cache():
    # conftest.py set the variables before jax was imported (a variable already set wins).
    directory = os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert jax.config.jax_compilation_cache_dir == directory
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert subprocess_env(2)["JAX_COMPILATION_CACHE_DIR"] == directory
    assert COMPILATION_CACHE_DIR.parent.name == ".pytest_cache"  # --cache-clear empties it


def test_quick_compiles_unless_a_block_asks_for_optimised_ones():
    assert jax.config.read("jax_disable_most_optimizations")  # LLVM at level 0
    with optimized_compiles():
        assert not jax.config.read("jax_disable_most_optimizations")
    assert jax.config.read("jax_disable_most_optimizations")
    # The level an optimised compile uses, here and in the processes the tests start.
    for flags in (os.environ["XLA_FLAGS"], subprocess_env(2)["XLA_FLAGS"]):
        assert all(flag in flags.split() for flag in OPTIMIZED_FLAGS)


def test_collectives_wait_four_minutes_before_aborting_here_and_in_the_processes_started():
    for flags in (os.environ["XLA_FLAGS"], subprocess_env(2)["XLA_FLAGS"]):
        assert all(flag in flags.split() for flag in COLLECTIVE_FLAGS)
    assert "--xla_cpu_collective_call_terminate_timeout_seconds=240" in COLLECTIVE_FLAGS


def _memory_maps() -> int:
    return memory_maps()[0]


def test_dropping_jax_caches_releases_the_mappings_of_compiled_programs():
    """What conftest.py's release_compiled_programs_when_memory_asks relies on: compiled
    programs hold memory mappings until jax's caches are dropped, though their functions are
    still referenced."""
    jax.clear_caches()
    jax.jit(jax.numpy.cos)(jax.numpy.ones(3))  # what the first compile maps and keeps
    before = _memory_maps()
    functions = [jax.jit(lambda x, n=n: jax.numpy.tanh(x * n).sum()) for n in range(40)]
    for function in functions:
        function(jax.numpy.ones(3))
    held = _memory_maps()
    assert held - before >= 80  # several mappings a program
    jax.clear_caches()
    released = held - _memory_maps()
    assert released > 0.75 * (held - before), (before, held, released)
    assert memory_maps_near_limit(share=0.0)
    assert not memory_maps_near_limit(share=1.0)
    assert resident_bytes() > 0
    line = memory_in_a_line()  # what a crashed worker's last note says
    assert re.fullmatch(
        r"[\d,]+ of the [\d,]+ memory mappings allowed, \d+\.\d\d GiB resident", line
    )
    # Memory counts from where the programs were last dropped.
    assert not compiled_programs_crowd_memory(resident_floor=resident_bytes())
    assert compiled_programs_crowd_memory(resident_bytes() - RESIDENT_GROWTH_BYTES - 2**20)
