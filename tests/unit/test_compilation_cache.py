"""bertjax.engine.compilation_cache: where compiled programs are kept, who decides, and the bound.

That a second process loads what the first compiled, through the commands' and Model.load's
default, is tests/integration/test_compilation_cache.py's.
"""

import contextlib
import os

import jax
import pytest

from bertjax.engine import compilation_cache
from bertjax.engine.compilation_cache import CacheSettings, CompilationCacheError


def test_the_default_is_the_users_cache_directory_bounded_at_two_gigabytes():
    settings = CacheSettings.from_environment({"XDG_CACHE_HOME": "/x/cache"})
    assert settings == CacheSettings("/x/cache/bertjax/xla", 2 * 1024**3)
    home = os.path.expanduser("~")
    assert CacheSettings.from_environment({}).directory == f"{home}/.cache/bertjax/xla"


@pytest.mark.parametrize("word", ["off", "OFF", "0", "false", "none", ""])
def test_the_variable_moves_or_turns_off_the_cache_and_the_flag_wins(word):
    moved = {"BERTJAX_COMPILATION_CACHE": "gs://bucket/xla"}
    assert CacheSettings.from_environment(moved).directory == "gs://bucket/xla"
    assert CacheSettings.from_environment({"BERTJAX_COMPILATION_CACHE": word}).directory is None
    assert CacheSettings.from_environment(moved, directory=word).directory is None
    assert CacheSettings.from_environment({}, directory="/elsewhere").directory == "/elsewhere"
    bounded = {"BERTJAX_COMPILATION_CACHE_MAX_GB": "0.5"}
    assert CacheSettings.from_environment(bounded).max_bytes == 512 * 1024**2


@pytest.mark.parametrize("raw", ["two", "0", "-1", "nan", "inf"])
def test_a_bad_bound_is_named_in_one_line(raw):
    with pytest.raises(CompilationCacheError, match=f"BERTJAX_COMPILATION_CACHE_MAX_GB='{raw}'"):
        CacheSettings.from_environment({"BERTJAX_COMPILATION_CACHE_MAX_GB": raw})


def test_a_user_who_configured_jax_keeps_their_settings():
    # The suite's conftest.py set JAX_COMPILATION_CACHE_DIR (and a minimum compile time of 0)
    # before jax was imported, as a user may: bertjax changes nothing of it. (Set empty, as
    # `JAX_COMPILATION_CACHE_DIR= pytest` does, it keeps jax's cache off: enable says None.)
    assert compilation_cache.configured_by_user()
    before = jax.config.jax_compilation_cache_dir
    assert compilation_cache.enable(CacheSettings("/nowhere", 1)) == (before or None)
    assert jax.config.jax_compilation_cache_dir == before
    assert compilation_cache.configured_by_user({})  # set through jax.config counts too


@contextlib.contextmanager
def unconfigured_jax(monkeypatch):
    """This process as a user's whose jax cache nobody configured; restored after."""
    directory = jax.config.jax_compilation_cache_dir
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    # The suite's cache was opened by earlier compiles (or opens at the first after this
    # block): the setting changed here is never read by jax meanwhile, nothing compiles.
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)


def test_enabling_points_jax_at_the_directory_and_keeps_every_program(monkeypatch, tmp_path):
    with unconfigured_jax(monkeypatch):
        assert not compilation_cache.configured_by_user()
        assert compilation_cache.enable(CacheSettings(None, 1)) is None  # off
        assert jax.config.jax_compilation_cache_dir is None
        directory = tmp_path / "made" / "xla"
        assert compilation_cache.enable(CacheSettings(str(directory), 1024)) == str(directory)
        assert directory.is_dir()
        assert jax.config.jax_compilation_cache_dir == str(directory)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
        # Once set, it is the process's setting: a second call changes nothing.
        assert compilation_cache.enable(CacheSettings(str(tmp_path), 1)) == str(directory)


def test_a_bucket_is_handed_to_jax_as_it_is(monkeypatch):
    # Every host of a pod slice reads one cache; jax reads and writes it through epath, and
    # nothing is listed or pruned here (a bucket's lifecycle rule bounds it).
    with unconfigured_jax(monkeypatch):
        assert compilation_cache.enable(CacheSettings("gs://bucket/xla", 1)) == "gs://bucket/xla"
        assert jax.config.jax_compilation_cache_dir == "gs://bucket/xla"


def test_a_directory_that_cannot_be_made_is_named(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with unconfigured_jax(monkeypatch):
        with pytest.raises(CompilationCacheError, match=f"directory {blocker}/xla"):
            compilation_cache.enable(CacheSettings(str(blocker / "xla"), 1))
        assert jax.config.jax_compilation_cache_dir is None


def write_entry(directory, name, size, used_at):
    entry = directory / name
    entry.write_bytes(b"x" * size)
    os.utime(entry, (used_at, used_at))
    return entry


def test_pruning_keeps_a_cache_under_its_limit_alone(tmp_path):
    for i in range(4):
        write_entry(tmp_path, f"jit_step-{i}-cache", 100, used_at=1_000 + i)
    assert compilation_cache.prune(tmp_path, limit_bytes=400) == 0
    assert len(list(tmp_path.iterdir())) == 4
    assert compilation_cache.prune(tmp_path / "missing", limit_bytes=400) == 0


def test_pruning_a_full_cache_deletes_the_least_recently_used_down_to_half(tmp_path):
    # Written in this order, except that entry 0 was read last.
    entries = [write_entry(tmp_path, f"jit_step-{i}-cache", 100, 1_000 + i) for i in range(7)]
    os.utime(entries[0], (2_000, 1_000))  # atime: read after every other was written
    # Not jax's: neither counted nor deleted, however old.
    write_entry(tmp_path, "notes.txt", 10_000, used_at=1)
    assert compilation_cache.prune(tmp_path, limit_bytes=600) == 4  # 700 bytes -> 300
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["jit_step-0-cache", "jit_step-5-cache", "jit_step-6-cache", "notes.txt"]


def test_enabling_prunes_a_full_cache_first(monkeypatch, tmp_path):
    for i in range(4):
        write_entry(tmp_path, f"jit_step-{i}-cache", 100, used_at=1_000 + i)
    with unconfigured_jax(monkeypatch):
        compilation_cache.enable(CacheSettings(str(tmp_path), 300))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jit_step-3-cache"]
