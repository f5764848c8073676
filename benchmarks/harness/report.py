"""The host a figure was measured on, and the JSON row every benchmark ends with.

A row holds the benchmark's name, its parameters (the command line's values), the host (CPU
model and the instruction sets that decide a CPU's speed here, cores, load, device kind and
count, versions, XLA_FLAGS) and the figures. It is printed as one line starting with
`result: ` and, with `--json PATH`, appended to PATH (JSON Lines: one row per run), so that
figures can be compared across runs and machines.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import shlex
import sys
from collections.abc import Mapping
from typing import Any

import flax
import jax
import numpy as np
import optax

ROW_PREFIX = "result: "
# The CPU features that decide the speed of a CPU step here: AVX512-BF16 (and AMX) give XLA a
# bfloat16 product at twice float32's rate (docs/benchmarks.md, "A host without AVX512-BF16").
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")
# Reference libraries named in a row when the benchmark has imported them.
REFERENCES = ("torch", "transformers", "sentence_transformers")


def use_cpu() -> None:
    """Runs jax on the CPU unless JAX_PLATFORMS says otherwise (the CPU benchmarks compare
    with torch on the same cores). Call before anything asks jax for a device."""
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")


def simulate_devices(count: int) -> None:
    """`count` simulated CPU devices (XLA_FLAGS). XLA reads its flags when jax first makes
    its CPU client, so this holds if nothing has asked jax for a device yet."""
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """--json PATH: append the run's row to a JSON Lines file."""
    parser.add_argument("--json", default="", help="append the result row to this JSON Lines file")


def _cpu() -> tuple[str, list[str]]:
    """(the CPU's model name, which of CPU_FLAGS it has); empty off Linux."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), []
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return fields.get("model name", platform.processor()), [f for f in CPU_FLAGS if f in flags]


def versions() -> dict[str, str]:
    """Python's and the libraries' versions (a reference library only once imported)."""
    out = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", jax.__version__),
        "flax": flax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
    }
    for name in REFERENCES:
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", "?")
    return out


def host() -> dict[str, Any]:
    """The machine as a row names it. Asks jax for its devices: call it after a benchmark
    has set what must precede them (XLA_FLAGS, the platform)."""
    model, flags = _cpu()
    device = jax.devices()[0]
    return {
        "cpu": model,
        "cpu_flags": flags,
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "backend": jax.default_backend(),
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "versions": versions(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def describe(machine: Mapping[str, Any]) -> str:
    """The host in one line, for the top of a benchmark's output."""
    load = machine["load_average"]
    return (
        f"host: {machine['cpu']} ({', '.join(machine['cpu_flags']) or 'no listed flags'}), "
        f"{machine['cores']} cores"
        + (f", load {load[0]:.2f}" if load else "")
        + f"; {machine['backend']}, {machine['device_count']} x {machine['device_kind']}; "
        + ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
        + (f"; XLA_FLAGS={machine['xla_flags']!r}" if machine["xla_flags"] else "")
    )


def start(name: str, argv: list[str] | None = None) -> dict[str, Any]:
    """Prints the command and the host; returns the host for the row."""
    args = sys.argv[1:] if argv is None else list(argv)
    print("command: python -m benchmarks." + name + "".join(" " + shlex.quote(a) for a in args))
    machine = host()
    print(describe(machine), flush=True)
    return machine


def _plain(value: Any) -> Any:
    """A value as JSON holds it: paths as text, tuples as lists, dataclasses as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def row(
    benchmark: str,
    params: Mapping[str, Any] | argparse.Namespace,
    figures: Mapping[str, Any],
    machine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The row of one run: {benchmark, time, params, host, figures}."""
    if isinstance(params, argparse.Namespace):
        params = vars(params)
    return {
        "benchmark": benchmark,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "params": _plain({k: v for k, v in params.items() if k != "json"}),
        "host": _plain(machine if machine is not None else host()),
        "figures": _plain(figures),
    }


def emit(result: Mapping[str, Any], path: str = "") -> None:
    """Prints the row as one line and appends it to `path` (JSON Lines) when given."""
    line = json.dumps(result, sort_keys=False)
    print(ROW_PREFIX + line, flush=True)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def finish(
    benchmark: str,
    args: argparse.Namespace,
    figures: Mapping[str, Any],
    machine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Builds, prints and (--json) appends the run's row; returns it."""
    result = row(benchmark, args, figures, machine)
    emit(result, getattr(args, "json", ""))
    return result


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a JSON Lines file that emit() appended to."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
