"""What leaves the disk tier, and in which order: the index first, the files after.

Blocks leave the tier four ways: evicted (at a commit, or a full disk's
pass), dropped (an object, a prefix, everything), found corrupt when opened
(a packed one is dropped by ``disk_packed.py`` and counted here), or with
their whole segment. Each way ends here, with the same rule, as in
python-diskcache: a row is deleted (committed) before its file is unlinked,
so no committed row ever names a removed file; the unlinks run in a thread
after the commit, and one racing another process's unlink is expected and
ignored. What this process keeps of a block leaves with it: its kept
descriptor (``disk_open.py``) and its place in a segment (``disk_packed.py``).

A corrupt block file is removed only while its name still holds the bad file
(``files.names``): a good one renamed over it meanwhile stays.

The counts (``evictions``, ``corrupt``) are this process's, for
``DiskTier.stats``; ``on_evict`` and ``on_corrupt`` hear of each as it happens
(metrics).

Not guaranteed: that a corrupt block's row goes with its file. If the index
refuses the deletion, the file is removed anyway, and the row, naming no
file, costs only capacity until it ages out.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from gateway.cache import disk_files as files
from gateway.cache.block import BlockId
from gateway.cache.disk_files import Corrupt
from gateway.cache.disk_index import DiskIndex
from gateway.cache.disk_open import OpenBlocks
from gateway.cache.disk_packed import PackedBlocks
from gateway.cache.segment_sql import Removed

log = logging.getLogger(__name__)


class Removal:
    """Blocks and segments taken out of one ``DiskTier``: rows first, then files, counted."""

    def __init__(
        self,
        directory: Path,
        index: DiskIndex,
        open_blocks: OpenBlocks,
        final: Callable[[BlockId | str], Path],
        on_evict: Callable[[int], None] | None,
        on_corrupt: Callable[[], None] | None,
    ) -> None:
        """``final(block)`` is a block file's path; ``packed`` is set by the tier once
        its packed blocks exist (they report to this object)."""
        self.directory = directory
        self.packed: PackedBlocks | None = None
        self.evictions = 0  # blocks this process evicted
        self.corrupt = 0  # bad blocks this process found and removed
        # Bytes whose rows are gone and whose files this process is unlinking: still on
        # disk, no longer in the index's totals (what a full disk's room must count).
        self.unlinking = 0
        self._index = index
        self._open = open_blocks
        self._final = final
        self._on_evict = on_evict
        self._on_corrupt = on_corrupt

    async def discard(self, block: BlockId, bad: Corrupt) -> None:
        """Remove a block file found corrupt when opened, and its row; count it."""
        log.warning("disk tier: dropping corrupt block %s (%s): %s", block.digest, block, bad.why)
        self.corrupt += 1
        if self._on_corrupt is not None:
            self._on_corrupt()
        path = self._final(block)
        self._open.forget([block.digest])
        # only if the name still holds the bad file, not a good one renamed over it
        if await asyncio.to_thread(files.names, path, bad.identity):
            await self._forget(block.digest)
            await asyncio.to_thread(files.unlink, path)

    def count_corrupt(self, n: int) -> None:
        """Count ``n`` bad blocks dropped elsewhere (packed ones)."""
        self.corrupt += n
        if self._on_corrupt is not None:
            for _ in range(n):
                self._on_corrupt()

    async def _forget(self, digest: str) -> None:
        try:
            await self._index.remove(digest)
        except sqlite3.Error as exc:  # a row without a file costs only capacity
            log.error("disk tier: cannot remove index row %s: %s", digest, exc)

    async def remove_evicted(self, removed: Removed) -> None:
        """Remove what an eviction's commit took out of the index; count it."""
        if removed.files or removed.packed or removed.segments:
            await self.unlink(removed)
            self.evictions += len(removed)
            if self._on_evict is not None:
                self._on_evict(len(removed))

    async def unlink(self, removed: Removed) -> int:
        """Remove the files of rows already deleted; returns how many blocks."""
        self._open.forget(removed.files)
        if self.packed is not None:
            self.packed.forget(removed)
        self.unlinking += removed.size
        try:
            await asyncio.to_thread(files.unlink_many, self._paths(removed))
        finally:
            self.unlinking -= removed.size
        return len(removed)

    def _paths(self, removed: Removed) -> list[Path]:
        """The files of ``removed``: block files and whole segments."""
        segments = self.directory / "segments"
        return [self._final(d) for d in removed.files] + [segments / n for n in removed.segments]
