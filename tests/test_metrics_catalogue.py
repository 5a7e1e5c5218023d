"""The README's metrics catalogue lists every metric Hoard exports, with its type and labels."""

from __future__ import annotations

import re

from prometheus_client import Counter, Gauge, Histogram

from gateway.obs.metrics import Metrics
from tests.harness import REPO

_TYPES = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}


def exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Exposed name -> (type, label names) of every metric Hoard defines, process ones too."""
    metrics = Metrics()
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for value in vars(metrics).values():
        for kind, type_name in _TYPES.items():
            if isinstance(value, kind):
                name = value._name + ("_total" if kind is Counter else "")
                found[name] = (type_name, tuple(value._labelnames))
    for family in metrics._process.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        found[name] = (family.type, ())
    return found


def catalogue() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Name -> (type, labels) from the table under the README's "## Metrics" heading."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        labels_cell = re.sub(r"\([^)]*\)", "", cells[2])
        labels = tuple(
            label.strip() for label in labels_cell.split(",") if label.strip() not in ("", "—")
        )
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[name] = (cells[1], labels)
    return rows


def test_readme_lists_every_metric_with_its_type_and_labels():
    listed = catalogue()
    for name, (kind, labels) in exported().items():
        assert name in listed, f"README's metrics catalogue lacks {name}"
        assert listed[name] == (kind, labels), (name, listed[name], (kind, labels))


def test_readme_lists_no_metric_hoard_does_not_export():
    invented = set(catalogue()) - set(exported())
    assert not invented, invented
