"""No import cycle among tfusion's modules at import time, and no import placed late to dodge one.

`lint-imports` (.ci/run) checks the layers between packages; this checks what it does not: that
inside a package, importing any module never needs a module that is still half-imported. Only the
imports Python runs when a module is imported count: those at module level, not those inside
functions or under `if TYPE_CHECKING:` (type annotations are strings under
`from __future__ import annotations`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tfusion

ROOT = Path(tfusion.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The tfusion module that importing `name` runs last (a name inside a module resolves to it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _executed(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements Python runs when the module is imported."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _executed(node.body)
            yield from _executed(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _executed(block)
        elif isinstance(node, ast.With):
            yield from _executed(node.body)


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _executed(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            # `from pkg import submodule` needs the submodule; `from pkg import name` needs pkg itself
            names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    needed = {found for found in map(_resolve, names) if found is not None}
    # importing a.b.c runs a and a.b first; the importer's own packages are already under way
    needed |= {parent for name in needed for parent in _packages(name)
               if parent in MODULES and not module.startswith(parent + ".")}
    return needed - {module}


def _packages(name: str) -> Iterator[str]:
    parts = name.split(".")
    for i in range(1, len(parts)):
        yield ".".join(parts[:i])


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` (empty when there is none), by depth-first search."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_no_module_imports_itself_back_at_import_time() -> None:
    graph = {module: _imports(module, path) for module, path in MODULES.items()}
    cycle = _cycle(graph)
    assert not cycle, "an import cycle at module level: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_is_placed_late_to_dodge_a_cycle() -> None:
    late = [f"{path.relative_to(ROOT.parent)}:{number}" for path in MODULES.values()
            for number, line in enumerate(path.read_text().splitlines(), 1) if "noqa: E402" in line]
    assert not late, f"imports below code (noqa: E402): {late}"
