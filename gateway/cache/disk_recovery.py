"""The disk tier after a crash: make the block files and the index agree again.

Processes die mid-step (kill -9, OOM, power): a part file whose filler is
gone, a block renamed into ``blocks/`` whose row never landed, a row whose
file was unlinked before the row's deletion committed, a segment file of
packed blocks with no row, rows of a segment evicted on a full disk but not
yet deleted. None of these is wrong for long (an orphan file
is unindexed space, a ghost row a miss), but each costs capacity until
removed, so a starting tier removes them here before it serves.

Siblings may be mid-commit while one worker starts: renamed, not yet
indexed; or indexed after this scan. So only what is older than
``GRACE`` seconds is debris; younger files and rows are left for the next
start. The totals are recounted from the index afterwards, so the eviction
that follows sees every process's bytes.

Not guaranteed: a file and its row both younger than ``GRACE`` at a start
that follows a crash stay until the next start (or their eviction).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gateway.cache import disk_files as files
from gateway.cache.disk_index import DiskIndex
from gateway.cache.disk_packed import PackedBlocks

log = logging.getLogger(__name__)

GRACE = 60.0  # seconds: younger files and rows may belong to a commit in flight


async def recover(
    index: DiskIndex,
    blocks: Path,
    tmp: Path,
    final: Callable[[str], Path],
    packed: PackedBlocks | None,
) -> None:
    """Remove abandoned part files, unindexed block files and rows without files; recount."""
    stale = await asyncio.to_thread(files.remove_stale_parts, tmp)
    if stale:
        log.info("disk tier: removed %d abandoned part files", stale)
    on_disk = await asyncio.to_thread(files.scan_blocks, blocks)
    indexed = await index.created()
    cutoff = time.time() - GRACE
    orphans = await asyncio.to_thread(
        files.older_than, [final(d) for d in on_disk.difference(indexed)], cutoff
    )
    await asyncio.to_thread(files.unlink_many, orphans)
    ghosts = [(d, c) for d, c in indexed.items() if d not in on_disk and c < cutoff]
    await index.forget(ghosts)
    if packed is not None:
        packed.forget(await index.bury())  # rows of segments evicted before a crash
        await packed.reconcile(cutoff)
    await index.recount()
    if orphans or ghosts:
        log.info("disk tier: removed %d unindexed files, %d rows without files",
                 len(orphans), len(ghosts))  # fmt: skip
