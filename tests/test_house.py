"""The floor plan, measured from the code: folders for the layers, reader and writer as siblings.

``scripts/check_imports.py --layers`` checks every import against the layer table
(``scripts/test`` runs it); these checks hold the rest of what the house promises
(ARCHITECTURE.md): nothing but the entry points and the piece types at ``gateway/``'s
top, the write path never reaching into the read path, a reader that builds nothing
it uses, and modules small enough to read.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import check_imports  # noqa: E402

MODULES = check_imports.module_names()
GRAPH = {
    name: check_imports.top_level_imports(name, path, set(MODULES))
    for name, path in MODULES.items()
}


def test_only_the_entry_points_and_the_piece_types_sit_at_the_top() -> None:
    top = sorted(p.name for p in (ROOT / "gateway").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "pieces.py"]


def test_every_import_points_down_the_layer_table() -> None:
    assert check_imports.layer_problems(GRAPH) == []


def test_the_write_path_imports_nothing_of_the_read_path() -> None:
    for name, targets in GRAPH.items():
        if name.startswith("gateway.write"):
            assert not [t for t in targets if t.startswith("gateway.read")], name


def test_the_reader_builds_none_of_what_it_uses_and_imports_little() -> None:
    source = MODULES["gateway.read.reader"].read_text()
    tree = ast.parse(source)
    built = {n.func.id for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}  # fmt: skip
    assert not built & {"Invalidator", "WriteThrough", "WriteThroughs", "MetadataSource"}
    imported = GRAPH["gateway.read.reader"]
    assert len(imported) <= 14, sorted(imported)
    assert not [m for m in imported if m.split(".")[1] in ("s3", "cluster", "write")]


def test_nothing_reaches_the_reader_s_former_parts_through_it() -> None:
    reaching = re.compile(r"\breader\.(changes|source|watch|write_through)\b")
    for folder in ("gateway", "tests", "loadtest"):
        for path in (ROOT / folder).rglob("*.py"):
            assert not reaching.search(path.read_text()), path


@pytest.mark.parametrize("path", sorted((ROOT / "gateway").rglob("*.py")), ids=str)
def test_no_module_is_over_500_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 500
