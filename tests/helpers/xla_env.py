"""How the test suite's jax processes compile: this one (conftest.py) and the ones the tests
start (train.py, finetune.py, notebook scripts), so that all compile alike. The demo recipes'
learning tests keep XLA's defaults: they run `python train.py` as a user does.

Most tests run tiny models for a step or two, so XLA's time goes into compiling, not running:
they compile with LLVM's optimisation passes at level 0 (jax's
`jax_disable_most_optimizations`, which also turns LLVM's costly passes off) and with XLA's
classic fusion emitters instead of its newer MLIR ones, and each program's code generated as
one LLVM module instead of parts on threads of their own, all quicker to compile. XLA's
own HLO passes, which decide fusion, still run; only the last bits of a float may round
differently than by default.

A test that runs one train step hundreds of times compiles it optimised inside
`optimized_compiles()` (or conftest.py's `optimized` fixture): unlike XLA_FLAGS, which a
process reads once, jax reads that setting at each compile. Optimised means LLVM at level 1
here (OPTIMIZED_FLAGS), which runs a step about as fast as XLA's default level 2 and compiles
it in half the time. A run that also compiles many evaluation or generation programs stays at
level 0, where it is quicker as a whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
FUSION_FLAGS = ("--xla_cpu_use_fusion_emitters=false",)
# XLA splits a program's LLVM module into parts it compiles on threads of their own, then
# links them. For the suite's tiny programs that is more work than the parts save, on cores
# its two workers already fill, so each program is one module here (a command's programs
# compile no quicker as one, and with the classic emitters above much slower). Measured with
# empty caches: a tiny BERT's and ModernBERT's train and eval steps compiled with a fifth
# less CPU time; four unit files on one core each (`taskset -c N pytest -n0`, side by side
# with the default on the other core) took 120 s instead of 141-145 s; the unit tier on both
# cores, two rounds alternating, 784 CPU seconds against 830 (the host's noise is as large).
# It moves the last bits of some floats, as the other flags here do.
CODEGEN_FLAGS = ("--xla_cpu_parallel_codegen_split_count=1",)
# LLVM's level inside `optimized_compiles()` (the docstring above says why); quick compiles
# set level 0 over it.
OPTIMIZED_FLAGS = ("--xla_backend_optimization_level=1",)
# XLA's CPU runtime aborts the process ("Termination timeout ... exceeded. Exiting to ensure a
# consistent program state") when a device's thread reaches a collective 40 s after the first
# (its default): a guard against a deadlock that also fires when the devices' work is only
# slow or uneven. Here two workers and the processes they start each run 8 simulated devices
# on two cores: the suite gives a late device four minutes before the abort (a deadlock still
# ends the process) and a minute before the warning that it may be stuck.
COLLECTIVE_FLAGS = (
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=60",
    "--xla_cpu_collective_call_terminate_timeout_seconds=240",
)
# Read by jax when it is imported, in this process and in the ones it starts.
QUICK_COMPILES = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}

# jax's persistent compilation cache, kept between runs of the suite in pytest's cache
# directory (`pytest --cache-clear` empties it). Every test process and every process they
# start reads and writes it, so a program compiled once is loaded after that: by the other
# worker, by a resumed or second run of a command, and by the next run of the suite for
# every program that a change did not touch. jax keys an entry by the program, its compile
# options (QUICK_COMPILES or optimised compiles included), the devices and jax's version, so
# a stale entry is never loaded. Two processes may write one entry at once (jax does not
# write atomically); an entry read half-written fails to decompress, and jax then warns and
# compiles. A set variable wins (`JAX_COMPILATION_CACHE_DIR=` turns the cache off).
COMPILATION_CACHE_DIR = REPO / ".pytest_cache" / "xla-compilation-cache"
COMPILATION_CACHE = {
    "JAX_COMPILATION_CACHE_DIR": str(COMPILATION_CACHE_DIR),
    # Every program, however quick to compile: the tests' programs are small and many.
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
# conftest.py keeps the directory under this size with bertjax.engine.compilation_cache.prune,
# once before the workers start: jax's own limit (jax_compilation_cache_max_size) takes a file
# lock and lists the whole directory at every write, which slows every compile.
COMPILATION_CACHE_LIMIT_BYTES = 2 * 1024**3


def xla_flags(device_count: int) -> str:
    """XLA_FLAGS for `device_count` simulated CPU devices, compiled as the suite compiles."""
    return " ".join(
        (
            f"--xla_force_host_platform_device_count={device_count}",
            *FUSION_FLAGS,
            *CODEGEN_FLAGS,
            *OPTIMIZED_FLAGS,
            *COLLECTIVE_FLAGS,
        )
    )


def subprocess_env(device_count: int = 2) -> dict[str, str]:
    """The environment of a jax process a test starts: this one's (the GCS emulator's
    variables, the compilation cache and QUICK_COMPILES included), on
    `device_count` CPU devices, with the repository importable."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(device_count)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run_process(
    args: list[str], devices: int = 2, cwd=None, timeout: float | None = 300, check: bool = False
) -> subprocess.CompletedProcess:
    """The command `args` run in a fresh jax process on `devices` CPU devices (subprocess_env),
    what it printed captured as text; `check` fails on a non-zero exit."""
    return subprocess.run(
        args,
        env=subprocess_env(devices),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=check,
    )


def run_script(
    script: str, *args, devices: int = 1, cwd=None, timeout: float | None = 300, check=False
) -> subprocess.CompletedProcess:
    """`python -c script ARGS` as run_process runs a command (a notebook's code, as a user
    would run it in a fresh kernel)."""
    return run_process(
        [sys.executable, "-c", script, *map(str, args)], devices, cwd, timeout, check
    )


def script_json(script: str, *args, devices: int = 8, cwd=None, timeout: float = 300):
    """What `script` (run by run_script) printed as JSON on its last line; a script that fails
    fails the test with the end of its errors."""
    completed = run_script(script, *args, devices=devices, cwd=cwd, timeout=timeout)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def optimized_compiles():
    """Optimised compiles (OPTIMIZED_FLAGS) for what is compiled inside the block. Programs
    compiled before are kept as they are: jax caches them by function and shapes."""
    # Imported here, not above: conftest.py imports this module before it sets the
    # environment that jax reads when it is first imported.
    import jax

    quick = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", quick)


# XLA links each program it compiles (or loads from the cache) for the CPU into memory of its
# own, about 10 memory mappings, kept while jax caches the program: for a jitted function, as
# long as the process lives. At Linux's limit per process (vm.max_map_count, 65,530 by
# default) LLVM cannot map the next program ("LLVM compilation error: Cannot allocate memory",
# then a crash in whichever test compiles next). A worker keeps its programs from file to file
# (the next file's shared functions are then neither traced nor compiled again), and
# conftest.py drops them once it holds half the mappings Linux allows, or once its memory has
# grown by RESIDENT_GROWTH_BYTES since it last dropped them (measured from there: the allocator
# need not hand freed memory back); `jax.clear_caches()` releases both even while the jitted
# functions are referenced.
MAX_MAP_COUNT_FILE = pathlib.Path("/proc/sys/vm/max_map_count")
OWN_MAPS_FILE = pathlib.Path("/proc/self/maps")
OWN_MEMORY_FILE = pathlib.Path("/proc/self/statm")
RESIDENT_GROWTH_BYTES = 2 * 1024**3  # per worker; up to four run at once


def memory_maps() -> tuple[int, int] | None:
    """(the memory mappings this process holds, the most Linux allows one process), or None
    where /proc does not say (not Linux)."""
    try:
        limit = int(MAX_MAP_COUNT_FILE.read_text())
        with OWN_MAPS_FILE.open("rb") as maps:
            held = sum(1 for _ in maps)
    except (OSError, ValueError):
        return None
    return held, limit


def memory_maps_near_limit(share: float = 0.5, maps: tuple[int, int] | None = None) -> bool:
    """Whether this process holds more than `share` of the memory mappings Linux allows one
    process (False where /proc does not say); `maps`: memory_maps() if already read."""
    maps = maps or memory_maps()
    return maps is not None and maps[0] > share * maps[1]


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc does not say)."""
    try:
        pages = int(OWN_MEMORY_FILE.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def memory_in_a_line(maps: tuple[int, int] | None = None, resident: int | None = None) -> str:
    """This process's memory mappings and resident memory, for a crash report (from `maps`
    and `resident` where already read)."""
    maps = maps or memory_maps()
    resident = resident_bytes() if resident is None else resident
    held = f"{maps[0]:,} of the {maps[1]:,} memory mappings allowed" if maps else "mappings ?"
    return f"{held}, {resident / 2**30:.2f} GiB resident"


def compiled_programs_crowd_memory(
    resident_floor: int, maps: tuple[int, int] | None = None, resident: int | None = None
) -> bool:
    """Whether this process should drop its compiled programs: near Linux's limit of memory
    mappings, or RESIDENT_GROWTH_BYTES above `resident_floor` (its memory after it last
    dropped them). `maps` and `resident`: memory_maps() and resident_bytes() if already read."""
    resident = resident_bytes() if resident is None else resident
    return memory_maps_near_limit(maps=maps) or resident > resident_floor + RESIDENT_GROWTH_BYTES


def free_port() -> int:
    """A TCP port nothing listens on now (for a coordinator the test starts next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_distributed(args: list[str], cwd=None, processes: int = 2) -> list[str]:
    """Runs the command `args` (train.py's flags) as one jax job of `processes` processes on
    this machine, 2 CPU devices each, and returns what each printed; a process that fails
    fails the test with the end of its output."""
    coordinator = [f"--coordinator_address=127.0.0.1:{free_port()}"]
    started = [
        subprocess.Popen(
            args + coordinator + [f"--num_processes={processes}", f"--process_id={i}"],
            env=subprocess_env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
        )
        for i in range(processes)
    ]
    outputs = []
    try:
        for process in started:
            outputs.append(process.communicate(timeout=300)[0])
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
    for process, output in zip(started, outputs):
        assert process.returncode == 0, output[-3000:]
    return outputs
