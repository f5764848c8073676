"""The suite's own compilation settings (tests/xla_env.py): one shared compilation cache,
kept under its size limit."""

import os

import jax
from xla_env import (
    COMPILATION_CACHE_DIR,
    OPTIMIZED_FLAGS,
    optimized_compiles,
    prune_compilation_cache,
    subprocess_env,
)


def test_the_suite_and_the_processes_it_starts_share_one_cache():
    # conftest.py set the variables before jax was imported (a variable already set wins).
    directory = os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert jax.config.jax_compilation_cache_dir == directory
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert subprocess_env(2)["JAX_COMPILATION_CACHE_DIR"] == directory
    assert COMPILATION_CACHE_DIR.parent.name == ".pytest_cache"  # --cache-clear empties it


def write_entry(directory, name, size, used_at):
    entry = directory / name
    entry.write_bytes(b"x" * size)
    os.utime(entry, (used_at, used_at))
    return entry


def test_pruning_keeps_a_cache_under_its_limit_alone(tmp_path):
    for i in range(4):
        write_entry(tmp_path, f"entry-{i}", 100, used_at=1_000 + i)
    assert prune_compilation_cache(tmp_path, limit_bytes=400) == 0
    assert len(list(tmp_path.iterdir())) == 4
    assert prune_compilation_cache(tmp_path / "missing", limit_bytes=400) == 0


def test_pruning_a_full_cache_deletes_the_least_recently_used_down_to_half(tmp_path):
    # Written in this order, except that entry-0 was read last.
    entries = [write_entry(tmp_path, f"entry-{i}", 100, used_at=1_000 + i) for i in range(7)]
    os.utime(entries[0], (2_000, 1_000))  # atime: read after every other was written
    assert prune_compilation_cache(tmp_path, limit_bytes=600) == 4  # 700 bytes -> 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry-0", "entry-5", "entry-6"]


def test_quick_compiles_unless_a_block_asks_for_optimised_ones():
    assert jax.config.read("jax_disable_most_optimizations")  # LLVM at level 0
    with optimized_compiles():
        assert not jax.config.read("jax_disable_most_optimizations")
    assert jax.config.read("jax_disable_most_optimizations")
    # The level an optimised compile uses, here and in the processes the tests start.
    for flags in (os.environ["XLA_FLAGS"], subprocess_env(2)["XLA_FLAGS"]):
        assert all(flag in flags.split() for flag in OPTIMIZED_FLAGS)
