"""The package's import graph: no cycles, and ``ript/utils/`` a leaf.

Every import statement counts, function-level ones too: an import deferred into a function to dodge a cycle
still ties the two modules together. The graph is read from the source with ``ast``, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ript"
# what ript/utils/ may import from ript besides itself: the package root (its version) and the error type
UTILS_MAY_IMPORT = ("ript", "ript.errors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.AST, here: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    """The ript modules one import statement loads (``from pkg import submodule`` names the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolved against this module's package
        package = here.split(".") if is_package else here.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set()
        for node in ast.walk(tree):
            for target in imported(node, name, path.name == "__init__.py", known):
                while target and target not in known:  # `import ript.a.b.C`-style names: the module part
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (its modules in import order, the first repeated last) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [cycle_through(component, graph) for component in components]


def cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def test_the_graph_is_read():
    graph = import_graph()
    assert "ript.utils.seeding" in graph["ript.utils.checkpoint"]  # a top-level import
    assert "ript.models.openvla_oft.official" in graph["ript.models.openvla_oft"]  # a function-level one
    assert "ript.stages.rl" in graph["ript.stages.oft"]  # `from package import submodule`


def test_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_utils_is_a_leaf():
    outside = sorted(f"{name} imports {target}" for name, targets in import_graph().items()
                     if name.startswith("ript.utils") for target in targets
                     if not target.startswith("ript.utils") and target not in UTILS_MAY_IMPORT)
    assert not outside, "ript/utils/ imports the rest of ript: " + "; ".join(outside)


def test_the_chunk_policy_jobs_load_no_vla_library_and_a_declared_model_loads_when_asked_for():
    """The VLA models and families are declared, not imported: stages 0-1 and RL of the chunk policy start without
    transformers (seconds of every job's start), and asking for ``pi0`` imports its module then."""
    import subprocess
    import sys

    probe = ("import sys, ript.stages.stage0, ript.stages.stage1, ript.stages.rl, ript.model_loader\n"
             "from ript.policies.families import family_for\n"
             "print('transformers' in sys.modules, 'ript.models.pi0' in sys.modules)\n"
             "from ript.registry import MODELS\n"
             "MODELS.get('pi0')\n"
             "print('ript.models.pi0' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "True"]


def test_a_declared_name_its_module_does_not_register_is_refused():
    import pytest

    from ript.errors import RiptError
    from ript.registry import Registry

    things = Registry("thing")
    things.declare({"widget": "ript.errors"})
    assert things.names() == ["widget"]
    with pytest.raises(ValueError, match="thing 'widget': its module ript.errors registers no such name"):
        things.get("widget")
    with pytest.raises(RiptError, match="unknown thing 'gadget'; registered: widget"):
        things.get("gadget")
