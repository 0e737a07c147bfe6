"""The import graph of `orchestrator/`: no cycles between modules, no private names imported.

Every module is parsed (`ast`, nothing is imported), generated code (`orchestrator/cri/gen`)
excepted. Every import statement counts, wherever it is: at the top, under `if TYPE_CHECKING:`,
inside a function (a lazy import is still a dependency, just a later one). A package's
`__init__` is a module like any other (`from orchestrator.controllers.runtime import Client`
depends on `orchestrator/controllers/runtime/__init__.py`); the parent packages Python runs
implicitly before a submodule are not edges, so an `__init__` may import its own submodules.

* Cycles: a strongly connected component of two or more modules fails the test, printed with
  its members and one concrete cycle through them, each step with the file and line of the
  import. Break it with a leaf module both sides import, by passing what one side needs
  explicitly (a callable, a small `typing.Protocol`), or by an assembly module above both.
* Private names: `from module import _name` from another module fails (dunders such as
  `__version__` aside; a private *submodule*, `from package import _impl`, is the package's own
  business and allowed). Make the name public, or move it to the module that uses it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "orchestrator"
GENERATED = ("orchestrator.cri.gen",)  # `python -m orchestrator.cri.regen`; not checked


@dataclass(frozen=True)
class Import:
    """One import statement of `module` (at `path:line`) that reaches `target`."""

    module: str
    target: str
    path: str
    line: int
    statement: str

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.statement}"


@dataclass
class ImportGraph:
    modules: dict[str, Path] = field(default_factory=dict)
    # module -> imported module -> the statements that import it (first one first)
    edges: dict[str, dict[str, list[Import]]] = field(default_factory=dict)
    private: list[Import] = field(default_factory=list)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_generated(name: str) -> bool:
    return any(name == g or name.startswith(g + ".") for g in GENERATED)


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` statement imports from."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def build_graph(root: Path, package: str = PACKAGE) -> ImportGraph:
    """Parse every module of `root/package` (generated code excepted) into an import graph."""
    graph = ImportGraph()
    for path in sorted((root / package).rglob("*.py")):
        name = _module_name(path, root)
        if not _is_generated(name):
            graph.modules[name] = path
    for name, path in graph.modules.items():
        graph.edges[name] = {}
        _add_imports(graph, name, path, root, package)
    return graph


def _add_imports(graph: ImportGraph, module: str, path: Path, root: Path, package: str) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = str(path.relative_to(root))
    is_package = path.name == "__init__.py"

    def record(target: str, node: ast.Import | ast.ImportFrom) -> None:
        if target == module:
            return
        edge = Import(module, target, rel, node.lineno, _statement(node))
        graph.edges[module].setdefault(target, []).append(edge)

    def known(name: str) -> str | None:
        """The module `name` is, or the innermost known package containing it."""
        while name and name not in graph.modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(tree):  # every statement: top level, TYPE_CHECKING, functions
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _inside(alias.name, package) and not _is_generated(alias.name):
                    target = known(alias.name)
                    if target is not None:
                        record(target, node)
        elif isinstance(node, ast.ImportFrom):
            source_module = _resolve_from(module, is_package, node)
            if not _inside(source_module, package) or _is_generated(source_module):
                continue
            for alias in node.names:
                submodule = f"{source_module}.{alias.name}"
                if submodule in graph.modules:  # `from package import submodule`
                    record(submodule, node)
                    continue
                target = known(source_module)
                if target is not None:
                    record(target, node)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    graph.private.append(
                        Import(
                            module,
                            source_module,
                            rel,
                            node.lineno,
                            f"from {source_module} import {alias.name}",
                        )
                    )


def _statement(node: ast.Import | ast.ImportFrom) -> str:
    """The statement on one line, as written (relative dots kept), without `as` aliases."""
    names = ", ".join(alias.name for alias in node.names)
    if isinstance(node, ast.Import):
        return f"import {names}"
    return f"from {'.' * node.level}{node.module or ''} import {names}"


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def strongly_connected(edges: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """Tarjan's strongly connected components with two or more members (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop(0)
                if nxt not in edges:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def shortest_cycle(edges: dict[str, dict[str, list[Import]]], members: list[str]) -> list[Import]:
    """One shortest cycle through the first member, inside the component: its imports in order."""
    inside = set(members)
    start = members[0]
    came_from: dict[str, Import] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        following: list[str] = []
        for node in frontier:
            for target in sorted(edges[node]):
                if target not in inside:
                    continue
                if target == start:
                    path = [edges[node][target][0]]
                    while node != start:
                        step = came_from[node]
                        path.append(step)
                        node = step.module
                    return path[::-1]
                if target not in seen:
                    seen.add(target)
                    came_from[target] = edges[node][target][0]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {members}")  # a component has one


def describe_cycles(graph: ImportGraph) -> list[str]:
    out = []
    for members in strongly_connected(graph.edges):
        steps = shortest_cycle(graph.edges, members)
        lines = [f"cycle of {len(members)} modules: {', '.join(members)}", "  for example:"]
        lines += [f"    {s.module} -> {s.target}   ({s.where()})" for s in steps]
        out.append("\n".join(lines))
    return out


def describe_private(graph: ImportGraph) -> list[str]:
    return [i.where() for i in graph.private]


# --- the checks on orchestrator/ -----------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return build_graph(ROOT)


def test_the_graph_covers_the_package(graph: ImportGraph) -> None:
    assert "orchestrator.server" in graph.modules
    assert "orchestrator.controllers.runtime" in graph.modules  # a package's __init__
    assert not any(_is_generated(m) for m in graph.modules)
    assert "orchestrator.raft.node" in graph.edges["orchestrator.server"]


def test_no_import_cycles(graph: ImportGraph) -> None:
    cycles = describe_cycles(graph)
    if cycles:
        pytest.fail(
            f"{len(cycles)} import cycle(s) in orchestrator/ (imports under TYPE_CHECKING and "
            "inside functions count; see this module's doc for the ways out):\n\n"
            + "\n\n".join(cycles),
            pytrace=False,
        )


def test_no_private_names_imported_from_other_modules(graph: ImportGraph) -> None:
    private = describe_private(graph)
    if private:
        pytest.fail(
            f"{len(private)} private name(s) imported from another module: make each public "
            "(and document it) or move it into the module that uses it:\n  " + "\n  ".join(private),
            pytrace=False,
        )


# --- the checker itself, on a small package ------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> ImportGraph:
    for name, text in files.items():
        path = tmp_path / "orchestrator" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return build_graph(tmp_path)


def test_checker_finds_cycles_through_type_checking_and_function_imports(
    tmp_path: Path,
) -> None:
    graph = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from orchestrator.b import B\n",
            "b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from orchestrator.c import C\n"
            ),
            "c.py": "def f():\n    import orchestrator.a\n",
            "d.py": "from orchestrator import a\n",  # into the cycle, not part of it
        },
    )
    assert strongly_connected(graph.edges) == [
        ["orchestrator.a", "orchestrator.b", "orchestrator.c"]
    ]
    (text,) = describe_cycles(graph)
    assert "orchestrator.b -> orchestrator.c   (orchestrator/b.py:3:" in text
    assert "(orchestrator/c.py:2: import orchestrator.a)" in text


def test_checker_counts_a_package_init_as_a_module(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        {
            "__init__.py": "",
            "pkg/__init__.py": "from orchestrator.pkg.impl import Thing\n",  # re-export: fine
            "pkg/impl.py": "from orchestrator.other import helper\n",
            "other.py": "from orchestrator.pkg import Thing\n",  # back through the face
        },
    )
    assert strongly_connected(graph.edges) == [
        ["orchestrator.other", "orchestrator.pkg", "orchestrator.pkg.impl"]
    ]


def test_checker_flags_private_names_not_private_submodules(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "_secret = 1\n__version__ = '1'\n",
            "b.py": "from orchestrator.a import _secret, __version__\n",
            "pkg/__init__.py": "from orchestrator.pkg import _impl\n",
            "pkg/_impl.py": "from .. import a\nfrom ..a import _secret as s\n",
            "cri/gen/x_pb2.py": "from orchestrator.a import _secret\n",  # generated: skipped
        },
    )
    assert [i.where() for i in graph.private] == [
        "orchestrator/b.py:1: from orchestrator.a import _secret",
        "orchestrator/pkg/_impl.py:2: from orchestrator.a import _secret",
    ]
    assert set(graph.edges["orchestrator.pkg._impl"]) == {"orchestrator.a"}  # relative imports
    assert strongly_connected(graph.edges) == []
