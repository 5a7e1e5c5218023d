"""Answers a worker leaves for its siblings (gateway/node/pages.py) do not stay on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.core import errors
from gateway.metadata import pages
from gateway.metadata.pages import SharedPages


def left(directory: Path) -> list[Path]:
    return list(directory.glob("*.json")) if directory.exists() else []


async def test_an_answer_is_removed_once_past_keep_with_nothing_written_after_it(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(pages, "KEEP", 0.05)
    monkeypatch.setattr(pages, "_SLACK", 0.01)
    directory = tmp_path / "pages"
    shared = SharedPages(directory, store=None)  # type: ignore[arg-type]  # no fetch here
    shared.leave_missing(("origin", "bucket"), "a", errors.NoSuchKey("a"), learned=1)
    assert len(left(directory)) == 1  # one write: far from SWEEP_EVERY
    await asyncio.sleep(0.03)
    shared.leave_missing(("origin", "bucket"), "b", errors.NoSuchKey("b"), learned=1)
    for _ in range(1000):  # the sweeps run on this loop's timers; bounded wait
        if not left(directory):
            break
        await asyncio.sleep(0.01)
    assert left(directory) == []  # both: "b" by a sweep the first one's left files re-armed
