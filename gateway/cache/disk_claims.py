"""A fill's claim on a block when the index, not a file in place, says the block is stored.

A fill is claimed with an ``flock``'ed part file (``disk_files.claim``), which
gives way to a block already in place under its final name. A packed block
has no final name to find: it is a record in a segment, known only to the
index. So with packing on, a claim also asks the index, on the loop (a point
read on the index's read-only connection costs less than the hop to the index
thread and back, paid by every cold block), or in the index thread when the
database is busy; and a claim that is granted for a block indexed meanwhile is
given back.

The same claim heals one crash: a filler keeps its claim's lock on the block
file it renamed into place until the file's row lands, so a file in
``blocks/`` with neither a row nor a lock is one whose filler died between
the two. Left in place, it refused every later claim (and, being unindexed, it
was no block to ``get``): the block went to the origin on every read until a
restart's recovery. A claim that finds such an orphan removes it and fills
afresh.

The same holds for a reader: a block file in place is a block only once its row
lands, and its filler keeps the lock until then. A reader that asks in between
(no part to follow, no row, a claim refused) waits for the row
(``wait_for_row``) rather than fetch the block from the origin a second time.

Without packing, no claim asks the index (``files.claim`` alone; a block
file in place is read by name, row or not), and none of this runs.

Not guaranteed: that an orphan goes before a claim of its block comes (or a
restart's recovery, ``disk_recovery.py``): nothing looks for one meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from gateway.cache import disk_files as files
from gateway.cache import segment_sql
from gateway.cache.disk_index import DiskIndex
from gateway.cache.disk_open import opening

log = logging.getLogger(__name__)

_ROW_POLL = 0.002  # seconds between looks for the row of a block file renamed into place


def claim_unless_indexed(
    conn: sqlite3.Connection, part: Path, final: Path, header: bytes, digest: str
) -> int | None:
    """``files.claim``, also giving way to a block indexed already (a packed block has
    no final file for ``claim`` to find), and taking over a block file whose filler
    died between renaming it into place and indexing it. On the loop (``read_now``'s
    connection) or in the index thread; if the index cannot be read (busy), the claim
    is given back before the error is raised, so the caller may try again."""
    fd = files.claim(part, final, header)
    if fd is None and _orphaned(conn, final, digest):
        fd = files.claim(part, final, header)
    if fd is None:
        return None
    try:
        indexed = segment_sql.locate(conn, digest) is not None
    except BaseException:
        _give_back(part, fd)
        raise
    if indexed:
        _give_back(part, fd)
        return None
    return fd


def _give_back(part: Path, fd: int) -> None:
    """End a claim that will not fill (unlinked while still locked: the name is ours)."""
    files.unlink(part)
    os.close(fd)


def _orphaned(conn: sqlite3.Connection, final: Path, digest: str) -> bool:
    """Remove ``final`` if no row names it and no filler holds it: its filler died after
    the rename, before the row (a filler keeps its claim's lock on the renamed file until
    the row lands: ``DiskTier._publish``). Such a file is no block to ``get`` (this tier
    asks the index) and, in place, stopped every later claim: the block was never cached
    again until a restart's recovery, each read of it going to the origin."""
    try:
        fd = os.open(final, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # the claim was refused for a part another process holds
    try:
        # Checked under the lock: a filler that indexes it meanwhile holds the lock until then.
        if not files.lock_is_free(fd, keep=True) or segment_sql.locate(conn, digest) is not None:
            return False
        files.unlink(final)
        log.warning("disk tier: removed block file %s, renamed into place but never indexed",
                    final.name)  # fmt: skip
        return True
    finally:
        os.close(fd)


async def claim_packed(
    index: DiskIndex, part: Path, final: Path, header: bytes, digest: str
) -> int | None:
    """The claim of a block that may be packed, on the loop: a create, a lock, a
    header's write to the page cache and an index point read cost less than the
    hop to the index thread and back, paid by every cold block (the same trade
    as ``BlockWriter.write``'s small writes). A busy index: asked in the thread."""
    claim = claim_unless_indexed
    try:
        return index.read_now(claim, part, final, header, digest)
    except sqlite3.OperationalError:
        pass
    return await opening(index.run(index.read, claim, part, final, header, digest))


async def wait_for_row(final: Path, landed: Callable[[], bool], timeout: float) -> None:
    """Wait while ``final`` is in place, not indexed (``landed()`` False) and locked by
    its filler (``DiskTier._publish`` holds the lock until the row lands). Returns once
    the row is there, the lock is free (the filler gone: a claim takes such a file
    over, ``_orphaned``), or after ``timeout`` seconds; at once if no such file is in
    place. Measured without it: one extra origin GET in a 40 MiB read by two workers."""
    fd = await opening(asyncio.to_thread(files.open_if_locked, final))
    if fd is None:
        return
    try:
        deadline = time.monotonic() + timeout
        while not landed() and not files.lock_is_free(fd):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(_ROW_POLL)
    finally:
        os.close(fd)


def indexed_now(index: DiskIndex, digest: str) -> bool | None:
    """Whether the index holds ``digest``, on the loop; None if SQLite is busy."""
    try:
        return index.read_now(segment_sql.locate, digest) is not None
    except sqlite3.OperationalError:
        return None


async def indexed(index: DiskIndex, digest: str) -> bool:
    """``indexed_now``, asked in the index thread when SQLite is busy on the loop."""
    found = indexed_now(index, digest)
    if found is not None:
        return found
    return await opening(index.run(index.read, segment_sql.locate, digest)) is not None
