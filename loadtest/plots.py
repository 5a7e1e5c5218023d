"""PNG plots of one run: throughput per epoch, and origin bytes per target."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from loadtest.report import MB, Row

PANELS = (
    ("epochs", "images: objects/s per epoch", lambda r: r.objects_per_s),
    ("shards", "shards (ranged GETs): MB/s per epoch", lambda r: r.mb_per_s),
    (
        "train",
        "train: share of time waiting for data",
        lambda r: r.extra.get("data_wait_share") or 0.0,
    ),
)


def _targets(rows: list[Row]) -> list[str]:
    return list(dict.fromkeys(r.target for r in rows))


def _bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    width = 0.8 / max(1, len(series))
    for n, (name, values) in enumerate(series.items()):
        ax.bar([i + n * width for i in range(len(groups))], values, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups)


def throughput(rows: list[Row], path: Path) -> Path:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4), squeeze=False)
    for ax, (workload, title, value) in zip(axes[0], PANELS, strict=True):
        mine = [r for r in rows if r.workload == workload and r.measured]
        phases = list(dict.fromkeys(r.phase for r in mine))
        series = {
            t: [
                next((value(r) for r in mine if r.target == t and r.phase == p), 0.0)
                for p in phases
            ]
            for t in _targets(mine)
        }
        _bars(ax, phases, series)
        ax.set_title(title, fontsize=10)
        if series:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def origin_bytes(rows: list[Row], path: Path) -> Path:
    workloads = list(dict.fromkeys(r.workload for r in rows if r.measured))
    targets = _targets([r for r in rows if r.measured])
    series = {
        w: [sum(r.origin.get("bytes", 0) for r in rows if r.target == t and r.workload == w) / MB
            for t in targets]
        for w in workloads
    }  # fmt: skip
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(targets)), 4))
    _bars(ax, targets, series)
    ax.set_ylabel("MB fetched from the origin")
    ax.set_title("origin bytes per target (all phases of each workload)", fontsize=10)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def draw(rows: list[Row], base: Path) -> dict[str, Path]:
    return {
        "throughput_png": throughput(rows, base.with_name(base.name + "-throughput.png")),
        "origin_png": origin_bytes(rows, base.with_name(base.name + "-origin.png")),
    }
