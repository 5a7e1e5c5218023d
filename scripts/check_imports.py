#!/usr/bin/env python3
"""No import circles in gateway/, and (``--layers``) every import pointing down the layer table.

Reads each module's top-level imports with ``ast`` (those under ``if
TYPE_CHECKING:`` too: a circle hidden from the interpreter is still a circle
for a reader; imports inside functions are not edges), builds the graph of
``gateway.*`` modules, and prints every strongly connected component of more
than one module. ``--isolated`` also imports each module in
a fresh interpreter, which is what a circle breaks first.

``--layers`` checks the house against ``LAYERS``, the one table of layers
(``ARCHITECTURE.md`` prints it, between the ``layers`` markers, and this
check fails when the two differ; ``--write-architecture`` rewrites it from
here): each package of ``gateway/`` (a folder, or a module at its top) sits
in one layer, and may import only packages of lower layers. A package in no
layer, an import into the same or a higher layer, and a circle between
packages each fail the check.

Exit status: 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gateway"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
MARKERS = ("<!-- layers: made by scripts/check_imports.py --write-architecture -->",
           "<!-- /layers -->")  # fmt: skip

# The layer table, lowest first: (packages, what the layer is). A package may import only
# packages of the layers above it in this list; packages of one layer never import each other.
LAYERS: list[tuple[tuple[str, ...], str]] = [
    (("config",), "the settings: one object, built once, passed down"),
    (("core",), "values and rules every layer shares"),
    (
        ("obs", "origins", "cache", "node"),
        "metrics and logs; origins, block tiers, a node's workers",
    ),
    (("metadata", "pieces"), "what objects and listings are; the value types of a read"),
    (("cluster",), "placement, membership and the peer wire"),
    (("blocks",), "where a block's bytes come from: tiers, owner, origin"),
    (("coherence",), "what a change makes stale, forgotten everywhere on the node"),
    (("read", "write"), "the read path and the write path, siblings over coherence"),
    (("s3",), "the S3 front: routing, signatures, handlers, bodies"),
    (("prefetch", "warm", "client"), "the other faces: prefetch, warm jobs, Hoard's own clients"),
    (("app",), "the process: command line, wiring, server, admin"),
    (("__main__",), "python -m gateway"),
]


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


def package_of(module: str) -> str:
    """``gateway.read.reader`` → ``read``; ``gateway.pieces`` → ``pieces``; ``gateway`` → ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Every import between two packages, with the module imports that make it."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name, targets in graph.items():
        for target in targets:
            edge = (package_of(name), package_of(target))
            if edge[0] != edge[1] and "" not in edge:
                edges.setdefault(edge, []).append(f"{name} -> {target}")
    return edges


def layer_problems(graph: dict[str, set[str]]) -> list[str]:
    """What breaks the layer table: packages in no layer, imports that do not point down,
    circles between packages."""
    rank = {package: level for level, (packages, _) in enumerate(LAYERS) for package in packages}
    problems = [f"in no layer: gateway.{package}" for package in
                sorted({package_of(name) for name in graph} - set(rank) - {""})]  # fmt: skip
    edges = package_graph(graph)
    for (source, target), why in sorted(edges.items()):
        if source in rank and target in rank and rank[target] >= rank[source]:
            problems.append(f"{source} (layer {rank[source]}) imports {target} "
                            f"(layer {rank[target]}): {why[0]}")  # fmt: skip
    packages: dict[str, set[str]] = {}
    for source, target in edges:
        packages.setdefault(source, set()).add(target)
        packages.setdefault(target, set())
    problems += ["package circle: " + " <-> ".join(c) for c in circles(packages)]
    return problems


def layer_table() -> str:
    """``LAYERS`` as ``ARCHITECTURE.md`` prints it."""
    lines = ["| Layer | Packages | What it holds |", "|---|---|---|"]
    for level, (packages, what) in reversed(list(enumerate(LAYERS))):
        names = ", ".join(
            f"`{p}/`" if (ROOT / PACKAGE / p).is_dir() else f"`{p}`" for p in packages
        )
        lines.append(f"| {level} | {names} | {what} |")
    return "\n".join(lines)


def architecture_with_table(text: str) -> str | None:
    """``text`` with the table between the markers made anew; None without markers."""
    start, end = text.find(MARKERS[0]), text.find(MARKERS[1])
    if start < 0 or end < start:
        return None
    return text[: start + len(MARKERS[0])] + "\n" + layer_table() + "\n" + text[end:]


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
    if "--write-architecture" in sys.argv[1:]:
        written = architecture_with_table(ARCHITECTURE.read_text())
        if written is None:
            print(f"no layer table markers in {ARCHITECTURE.name}")
            return 1
        ARCHITECTURE.write_text(written)
    if "--layers" in sys.argv[1:]:
        for problem in layer_problems(graph):
            bad = True
            print(problem)
        text = ARCHITECTURE.read_text()
        if architecture_with_table(text) != text:
            bad = True
            print(f"{ARCHITECTURE.name}'s layer table differs from LAYERS "
                  "(scripts/check_imports.py --write-architecture rewrites it)")  # fmt: skip
    if "--isolated" in sys.argv[1:]:
        scripts = {name for name in modules if name.endswith(".__main__")}  # they run on import
        for failure in isolated_failures(sorted(set(modules) - scripts)):
            bad = True
            print(f"cannot be imported alone: {failure}")
    if not bad:
        layers = f", imports down {len(LAYERS)} layers" if "--layers" in sys.argv[1:] else ""
        print(f"no import circles among {len(modules)} modules{layers}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
