"""A script of benchmarks/ loaded as a module, for the tests of its parts (the benchmarks are
scripts, not a package)."""

import importlib.util
import pathlib
import sys
import types

_BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str) -> types.ModuleType:
    """benchmarks/<name>.py as the module `<name>_benchmark`."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", _BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module
