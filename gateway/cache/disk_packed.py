"""Small blocks packed into segment files: one append, no file, no rename, a batched index row.

A 4 KiB block stored as its own file costs a create, a rename, an index
transaction and a page or two of slack (8 KiB of disk for 4 KiB of data). A
packed block costs an append to a large *segment* file and a share of one
index transaction. Layout::

    segments/<pid>-<time>.seg   records: block.HEADER_SIZE bytes of header + data, back to back

Each worker process appends only to its own *active* segment (named by its
pid and start time), from its event loop thread, one record at a time, so two
workers never interleave the bytes of two blocks and no lock is needed. A
record is appended first and indexed second: the index row (segment, offset,
length, checksum; ``segment_sql.py``) is written in a *group commit* with
every other record appended meanwhile, one SQLite transaction per batch, and
under load at most one per ``_COMMIT_SPACING`` (appends gather meanwhile). This
process serves its own records at once (``places``); sibling workers find them
once the batch commits. Until then the fill's claim (a digest in memory and a
stripe of a lock file, ``packed_claims.py``: no part file) stays held, so a
sibling that asks meanwhile waits for the commit and reads the record.

A full disk costs no uncounted bytes: an append that fails is cut from the
segment's end, and a group commit that fails fails the records appended after
it to the same segments too, and cuts the segments back to where the first of
them began (``_cut_unindexed``); their blocks are served from the origin and
not stored, as any fill that meets a full disk.

A hit is ``sendfile(segment, offset, length)`` from one descriptor kept per
segment and shared by every response. Before lending it, the hit ``fstat``s
the segment (no disk I/O): a segment unlinked (evicted, or deleted by someone
else) is forgotten; one shorter than the record (truncated) drops the block;
and the record's checksum is checked again whenever the segment's (inode,
mtime, ctime) differ from when it last passed, so bytes flipped in place are
caught at the next hit and never served. Records of a segment that is no longer
appended to are checked once per process, and not at all while the file
shows the fingerprint its writer vouched for (``segment_trust.py``).

This module decides what runs when (places, the active segment, the group
commit, what an eviction or a lost segment drops). A segment as a file
(records, the kept descriptor, the record's check) is ``segment_files.py``;
a packed block's row and whole-segment eviction, ``segment_sql.py``; a fill's
claim that asks the index, since a packed block has no file of its own to
find, ``disk_claims.py``; the places this process remembers, by segment too,
``packed_places.py``; the segment descriptors it keeps open, ``segment_kept.py``.

A crash leaves at worst a torn tail: records appended whose rows never
committed. No row points at them, so they are dead bytes until their
segment goes; a row's record is complete (it was written before the row),
and if it is not (power cut without ``fsync``), its checksum fails at the
first read and the block is dropped and fetched again.

Eviction reclaims whole segments by last use (``segment_sql.evict``). Live
blocks of an evicted segment are dropped, not re-appended: the memory tier
already holds the hottest ones, a re-append would write them again and keep
the segment's neighbours' dead bytes company, and an LRU segment's blocks are,
by construction, the least recently used on the node. Measured
(``loadtest/hotset.py``: a hot set scattered among a scan 3x the capacity,
segments of 1/32 of it, the coarsest), a hot set loses 0.4 to 4 points of hit
ratio against a per-block LRU of the same bytes (0.895 vs 0.899, 0.679 vs
0.720, 0.425 vs 0.466 at mean reuse distances of 1/4, 1/2 and 1x the
capacity). Re-appending would need each block's last use in the index (a
column and an index entry: ~40 bytes, 1% of a 4 KiB block, on every block) to
win part of those points back. Blocks dropped individually (invalidation,
corruption) leave dead bytes until their segment goes.

Not guaranteed: that a sibling sees this process's new blocks before its next
batch commits (it waits on the fill's claim meanwhile); what ``segment_trust.py``
does not guarantee; that a segment evicted while
this process still appends to it keeps the blocks appended after the eviction
(they are not indexed; the next append opens a new segment); that the disk
holds no more than the capacity plus the active segments' unindexed tails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gateway.cache import disk_files as files
from gateway.cache import segment_files, segment_sql
from gateway.cache.block import HEADER_SIZE, BlockId, encode_header
from gateway.cache.disk_index import DiskIndex
from gateway.cache.packed_places import Places
from gateway.cache.segment_files import SUFFIX, Bad, PackedFile, Segment
from gateway.cache.segment_kept import KeptSegments
from gateway.cache.segment_leases import Lease
from gateway.cache.segment_sql import Place, Removed
from gateway.cache.segment_trust import SegmentTrust

log = logging.getLogger(__name__)

_PLACES = 262_144  # block places remembered per process (a miss asks the index)
_SEGMENT_SHARE = 32  # a segment holds at most 1/32 of the limit: eviction stays fine-grained
_SEGMENT_MIN = 1 << 20
_VERIFY_ON_LOOP = 64 << 10  # records up to this size are checked without a thread hop
# Seconds from the end of one index commit of this process to the start of the next. An
# idle tier commits at once; a busy one lets appends gather meanwhile (nobody's answer
# waits for the commit: readers take the bytes from the fill). At ~100 cold objects/s per
# worker each commit held one row, and with sibling workers every commit also makes the
# other process re-read the pages it changed (~18 pwrite/pread a block); spaced 20 ms,
# Hoard's CPU per cold 4 KiB object fell ~10% (loadtest/smallobjects.py, 2 workers).
# The cost: blocks a killed worker filled in its last 20 ms are not indexed (dead bytes,
# fetched again), and claims (part files) are held that much longer.
_COMMIT_SPACING = 0.02


@dataclass(slots=True)
class _Active:
    name: str
    fd: int
    size: int


@dataclass(slots=True)
class _Pending:
    identity: tuple[object, ...]
    place: Place
    done: asyncio.Future[bool]


class PackedBlocks:
    """This process's view of the packed blocks of one disk tier."""

    def __init__(
        self,
        directory: Path,
        index: DiskIndex,
        segment_size: int,
        take_touches: Callable[[], dict[str, float]],
        limit: Callable[[], int],
        on_removed: Callable[[Removed], Awaitable[None]],
        on_corrupt: Callable[[int], None],
        on_failed: Callable[[BaseException], Awaitable[None]],
    ) -> None:
        """``take_touches()`` hands over the hits to record with the next batch;
        ``limit()`` is the capacity to evict to; ``on_removed`` gets what a batch
        evicted (the tier unlinks files and counts); ``on_corrupt(n)`` counts
        blocks dropped as damaged; ``on_failed(exc)`` hears of a batch the index
        refused (logged there; a full disk makes room)."""
        self.directory = directory
        self.segment_size = segment_size
        self._index = index
        self._take_touches = take_touches
        self._limit = limit
        self._on_removed = on_removed
        self._on_corrupt = on_corrupt
        self._on_failed = on_failed
        self._places = Places(_PLACES)
        self._segments = KeptSegments(directory)
        self._trust = SegmentTrust(partial(index.read_now, segment_sql.written_of))
        self._active: _Active | None = None
        self._pending: list[_Pending] = []
        self._committing: asyncio.Task[None] | None = None
        self._last_commit = -math.inf
        self._rolling = asyncio.Lock()

    # -- finding a block ---------------------------------------------------------

    async def locate(self, digest: str) -> Place | bool | None:
        """Where a block is: a Place, True (its own file), None (not indexed)."""
        place = self._places.get(digest)
        if place is None:
            place = await self._index.locate(digest)
            if place is not None:
                self._places.remember(digest, place)
        return place

    async def get(self, block: BlockId, place: Place) -> PackedFile | None:
        """The block's checked record, lent from its segment; None if it is gone or
        damaged (then dropped from the index and counted)."""
        try:
            found = await self.open(block, place)
        except (Bad, OSError) as exc:
            await self._discard(block, str(exc))
            return None
        if found is None:  # the segment is gone: evicted, or deleted by someone else
            await self.lost_segment(place.segment)
        return found

    async def lost_segment(self, name: str) -> None:
        """A segment file vanished: drop its rows; if it was still indexed, someone else
        deleted it (an eviction removes or marks its rows first), so its blocks count as
        corrupt."""
        self._drop_segment(name)
        try:
            removed = await self._index.drop_segment(name)
        except sqlite3.Error as exc:
            log.error("disk tier: cannot drop segment %s: %s", name, exc)
            return
        if removed.packed:
            log.warning("disk tier: segment %s deleted under the cache; %d blocks dropped",
                        name, len(removed.packed))  # fmt: skip
            self._on_corrupt(len(removed.packed))
        self.forget(removed)

    async def reconcile(self, cutoff: float) -> None:
        """At start: segment files without a row go; rows of segments without a file go.
        Both only when older than ``cutoff``: younger ones may be another worker's, mid-commit."""
        on_disk = await asyncio.to_thread(segment_files.scan, self.directory)
        indexed = await self._index.segments()
        orphans = await asyncio.to_thread(
            files.older_than, [self.directory / n for n in on_disk.difference(indexed)], cutoff
        )
        await asyncio.to_thread(files.unlink_many, orphans)
        for name, created in indexed.items():
            if name not in on_disk and created < cutoff:
                await self.lost_segment(name)

    async def _discard(self, block: BlockId, why: str) -> None:
        log.warning("disk tier: dropping damaged packed block %s (%s): %s",
                    block.digest, block, why)  # fmt: skip
        self._places.forget(block.digest)
        self._on_corrupt(1)
        try:
            await self._index.remove(block.digest)
        except sqlite3.Error as exc:  # its record stays dead bytes; a refill replaces the row
            log.error("disk tier: cannot remove index row %s: %s", block.digest, exc)

    async def open(self, block: BlockId, place: Place) -> PackedFile | None:
        """The block's record, checked, lent from its segment's kept descriptor.

        None if the segment is gone; raises Bad if the record cannot be served.
        """
        segment = self._segments.get(place.segment)
        if segment is None:
            segment = await self._segments.open(place.segment)
            if segment is None:
                return None
        stat = self._linked(segment, place)
        if stat is None:
            self._drop_segment(place.segment)
            return None
        if not self._checked_here(segment, block, place, stat):
            await asyncio.to_thread(segment_files.verify, segment.fd, block, place)
            segment.verified[block.digest] = segment_files.fingerprint(stat)
        return segment_files.lend(segment, place)

    def open_held(self, block: BlockId) -> PackedFile | None:
        """``locate`` and ``open`` without leaving the loop (the hit path's answer without
        a task): the place from memory or a point read of the index, the segment's kept
        descriptor or an ``open`` of it, a small record checked here the first time (as
        ``open`` checks it on the loop too). None when only an await could tell (the index
        busy, not indexed, a large record to check, anything amiss), and then ``locate``
        and ``get`` tell, and drop what is damaged."""
        place = self._places.get(block.digest)
        if place is None:
            try:
                place = self._index.read_now(segment_sql.locate, block.digest)
            except sqlite3.OperationalError:
                return None
            if place is None:
                return None
            self._places.remember(block.digest, place)
        if not isinstance(place, Place):
            return None
        segment = self._segments.get(place.segment) or self._segments.open_now(place.segment)
        if segment is None:
            return None
        try:
            stat = self._linked(segment, place)
            if stat is None or not self._checked_here(segment, block, place, stat):
                return None
        except (Bad, OSError):
            return None
        return segment_files.lend(segment, place)

    def lease(
        self, block: BlockId, touched: dict[str, float], touched_as: dict[str, str]
    ) -> Lease | None:
        """A lease of ``block``'s record (``segment_leases.py``) as ``open_held`` just lent
        it: place and segment known, the file linked, the record lendable unchecked
        under the fingerprint it shows; None otherwise (``touched*``: the disk tier's)."""
        place = self._places.get(block.digest)
        segment = self._segments.get(place.segment) if isinstance(place, Place) else None
        if segment is None or not isinstance(place, Place):
            return None
        stat = None
        with contextlib.suppress(Bad):  # (a record past the file's end: the lookup drops it)
            stat = self._linked(segment, place)
        if stat is None:
            return None
        fingerprint = segment_files.fingerprint(stat)
        if not self._trust.lendable(segment, place.segment, block.digest, fingerprint):
            return None
        return Lease(block.digest, place, segment, fingerprint, self._places.live, touched,
                     touched_as)  # fmt: skip

    def segment_of(self, digest: str) -> str | None:
        """The segment this process last found ``digest`` in (a hit just lent)."""
        place = self._places.get(digest)
        return place.segment if isinstance(place, Place) else None

    def _linked(self, segment: Segment, place: Place) -> os.stat_result | None:
        """The segment's ``fstat`` (no disk I/O) while it is linked; None once it is gone
        (evicted, or deleted by someone else). Raises Bad if it ends before the record."""
        try:
            stat = os.fstat(segment.fd)
        except OSError:
            return None
        if stat.st_nlink == 0:
            return None
        if stat.st_size < place.offset + HEADER_SIZE + place.length:
            raise Bad(f"segment {place.segment} ends before the record (truncated)")
        return stat

    def _checked_here(
        self, segment: Segment, block: BlockId, place: Place, stat: os.stat_result
    ) -> bool:
        """Whether the record may be lent now: it needs no check (``segment_trust``), or
        it is small and passes it here (raises Bad or OSError if not). False: a large
        record, to check off the loop."""
        fingerprint = segment_files.fingerprint(stat)
        if self._trust.lendable(segment, place.segment, block.digest, fingerprint):
            return True
        if place.length > _VERIFY_ON_LOOP:
            return False
        segment_files.verify(segment.fd, block, place)
        segment.verified[block.digest] = fingerprint
        return True

    def forget(self, removed: Removed) -> None:
        """Blocks and segments taken out of the index: stop serving them."""
        for digest in (*removed.packed, *removed.files):
            self._places.forget(digest)
        for name in removed.segments:
            self._drop_segment(name)
            if self._active is not None and self._active.name == name:
                self._retire()

    def sweep(self) -> None:
        """Close descriptors of segments unlinked by sibling workers."""
        for name in self._segments.unlinked():
            self._drop_segment(name)

    # -- storing a block ---------------------------------------------------------

    async def store(self, block: BlockId, chunks: list[bytes], checksum: int) -> bool:
        """Append the block's record to this process's segment and index it in the
        next group commit; True once indexed (the caller holds the fill's claim until
        then, ``packed_claims.py``).
        Raises OSError (ENOSPC...) from the append, or sqlite3.Error when a new segment
        cannot be indexed; nothing is indexed then."""
        length = sum(len(c) for c in chunks)
        header = encode_header(block, length, checksum)
        active = await self._room(HEADER_SIZE + length)
        place = Place(active.name, active.size, length, checksum)
        self._append(active, [header, *chunks])
        active.size += HEADER_SIZE + length
        self._places.remember(block.digest, place)
        b = block
        identity = (b.digest, b.origin, b.bucket, b.key, b.index, length)
        pending = _Pending(identity, place, asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        if self._committing is None or self._committing.done():
            self._committing = asyncio.create_task(self._commit_batches())
        return await pending.done

    def _append(self, active: _Active, pieces: list[bytes]) -> None:
        """Write a record at the active segment's end, on the loop (no await: nothing
        else of this process writes meanwhile), keeping the segment's trust only if the
        file was as this process's last append left it (``segment_trust``).
        Raises OSError, with the segment cut back to its size before."""
        unchanged = self._trust.unchanged(active.name, active.fd)
        try:
            segment_files.pwritev_all(active.fd, pieces, active.size)
        except OSError:
            # A torn record past the end would be counted nowhere, nor reclaimed: cut it.
            segment_files.cut_back(active.fd, active.size)
            self._trust.forget(active.name)
            raise
        self._trust.appended(active.name, active.fd, unchanged)

    async def close(self) -> None:
        if self._committing is not None:
            await asyncio.gather(self._committing, return_exceptions=True)
        self._retire()
        for name in self._segments.names():
            self._drop_segment(name)

    async def _commit_batches(self) -> None:
        """Group commit: one transaction for everything appended since the last one."""
        while self._pending:
            # Under load, let appends gather: one transaction for several blocks.
            wait = self._last_commit + _COMMIT_SPACING - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            batch, self._pending = self._pending, []
            sizes = {p.place.segment: 0 for p in batch}
            for pending in batch:
                end = pending.place.offset + HEADER_SIZE + pending.place.length
                sizes[pending.place.segment] = max(sizes[pending.place.segment], end)
            rows = [(p.identity, p.place) for p in batch]
            try:
                removed, gone = await self._publish(rows, sizes)
            except (sqlite3.Error, OSError) as exc:  # a full disk...: these stay unindexed
                removed, gone = Removed(), set(sizes)
                self._cut_unindexed(batch, gone)
                await self._on_failed(exc)
            evicted = set(removed.packed)
            for pending in batch:
                stored = pending.place.segment not in gone and pending.identity[0] not in evicted
                if not stored:
                    self._places.forget(str(pending.identity[0]))
                if not pending.done.done():
                    pending.done.set_result(stored)
            if self._active is not None and self._active.name in gone:
                self._retire()
            self._last_commit = time.monotonic()
            if removed.segments or removed.files or removed.packed:
                await self._on_removed(removed)

    async def _publish(
        self, rows: list[tuple[tuple[object, ...], Place]], sizes: dict[str, int]
    ) -> tuple[Removed, set[str]]:
        """A batch's transaction: on the loop when the index is free at once, else in the
        thread. The hop there cost the loop more than the commit itself
        (``sqlite_loop.py``). On the loop it records no hits (they may be a second's
        worth) and evicts nothing: if the batch leaves the tier over its limit, the hits
        and the eviction follow in the thread."""
        written = {name: self._trust.vouch(name) for name in sizes}
        gone = self._index.publish_packed_now(rows, sizes, written)
        limit = self._limit()
        if gone is None:
            touches = self._take_touches()
            return await self._index.publish_packed(rows, sizes, written, touches, limit)
        if self._index.totals.used <= limit:
            return Removed(), gone  # this process's hits go with the next flush
        try:  # one transaction in the thread: the hits first, so the eviction sees them
            removed, _ = await self._index.publish_packed([], {}, {}, self._take_touches(), limit)
        except (sqlite3.Error, OSError) as exc:  # the batch is indexed: it stands
            await self._on_failed(exc)
            return Removed(), gone
        return removed, gone

    def _cut_unindexed(self, batch: list[_Pending], gone: set[str]) -> None:
        """After a failed commit: the records appended since, to the same segments (the next
        batch's), fail with it, and each segment is cut back to where the first of them
        began, so no byte of them stays on disk uncounted. On the loop, with no await:
        nothing is appended meanwhile, and the active segment is retired (the next append
        starts a new one)."""
        later = [p for p in self._pending if p.place.segment in gone]
        self._pending = [p for p in self._pending if p.place.segment not in gone]
        starts: dict[str, int] = {}
        for pending in (*batch, *later):
            segment, offset = pending.place.segment, pending.place.offset
            starts[segment] = min(starts.get(segment, offset), offset)
        if self._active is not None and self._active.name in gone:
            self._retire()
        for segment, offset in starts.items():
            self._trust.forget(segment)
            segment_files.cut_back_path(self.directory / segment, offset)
        for pending in later:  # their fillers end their claims (a sibling asks anew)
            self._places.forget(str(pending.identity[0]))
            if not pending.done.done():
                pending.done.set_result(False)

    async def _room(self, record: int) -> _Active:
        """The active segment, rolled to a new one when this record would overflow it."""
        active = self._active
        # A segment is at most a share of the limit, which a full disk may have lowered.
        ceiling = max(_SEGMENT_MIN, min(self.segment_size, self._limit() // _SEGMENT_SHARE))
        if active is not None and active.size + record > ceiling and active.size:
            self._retire()
            active = None
        if active is not None:
            return active
        async with self._rolling:  # one new segment for all the appends waiting on it
            if self._active is None:
                name = f"{os.getpid()}-{time.time_ns():x}{SUFFIX}"
                fd = await asyncio.to_thread(segment_files.create, self.directory / name)
                try:
                    await self._index.add_segment(name)
                except BaseException:
                    os.close(fd)
                    with contextlib.suppress(OSError):  # no row will ever name it
                        os.unlink(self.directory / name)
                    raise
                self._active = _Active(name, fd, 0)
                self._trust.created(name, fd)
            return self._active

    def _retire(self) -> None:
        if self._active is not None:
            os.close(self._active.fd)
            self._active = None

    def _drop_segment(self, name: str) -> None:
        self._trust.forget(name)
        self._segments.close(name)
        self._places.forget_segment(name)
