"""A file system that fills before the disk tier's capacity: learn a lower ceiling, evict to it,
and take the room back when it comes back.

``cache.size`` is what the operator meant the tier to hold; the file system
may hold less (a smaller volume than configured, other programs' files, the
index and its write-ahead log). The first ``ENOSPC`` (or ``EDQUOT``, or
SQLite's "database or disk is full") tells the tier the truth: it sets its
limit to a *low watermark* — ``LOW_WATERMARK`` of the room the file system
gives the tier (``room``: the bytes it holds, the bytes of its fills in
flight, and the bytes still free), never above the capacity — and evicts least
recently used blocks down to it.
Later fills then replace old blocks, as they would at capacity, instead of
failing one by one while the tier stays frozen at what it wrote first.

The watermark is computed afresh from that room each time, never from the
limit before: the tier's own fills in flight (part files in ``tmp/``, every
worker's) are its own bytes, not someone else's, so a disk they filled gives
the same limit again instead of 10% less each time (which ratcheted a 160 MiB
disk down to 64 MiB under a busy fill). So are the bytes of this process that
are on disk but not in the index's totals: a fill renamed or appended into place
whose row is on its way (``landed``), and an eviction's files whose rows are
gone and whose unlinks are running (``Removal.unlinking``). Left out, sixteen
fills waiting on the index's one writer hid half an 8 MiB disk from the room,
and each full disk lowered the limit again. The pass that makes room evicts
further, below the limit, by what this process's fills still have to write
(``writing``, at most half the limit), so they can land; the limit stays.
While the limit is below the capacity, ``recheck`` (the tier's flush loop, once a
second) measures the room again and raises the limit when it grew: space that
other programs gave back is taken back without a restart.

Making room must not destroy what the index still names: the eviction's rows
are committed first and only then are its files removed. But on a full disk
that commit itself needs room, which only removed files would give back. So
the tier keeps a *reserve*: a file of ``RESERVE_BYTES`` allocated while there
is room, given back to the file system just before the eviction's commit
(which is kept to a few pages: at most ``FREEING_VICTIMS`` files and segments,
each segment only marked dead), and taken again once room is made.

Errors of one kind (a full disk, a failing write) are logged once per
``interval`` with a count of those since, never once per block (``ErrorLog``).

``FullDisk`` is what the tier holds of all this (``DiskTier.space``): its
limit, the reserve, the error log, and one room-making pass at a time, which a
write that failed meanwhile waits for; ``rooms_made`` then tells that write
room was made, and it may try again (``block_fill.Filler._store_after_room``).

Not guaranteed: that the reserve's bytes go to the eviction's commit rather
than to a sibling worker's append racing it (then the commit fails, nothing is
removed, and the next full disk tries again); that a sibling worker's fills in
flight are made room for (only their part files are counted, not what they still
have to write, nor their files landed or being unlinked); the limit is per process,
and ``recheck`` only raises it (a file system that others fill is learnt at the
next full disk); the statvfs figure is a snapshot, so a file system that other
writers keep filling may report full again, and each report lowers the limit to
what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from gateway.cache.block import BlockId
from gateway.cache.disk_index import DiskIndex
from gateway.cache.disk_removal import Removal
from gateway.cache.singleflight import Group

LOW_WATERMARK = 0.9  # share of (held + free) bytes the tier keeps after a full disk
# Files and segments per eviction commit on a full disk: each changes at most ~4 pages
# (its row and index entries, the totals), so a commit logs well under 100 KiB...
FREEING_VICTIMS = 4
_FREEING_VICTIMS_MAX = 1024  # later commits, each after the files of the one before went
RESERVE_BYTES = 128 << 10  # ...and the reserve kept back for it holds that, with room to spare
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system (or SQLite's file) has no room left."""
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or (
            "disk is full" in str(exc)
        )
    return False


def room(directory: Path, held: Callable[[], int]) -> int:
    """The bytes the file system gives the tier (a thread call): the bytes it holds
    (``held()``, read beside the file system's figure so that an unlink finishing
    meanwhile is not counted twice), its fills in flight (every worker's part files in
    ``tmp/``: the tier's own bytes, not another program's), and the bytes still free.
    The index and its log are not counted: they are what the margin under the
    watermark is for."""
    held_now = held()
    stat = os.statvfs(directory)
    return held_now + in_flight(directory / "tmp") + stat.f_bavail * stat.f_frsize


def in_flight(tmp: Path) -> int:
    """Bytes allocated to the part files under ``tmp`` (a thread call): the fills in
    flight, few at a time; one finishing meanwhile is not counted."""
    total = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(tmp) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):  # renamed into place meanwhile
                total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


def ceiling(directory: Path, held: Callable[[], int], capacity: int) -> int:
    """The low watermark (a thread call): ``LOW_WATERMARK`` of the ``room`` the file
    system gives the tier, at most ``capacity``. Measured afresh each time, so a
    second full disk with the same room gives the same limit (not 10% less), and
    a room that grew gives a higher one."""
    return min(capacity, int(room(directory, held) * LOW_WATERMARK))


async def evict_to(index: DiskIndex, reserve: Reserve, limit: int, removal: Removal) -> int:
    """Evict to ``limit`` on a full disk: each commit first, then ``removal`` unlinks
    its files. Returns the files and segments evicted; raises sqlite3.Error (nothing
    of that commit removed) or OSError."""
    # The write-ahead log may be what filled the disk: fold it into the database
    # first, and give back the reserve: the eviction's commit needs room.
    with contextlib.suppress(sqlite3.Error):
        await index.checkpoint()
    await asyncio.to_thread(reserve.release)
    evicted, victims = 0, FREEING_VICTIMS
    while True:
        removed = await index.evict_marking(limit, victims)
        if not (removed.files or removed.segments):
            break
        evicted += len(removed.files) + len(removed.segments)
        await removal.remove_evicted(removed)
        # What this commit's files gave back is room for a commit twice its size.
        victims = min(2 * victims, _FREEING_VICTIMS_MAX)
    await removal.remove_evicted(await index.bury())
    await index.checkpoint()
    await asyncio.to_thread(reserve.hold)
    return evicted


class FullDisk:
    """The disk tier's limit, lowered when the file system fills first, and the passes
    that make room for it: one at a time, shared by the writes that wait for it.

    ``removal`` unlinks the files of an eviction's commit (the tier's);
    ``on_full()`` hears of each pass that lowered the limit; ``logger`` is the
    tier's, whose lines say "disk tier:".
    """

    def __init__(
        self,
        directory: Path,
        capacity: int,
        index: DiskIndex,
        removal: Removal,
        on_full: Callable[[], None] | None,
        logger: logging.Logger,
    ) -> None:
        self.directory = directory
        self.capacity = capacity
        self.limit = capacity  # lowered when the file system fills first, raised when room returns
        self.writing = 0  # bytes this process's fills in flight will take (``begin_write``)
        self.landed = 0  # bytes of its fills in place whose rows are on their way (``land``)
        self.errors = ErrorLog(logger)
        self.reserve = Reserve(directory / "reserve")
        self.rooms_made = 0  # full-disk passes that made room: a write lost to one may retry
        self._index = index
        self._removal = removal
        self._on_full = on_full
        self._log = logger
        self._room_passes: Group[str, None] = Group()  # one pass at a time, shared by its waiters

    async def failed(self, step: str, exc: BaseException, block: BlockId) -> None:
        """A write step failed: log it (once per interval and kind); a full disk makes room."""
        full = is_full(exc)
        self.errors.error("full" if full else step, "disk tier: %s of block %s failed: %s",
                          step, block.digest, exc)  # fmt: skip
        if full:
            await self.make_room()

    async def batch_failed(self, exc: BaseException) -> None:
        """A group commit of packed blocks failed: log it; a full disk makes room."""
        full = is_full(exc)
        self.errors.error("full" if full else "index", "disk tier: cannot index packed blocks: %s",
                          exc)  # fmt: skip
        if full:
            await self.make_room()

    async def make_room(self) -> None:
        """Lower the limit to the low watermark of what the file system holds; evict to it.

        One pass at a time: a write that fails while one runs waits for it, so that when
        it returns ``rooms_made`` counts the room the pass made and the write may retry
        (``block_fill.Filler._store_after_room``). Returning at once lost that write's block:
        it was served from the origin and not stored, though room was being made for it.
        """
        await self._room_passes.do("room", self._room_pass)

    def begin_write(self, size: int) -> None:
        """A fill of ``size`` file bytes started: room a full disk's pass makes for it."""
        self.writing += size

    def land(self, size: int) -> None:
        """That fill is in place (renamed, or appended to a segment), its row on its way:
        its bytes count as held (``held``) until it ends."""
        self.landed += size

    def end_write(self, size: int, landed: bool) -> None:
        """That fill was indexed or given up (``landed``: after ``land``)."""
        self.writing -= size
        if landed:
            self.landed -= size

    def held(self) -> int:
        """The tier's bytes on disk outside ``tmp/`` as this process knows them: the
        index's totals, its fills landed but not yet indexed, its evicted files not
        yet unlinked. Read from the room's thread too: three reads of the loop's ints."""
        return self._index.totals.used + self.landed + self._removal.unlinking

    async def recheck(self) -> bool:
        """Measure the room again while the limit is below the capacity, and raise the
        limit if the room grew (space given back by other programs); True if raised.
        Never lowers it: a full disk does that, with the eviction that goes with it."""
        if self.limit >= self.capacity:
            return False
        try:
            higher = await asyncio.to_thread(ceiling, self.directory, self.held, self.capacity)
        except OSError:
            return False
        if higher <= self.limit:
            return False
        self._log.info("disk tier: room came back; limit raised from %d to %d bytes",
                       self.limit, higher)  # fmt: skip
        self.limit = higher
        return True

    async def _room_pass(self) -> None:
        try:
            self.limit = await asyncio.to_thread(ceiling, self.directory, self.held, self.capacity)
            held = self.held()
            # Below the limit by what our fills in flight still need, so they land; the
            # limit itself is not lowered by them (at most half of it is given to them).
            target = self.limit - min(self.writing, self.limit // 2)
            evicted = await evict_to(self._index, self.reserve, target, self._removal)
            self.rooms_made += 1
            if self._on_full is not None:
                self._on_full()
            self.errors.error("room", "disk tier: file system full with %d bytes held; limit "
                              "lowered to %d bytes, %d files and segments evicted", held,
                              self.limit, evicted)  # fmt: skip
        except (OSError, sqlite3.Error) as exc:
            self.errors.error("room", "disk tier: cannot make room on a full disk: %s", exc)

    async def aclose(self) -> None:
        """Cancel a pass under way (the tier is closing)."""
        await self._room_passes.aclose()


class Reserve:
    """A file of ``size`` allocated bytes, given back when the disk is full (thread calls)."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size

    def hold(self) -> bool:
        """Allocate the reserve (shared by the workers of a node: one file); False if
        there is no room for it yet."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, self.size)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the reserve's bytes back to the file system."""
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.path, 0)


class ErrorLog:
    """Errors logged once per ``interval`` seconds per kind, with a count of the rest."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # kind -> (last logged, silenced since)

    def error(self, kind: str, message: str, *args: object) -> bool:
        """Log ``message`` unless ``kind`` was logged within the interval; True if logged."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last[0] < self._interval:
            self._last[kind] = (last[0], last[1] + 1)
            return False
        silenced = last[1] if last is not None else 0
        suffix = f" (and {silenced} more like it since the last report)" if silenced else ""
        self._logger.error(message + suffix, *args)
        self._last[kind] = (now, 0)
        return True
