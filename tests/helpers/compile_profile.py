"""Where the suite's compiling goes: a pytest plugin that records every tracing, lowering and
XLA compile jax reports (jax.monitoring's duration events), with the test it ran in and the
innermost call site in this repository, and prints the totals when the run ends.

    pytest -p tests.helpers.compile_profile --compile-profile=DIR [pytest's other arguments]

Each test process (pytest-xdist's workers, or the one process under `-n0`) writes its records
to DIR/<worker>.jsonl; the controller then reads them all and prints the seconds by kind, the
share of programs run op by op (a jax.numpy or lax call outside jit compiles a program named
after jax's own function), and the programs and tests that took longest. The processes the
tests start (commands, notebook scripts) are not counted. docs/development.md says what it
found.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import json
import os
import pathlib
import traceback

from tests.helpers.xla_env import REPO

SOURCES = ("bertjax", "benchmarks", "tests")
# jax.monitoring's events, by the kind the summary names them.
KINDS = {
    "/jax/core/compile/jaxpr_trace_duration": "tracing",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "compiling",
}
OPTION = "--compile-profile"


@dataclasses.dataclass(frozen=True)
class Record:
    test: str  # the node id of the test that was running, "" outside any test
    kind: str  # a value of KINDS
    program: str  # the function's name as jax reports it: "train_step", "jit(train_step)"
    seconds: float
    site: str  # the innermost frame in this repository: "path:line:function"

    @property
    def function(self) -> str:
        """The traced function's name, "jit(...)" taken off."""
        name = self.program
        return name[4:-1] if name.startswith("jit(") and name.endswith(")") else name


def call_site() -> str:
    """The innermost frame of this repository's code on the stack (this module's excluded)."""
    here = pathlib.Path(__file__).name
    for frame in reversed(traceback.extract_stack()):
        path = pathlib.Path(frame.filename)
        if REPO in path.parents and "site-packages" not in path.parts and path.name != here:
            return f"{path.relative_to(REPO)}:{frame.lineno}:{frame.name}"
    return ""


class CompileProfile:
    """Records jax's compile events between `listen` and `stop` (or inside `with`), each with
    the test named by the last `start`."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self._test = ""

    def start(self, test: str) -> None:
        self._test = test

    def _record(self, event: str, seconds: float, **kwargs) -> None:
        kind = KINDS.get(event)
        if kind is not None:
            program = str(kwargs.get("fun_name", ""))
            self.records.append(Record(self._test, kind, program, seconds, call_site()))

    def listen(self) -> None:
        import jax  # here, not above: after conftest.py has set the environment jax reads

        jax.monitoring.register_event_duration_secs_listener(self._record)

    def stop(self) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._record)

    def __enter__(self) -> CompileProfile:
        self.listen()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def write(self, path: pathlib.Path) -> None:
        with path.open("w") as f:
            for record in self.records:
                f.write(json.dumps(dataclasses.asdict(record)) + "\n")


def read(directory: pathlib.Path) -> list[Record]:
    return [
        Record(**json.loads(line))
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def functions_defined_here() -> set[str]:
    """The names of every function this repository defines ("<lambda>" included): a program
    named otherwise is one of jax's own functions, run op by op."""
    names = {"<lambda>"}
    for top in SOURCES:
        for path in (REPO / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
    return names


def summary(records: list[Record], ours: set[str], top: int = 15) -> list[str]:
    """The report's lines: seconds by kind, the op-by-op share, the longest programs (by name
    and call site) and tests."""
    if not records:
        return ["no compile events recorded"]
    total = sum(r.seconds for r in records)
    by_kind = collections.Counter()
    for r in records:
        by_kind[r.kind] += r.seconds
    op_by_op = [r for r in records if r.function not in ours]
    op_seconds = sum(r.seconds for r in op_by_op)
    lines = [
        f"{total:.1f} s in jax's compile events: "
        + ", ".join(f"{kind} {by_kind[kind]:.1f} s" for kind in KINDS.values()),
        f"{sum(r.kind == 'compiling' for r in records)} programs compiled; "
        f"{sum(r.kind == 'compiling' for r in op_by_op)} of them op by op (jax's own "
        f"functions), {op_seconds:.1f} s ({100 * op_seconds / total:.0f} %) with their tracing "
        "and lowering",
        "longest programs (name at call site: seconds, programs compiled):",
    ]
    by_program, count = collections.Counter(), collections.Counter()
    for r in records:
        key = f"jit({r.function}) at {r.site}"
        by_program[key] += r.seconds
        count[key] += r.kind == "compiling"
    lines += [f"  {s:7.1f} s {count[k]:5d}  {k}" for k, s in by_program.most_common(top)]
    by_test = collections.Counter()
    for r in records:
        by_test[r.test or "(outside tests)"] += r.seconds
    lines.append("longest tests (seconds in compile events):")
    lines += [f"  {s:7.1f} s  {t}" for t, s in by_test.most_common(top)]
    return lines


# ----------------------------------------------------------------------------- the plugin

PROFILE = CompileProfile()


def pytest_addoption(parser):
    parser.addoption(
        OPTION,
        metavar="DIR",
        default="",
        help="record jax's tracing, lowering and compiling per test into DIR and summarise it "
        "(tests/helpers/compile_profile.py)",
    )


def _directory(config) -> pathlib.Path | None:
    value = config.getoption(OPTION)
    return pathlib.Path(value) if value else None


def _is_test_process(config) -> bool:
    """A worker, or the one process of a run without workers."""
    return hasattr(config, "workerinput") or config.getoption("numprocesses", None) in (None, 0)


def pytest_configure(config):
    directory = _directory(config)
    if directory is None:
        return
    if not hasattr(config, "workerinput"):  # the run's first process: an earlier run's records go
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.jsonl"):
            stale.unlink()
    if _is_test_process(config):
        PROFILE.listen()


def pytest_runtest_setup(item):
    PROFILE.start(item.nodeid)


def pytest_sessionfinish(session):
    """A test process writes its records here: a worker before it tells the controller it has
    finished, so they are all written when the controller summarises."""
    directory = _directory(session.config)
    if directory is not None and _is_test_process(session.config):
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
        PROFILE.write(directory / f"{worker}.jsonl")


def pytest_unconfigure(config):
    if _directory(config) is not None and _is_test_process(config):
        PROFILE.stop()


def pytest_terminal_summary(terminalreporter, config):
    directory = _directory(config)
    if directory is None or hasattr(config, "workerinput"):
        return
    terminalreporter.section("where jax's compiling went (tests/helpers/compile_profile.py)")
    for line in summary(read(directory), functions_defined_here()):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"records: {os.fspath(directory)}/*.jsonl")
