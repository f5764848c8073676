"""bertjax's modules import each other without cycles, only at module level, and only
downwards: each folder of bertjax/ is a floor, and a module imports its own floor's modules
and lower floors' only."""

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


# bertjax's floors, bottom to top: a top-level folder or module per name. Names on one floor
# are peers that do not import each other (pretraining and fine-tuning).
FLOORS = (
    ("storage",),  # files local and gs://, transformers directories' weights and configs
    ("text",),  # tokenizers and features
    ("data",),  # pretraining corpora, instances, masking, the loader
    ("nn",),  # the families' building blocks
    ("capability",),  # the contract each capability implements and the hubs ask
    ("encoders",),  # the families
    ("engine",),  # settings, steps, loop, checkpoints, the run directory
    ("inference",),  # Model and its batching
    ("finetune", "pretrain"),  # the two kinds of run
    ("tasks",),  # the capabilities
    ("glue",),  # the GLUE suite over fine-tuning runs
    ("cli", "__init__"),  # the commands' edge, the public API
)


def floor(module: str) -> tuple[int, str]:
    """(floor index, top-level name) of a bertjax module."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, names in enumerate(FLOORS):
        if top in names:
            return index, top
    raise AssertionError(f"{module}: bertjax/{top} is on no floor; add it to FLOORS")


def _upward(graph) -> list[str]:
    """Imports from a module to a higher floor's, or to a peer's on its own floor."""
    wrong = []
    for module, targets in graph.items():
        (level, top) = floor(module)
        for target in sorted(targets):
            (target_level, target_top) = floor(target)
            if target_top != top and target_level >= level:
                wrong.append(f"{module} -> {target}")
    return wrong


def test_every_import_goes_down_a_floor():
    graph, _ = _graph()
    assert _upward(graph) == []


def test_the_floor_check_finds_an_upward_import():
    assert _upward({"bertjax.storage.fs": {"bertjax.engine.steps"}}) == [
        "bertjax.storage.fs -> bertjax.engine.steps"
    ]
    assert _upward({"bertjax.pretrain.loop": {"bertjax.finetune.loop"}}) == [
        "bertjax.pretrain.loop -> bertjax.finetune.loop"
    ]
    assert _upward({"bertjax.tasks.qa": {"bertjax.encoders.family", "bertjax.tasks"}}) == []


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


def test_the_pretraining_objectives_import_no_familys_module():
    """An objective builds its networks from what every family offers (the registry,
    bertjax.encoders, and its interface, encoders.family), never from one family's modules."""
    graph, _ = _graph()
    family_modules = [
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("bertjax.pretrain.objectives")
        for target in targets
        if target.startswith("bertjax.encoders.") and target not in ("bertjax.encoders.family",)
    ]
    assert graph["bertjax.pretrain.objectives.rtd.model"]  # the graph is read
    assert family_modules == []
