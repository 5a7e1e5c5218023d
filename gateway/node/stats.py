"""``/_hoard/stats`` for the node: each worker's counts, summed, whichever worker answers.

Every worker keeps its own memory tier, metadata memory and fill table, so
its ``admin.worker_stats`` is a part of the node's. Each worker writes its part
to ``cache.dir/node/stats/<pid>.json`` every ``cli.GAUGE_REFRESH`` seconds; the
worker answering a call sums its own live part with its siblings' files that
are fresh (written within ``max_age``: a dead worker's part drops out by
itself, with no one to clean up after it). The disk tier is the node's
already: the answering worker's view of it is taken as it is.

Not guaranteed: exactness (a sibling's part is up to a refresh old).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.node.shared import SharedDocument

NODE_WIDE = ("disk",)  # parts every worker sees whole: taken once, not summed


class WorkerStats:
    def __init__(self, directory: Path | None, own: Callable[[], dict[str, Any]],
                 max_age: float = 3.0) -> None:  # fmt: skip
        """``directory``: where the workers' parts are (None: this process is the node)."""
        self._directory = directory
        self._own = own
        self._max_age = max_age
        self._document = SharedDocument(directory / f"{os.getpid()}.json") if directory else None

    def publish(self) -> None:
        if self._document is not None:
            self._document.write(self._own())

    def forget(self) -> None:
        if self._document is not None:
            self._document.path.unlink(missing_ok=True)

    def node(self) -> dict[str, Any]:
        """This worker's stats plus every live sibling's, and how many workers they are."""
        total = self._own()
        workers = 1
        if self._directory is not None and self._document is not None:
            now = time.time()
            for path in self._directory.glob("*.json"):
                if path == self._document.path or _older(path, now, self._max_age):
                    continue
                part = SharedDocument(path).read()
                if part is not None:
                    total = _summed(total, part)
                    workers += 1
        return {**total, "workers": workers}


def _older(path: Path, now: float, max_age: float) -> bool:
    try:
        return now - path.stat().st_mtime > max_age
    except OSError:  # it died and went meanwhile
        return True


def _summed(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Numbers added field by field (nested), node-wide parts and the rest kept as mine."""
    total: dict[str, Any] = {}
    for name, value in mine.items():
        other = theirs.get(name)
        if name in NODE_WIDE:
            total[name] = value
        elif isinstance(value, dict) and isinstance(other, dict):
            total[name] = _summed(value, other)
        elif isinstance(value, int | float) and isinstance(other, int | float):
            total[name] = value + other
        else:
            total[name] = value
    return total
