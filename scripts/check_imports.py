#!/usr/bin/env python3
"""No import circles in gateway/: every module imports only modules that do not import it back.

Reads each module's top-level imports with ``ast`` (those under ``if
TYPE_CHECKING:`` too: a circle hidden from the interpreter is still a circle
for a reader; imports inside functions are not edges), builds the graph of
``gateway.*`` modules, and prints every strongly connected component of more
than one module. ``--isolated`` also imports each module in
a fresh interpreter, which is what a circle breaks first.

Exit status: 0 when there is no circle (and every isolated import works), 1 otherwise.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gateway"


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def top_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``gateway`` modules ``name`` imports when it is imported."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If):
            nodes.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            nodes.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                nodes.extend(handler.body)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    edges = set()
    for target in found:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def isolated_failures(names: list[str]) -> list[str]:
    def fails(name: str) -> str | None:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT,
                              capture_output=True, text=True)  # fmt: skip
        return None if done.returncode == 0 else f"{name}: {done.stderr.strip().splitlines()[-1]}"

    with ThreadPoolExecutor(4) as pool:
        return [failure for failure in pool.map(fails, names) if failure]


def main() -> int:
    modules = module_names()
    graph = {name: top_level_imports(name, path, set(modules)) for name, path in modules.items()}
    bad = False
    for component in circles(graph):
        bad = True
        print("import circle: " + " <-> ".join(component))
    if "--isolated" in sys.argv[1:]:
        scripts = {name for name in modules if name.endswith(".__main__")}  # they run on import
        for failure in isolated_failures(sorted(set(modules) - scripts)):
            bad = True
            print(f"cannot be imported alone: {failure}")
    if not bad:
        print(f"no import circles among {len(modules)} modules")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
