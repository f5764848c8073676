"""benchmarks/cpu_step.py loaded as a module (the benchmarks are scripts, not a package)."""

import importlib.util
import pathlib
import sys

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_step.py"
_SPEC = importlib.util.spec_from_file_location("cpu_step_benchmark", _PATH)
cpu_step = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = cpu_step
_SPEC.loader.exec_module(cpu_step)
