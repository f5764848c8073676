"""bertjax's modules import each other without cycles, and only at module level."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "bertjax"


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imported(module: str, path: pathlib.Path, node, modules) -> list[str]:
    """The bertjax modules an import statement names: `from package import submodule` counts
    as the submodule (the package's __init__ only re-exports)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    names = [f"{source}.{alias.name}" for alias in node.names]
    return [name if name in modules else source for name in names if source in modules]


def _graph():
    """{module: modules it imports at module level}, and (module, import) pairs made inside a
    function or class."""
    modules = _modules()
    graph, nested = {name: set() for name in modules}, []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = set()
        for statement in tree.body:  # module level, including under if/try (TYPE_CHECKING)
            for node in ast.walk(statement):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    break
                top_level.add(node)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(module, path, node, modules):
                if target == module:
                    continue
                if node in top_level:
                    graph[module].add(target)
                else:
                    nested.append((module, target))
    return graph, nested


def _cycle(graph) -> list[str] | None:
    """One import cycle, or None (depth-first search)."""
    state = {}  # module -> "open" while on the path, "done" after

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target, [*path, target])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def test_no_module_imports_another_inside_a_function():
    _, nested = _graph()
    assert nested == []


def test_the_modules_import_each_other_without_a_cycle():
    graph, _ = _graph()
    assert "bertjax.encoders.family" in graph["bertjax.encoders.bert.family"]  # graph is read
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
