"""Every third-party module the project imports comes from a dependency pyproject.toml declares.

A new environment has only what pyproject.toml names (and what that pulls in), so a module
imported but declared nowhere works on a machine that happens to have it and fails for a new
user. Which declarations count depends on where the import is:

- the library, the commands and the recipes: the core dependencies; an optional import (inside
  a function, or guarded by `except ImportError`) may come from any extra;
- the tests: the core and the extras the README's test command installs;
- the benchmarks: the core and the tests' extras; an optional import from any extra.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import pathlib
import re
import sys

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMANDS = ("train.py", "finetune.py", "evaluate.py")
# The extras the README's test command installs (`pip install -e '.[test,hf]'`).
TEST_EXTRAS = ("test", "hf")


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    name = re.split(r"[\s<>=!~\[;(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _declared() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """(the core's distributions, each extra's)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return (
        frozenset(map(_name, project["dependencies"])),
        {extra: frozenset(map(_name, names)) for extra, names in extras.items()},
    )


@functools.cache
def _first_party() -> frozenset[str]:
    """Top-level names of this project's own packages and scripts (the benchmarks import
    each other as benchmarks.<name>)."""
    project = pathlib.Path(__file__).resolve().parents[2]
    names = {"bertjax", "configs", "tests", "benchmarks"}
    names |= {path.stem for path in project.glob("*.py")}
    return frozenset(names)


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def providers(module: str) -> frozenset[str]:
    """The distributions that provide `module` (a dotted name), normalised. A namespace shared
    by several (google.*) is narrowed to those holding the module's own folder or file. A
    module nobody installed is taken to come from the distribution of its own name."""
    top = module.split(".")[0]
    candidates = _installed().get(top, [])
    if len(candidates) > 1 and "." in module:
        folder = module.replace(".", "/")
        holding = [
            dist
            for dist in candidates
            if any(
                str(file).startswith((f"{folder}/", f"{folder}.py"))
                for file in importlib.metadata.files(dist) or ()
            )
        ]
        candidates = holding or candidates
    return frozenset(map(_name, candidates or [top]))


def _guarded(tree: ast.Module) -> set[ast.AST]:
    """Import statements that are optional: inside a function, or in a `try` whose handlers
    catch ImportError."""
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            optional |= {n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            for statement in node.body:
                optional |= {
                    n for n in ast.walk(statement) if isinstance(n, (ast.Import, ast.ImportFrom))
                }
    return optional


def third_party_imports(path: pathlib.Path):
    """(module, line, optional) for each third-party import of a Python file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    optional = _guarded(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in _first_party():
                continue
            yield module, node.lineno, node in optional


def allowed(path: pathlib.Path, optional: bool) -> tuple[str, frozenset[str]]:
    """(what may provide an import of `path`, in words; those distributions)."""
    core, extras = _declared()
    every_extra = frozenset().union(*extras.values())
    top = path.relative_to(ROOT).parts[0]
    if top == "tests":
        groups = frozenset().union(core, *(extras[e] for e in TEST_EXTRAS))
        return f"the core or the extras {list(TEST_EXTRAS)}", groups
    if top == "benchmarks":
        groups = frozenset().union(core, *(extras[e] for e in TEST_EXTRAS))
        if optional:
            return "the core or an extra", core | every_extra
        return f"the core or the extras {list(TEST_EXTRAS)}", groups
    if optional:
        return "the core or an extra (an optional import)", core | every_extra
    return "the core dependencies", core


def _sources() -> list[pathlib.Path]:
    files = [ROOT / name for name in COMMANDS]
    for folder in ("bertjax", "configs", "tests", "benchmarks"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def undeclared(files) -> list[str]:
    """One line per import no allowed declaration provides."""
    lines = []
    for path in files:
        for module, line, optional in third_party_imports(path):
            what, groups = allowed(path, optional)
            owners = providers(module)
            if not owners & groups:
                lines.append(
                    f"{path.relative_to(ROOT)}:{line} imports {module} (from "
                    f"{', '.join(sorted(owners))}), which none of {what} in pyproject.toml "
                    "provides"
                )
    return lines


def test_every_third_party_import_is_declared():
    assert undeclared(_sources()) == []


def test_an_undeclared_import_is_named_with_its_file(tmp_path, monkeypatch):
    """A test file importing a module no declaration provides is reported, naming both."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text("import json\nimport numpy\n\nimport not_declared_anywhere\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert undeclared([tests / "test_x.py"]) == [
        "tests/test_x.py:4 imports not_declared_anywhere (from not-declared-anywhere), which "
        "none of the core or the extras ['test', 'hf'] in pyproject.toml provides"
    ]


def test_the_library_may_import_an_extra_only_optionally(tmp_path, monkeypatch):
    """pyarrow (an extra) imported at the library's module level is reported; inside a
    function, or guarded by `except ImportError`, it is not."""
    library = tmp_path / "bertjax"
    library.mkdir()
    (library / "a.py").write_text("import pyarrow\n")
    (library / "b.py").write_text("def f():\n    import pyarrow\n")
    (library / "c.py").write_text("try:\n    import pyarrow\nexcept ImportError:\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    lines = undeclared([library / name for name in ("a.py", "b.py", "c.py")])
    assert [line.split(" imports")[0] for line in lines] == ["bertjax/a.py:1"]


def test_a_namespace_package_is_narrowed_to_its_distribution():
    assert providers("google.auth.exceptions") == {"google-auth"}
