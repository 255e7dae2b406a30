"""The package's import graph: no cycles between modules, no private names across modules.

Read with the standard library's ``ast`` from the source of every module of ``qnnx`` (nothing is
imported), with every import statement counted wherever it stands: at the top, inside a function,
under ``if TYPE_CHECKING:``. A function-local import is still a dependency; it only hides a cycle.

The rules, as the test counts them:

- **Nodes** are modules (``qnnx/a/b.py`` is ``qnnx.a.b``; a package's ``__init__.py`` is the
  package name).
- **Edges.** ``import qnnx.a.b`` and ``from qnnx.a import b`` (``b`` a submodule) are edges to the
  module ``qnnx.a.b``. ``from qnnx.a import name`` with ``name`` defined in a package's
  ``__init__`` is an edge to that ``__init__``; with ``name`` only *re-exported* there (the
  ``__init__`` binds it by importing it), the edge goes to the module it comes from, followed
  through any chain of re-exports. So an ``__init__`` that only re-exports never closes a cycle:
  ``qnnx.frontends.fq2i_rules`` importing ``DOMAIN`` from ``qnnx.dialect`` depends on
  ``qnnx.dialect.schema``, not on every op module the dialect's ``__init__`` registers. The parent
  packages Python runs before a submodule are not edges (they are not a choice the importer makes).
  Imports of modules outside ``qnnx`` are ignored.
- **Cycles**: any strongly connected component of more than one module is reported with one cycle
  through it.
- **Parts**: the same graph with each subpackage (and each top-level module) as one node must have
  no cycle either: ``analysis`` importing ``autoquant`` which imports ``analysis`` is one, though no
  two modules import each other.
- **Private names**: ``from qnnx.x import _name`` in another module, and ``m._name`` where ``m`` is a
  module of ``qnnx`` bound by an import (dunders such as ``__version__`` are not private).

Nothing is allowed to offend. ``FLOOR``: the modules that import (almost) nothing of qnnx.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "qnnx"
PACKAGE = "qnnx"

# The lowest floor: modules that import nothing from qnnx but these.
FLOOR = {"qnnx.errors": set(), "qnnx.ops": set(), "qnnx.dtypes": {"qnnx.errors"}}


# --------------------------------------------------------------------------- reading the package


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def _absolute(mod: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``mod``."""
    if not node.level:
        return node.module or ""
    base = mod.split(".")
    if not _is_package(mod):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _reexports(pkg: str) -> dict[str, tuple[str, str]]:
    """Names a package ``__init__`` binds by importing them: name -> (source module, source name)."""
    out = {}
    for node in TREES[pkg].body:
        if isinstance(node, ast.ImportFrom):
            src = _absolute(pkg, node)
            for a in node.names:
                out[a.asname or a.name] = (src, a.name)
    return out


def _defining_module(mod: str, name: str, depth: int = 0) -> str:
    """The module ``from mod import name`` depends on: the submodule ``mod.name``, or ``mod`` itself,
    or, when ``mod`` is a package re-exporting ``name``, the module it comes from."""
    if f"{mod}.{name}" in MODULES:
        return f"{mod}.{name}"
    if depth < 8 and _is_package(mod):
        src = _reexports(mod).get(name)
        if src is not None and src[0] in MODULES:
            return _defining_module(src[0], src[1], depth + 1)
    return mod


def _in_package(mod: str) -> bool:
    return mod == PACKAGE or mod.startswith(PACKAGE + ".")


def imports(mod: str) -> list[tuple[str, str | None, int]]:
    """``(target module, imported name or None, line)`` for every import of a ``qnnx`` module in
    ``mod``, at any depth of its syntax tree."""
    out = []
    for node in ast.walk(TREES[mod]):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _in_package(a.name) and a.name in MODULES:
                    out.append((a.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(mod, node)
            if not _in_package(src) or src not in MODULES:
                continue
            for a in node.names:
                out.append((_defining_module(src, a.name), a.name, node.lineno))
    return out


def import_graph() -> dict[str, set[str]]:
    return {mod: {t for t, _, _ in imports(mod) if t != mod} for mod in MODULES}


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def _one_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first), for the message."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def cycles() -> list[tuple[frozenset[str], list[str]]]:
    graph = import_graph()
    return [(frozenset(c), _one_cycle(graph, c)) for c in _strongly_connected(graph)]


def part(mod: str) -> str:
    """The part of the package a module belongs to: its subpackage (``qnnx.autoquant``) or, for a
    top-level module, itself (``qnnx.cli``)."""
    return ".".join(mod.split(".")[:2])


def part_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, targets in import_graph().items():
        graph.setdefault(part(mod), set()).update(part(t) for t in targets if part(t) != part(mod))
    return graph


def private_imports() -> set[tuple[str, str]]:
    """``(module, "source._name")`` for each private name ``module`` takes from another module."""
    out = set()
    for mod, tree in TREES.items():
        bound: dict[str, str] = {}  # local name -> qnnx module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if _in_package(a.name) and a.name in MODULES and a.asname:
                        bound[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                src = _absolute(mod, node)
                if not _in_package(src) or src not in MODULES:
                    continue
                for a in node.names:
                    target = _defining_module(src, a.name)
                    if f"{src}.{a.name}" in MODULES:
                        bound[a.asname or a.name] = f"{src}.{a.name}"
                    elif _private(a.name) and target != mod:
                        out.add((mod, f"{src}.{a.name}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in bound and _private(node.attr) and bound[node.value.id] != mod:
                out.add((mod, f"{bound[node.value.id]}.{node.attr}"))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# --------------------------------------------------------------------------- the tests


def test_the_graph_sees_function_local_and_reexported_imports():
    graph = import_graph()
    # a function-local import counts (cli imports its commands' modules inside the commands)
    assert "qnnx.passes.lower" in graph["qnnx.cli"]
    # an __init__ re-export resolves to the defining module
    assert "qnnx.dialect.schema" in graph["qnnx.frontends.fq2i_rules"]
    assert "qnnx.dialect" not in graph["qnnx.frontends.fq2i_rules"]


def test_no_import_cycles():
    found = [path for _, path in cycles()]
    assert not found, "import cycles:\n  " + "\n  ".join(" -> ".join(path) for path in found)


def test_no_private_names_across_modules():
    offences = sorted(private_imports())
    assert not offences, "private names taken across modules: " + ", ".join(f"{m} <- {n}" for m, n in offences)


def test_no_cycles_between_parts_of_the_package():
    graph = part_graph()
    found = [_one_cycle(graph, c) for c in _strongly_connected(graph)]
    assert not found, "cycles between parts of qnnx:\n  " + "\n  ".join(" -> ".join(path) for path in found)


def test_the_lowest_floor_imports_nothing_above_it():
    graph = import_graph()
    for mod, allowed in FLOOR.items():
        assert graph[mod] <= allowed, f"{mod} imports {sorted(graph[mod] - allowed)}"
