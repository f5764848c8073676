"""benchmarks/accelerator.py loaded as a module, and the rows of the tables it prints."""

import importlib.util
import pathlib
import sys

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "accelerator.py"


_SPEC = importlib.util.spec_from_file_location("accelerator_benchmark", _PATH)


accelerator = importlib.util.module_from_spec(_SPEC)


sys.modules[_SPEC.name] = accelerator  # dataclasses look their module up while being built


_SPEC.loader.exec_module(accelerator)


def table_lines(out: str, columns: tuple[str, ...]) -> list[list[str]]:
    """The rows (split on 2+ spaces) of the printed table whose header is `columns`."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == " ".join(columns).split())
    rows = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        rows.append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return rows
