"""The disk tier: immutable blocks as files, an SQLite index beside them.

Layout under ``directory``::

    blocks/<2 hex>/<digest>   header (block.HEADER_SIZE bytes) + data, served with sendfile
    segments/<pid>-<t>.seg    small blocks packed: records of header + data (``disk_packed.py``)
    tmp/<digest>.part         a fill in progress, flock'ed by the process filling it
    claims                    the stripes that claim packed blocks' fills (``packed_claims.py``)
    index.sqlite3             the index (``disk_index.py``), WAL mode
    reserve                   room kept back for the eviction a full disk needs (``disk_space.py``)

Storage is split from the index, as in python-diskcache: ``disk_files.py``
decides how a block becomes a file and how it is read back, ``disk_index.py``
owns the table, its transactions and eviction, and this module decides what
runs when, in which thread, in which order. A hit never touches SQLite: it
opens the file by name, checks header and checksum, and hands back an open
descriptor — or, for a hot small block, lends the descriptor kept from an
earlier hit after one ``fstat`` (``disk_open.py``). The index answers what the file system answers badly: bytes used
across processes, least recently used, the blocks of an object or a prefix.

Several processes (the gateway workers of one node) share one directory.

- Writes are atomic: a block is written to ``tmp/<digest>.part`` and renamed
  into ``blocks/`` once complete, so ``blocks/`` never holds a partial file
  written by a live process. Its index row is committed right after the
  rename and deleted right before the unlink (see ``disk_index.py``), so the
  index accounts for every file but the few between those two steps.
- Fills are claimed with ``flock(LOCK_EX | LOCK_NB)`` on the part file. The
  kernel drops the lock when its holder exits, however it exits, so a crashed
  filler never leaves a claim behind that someone must time out; a process
  that loses the claim tails the part file (``PartFollower``) instead of
  fetching the block again, and can tell a dead filler (the lock is free) from
  a slow one. Part files whose lock is free are stale and may be taken over.
  The lock is held on the renamed file until its row lands, so a file in
  ``blocks/`` with neither a row nor a lock is one whose filler died between
  the two: a claim removes it and fills afresh (``disk_claims.py``).
- Eviction happens at commit, inside the transaction that inserts the row:
  least recently used first, until the total over all processes fits the
  capacity. Files are unlinked after that commit; an unlink racing another
  process is expected and ignored (``disk_removal.py``: every way out).
  Blocks still being filled are not counted, so the files on disk exceed the
  capacity by at most the blocks in flight.
- Hits are recorded in memory and written to the index in one batch every
  ``touch_interval`` seconds (and with this process's next commit), not one
  SQLite write per hit. A hit on a packed block moves only its segment's last
  use, so the hits on one segment are recorded as one: under the digest of the
  first block read from it since the last batch (~12,000 rows a second at full
  warm rate were joined to their segments in the index thread, for a few dozen
  segments). Should that block leave the index or move before the batch, the
  segment's hits of that batch are lost or moved with it: an LRU hint, no more.

Small blocks (up to ``packed_max`` bytes) have no part file: they are claimed
by their digest in memory and a stripe of the ``claims`` file, and a reader
that loses the claim waits for the group commit (``packed_claims.py``); their
commit appends them to this process's segment file (``disk_packed.py``), and
their index rows are written in group commits; a hit on one first asks where it is (this
process's memory of places, else one index read) and is lent the segment's
kept descriptor. Eviction takes own-file blocks and whole segments by last use
(``segment_sql.py``).

Disk full: ``begin``, ``write`` and ``commit`` remove the part file and fail
(OSError from the first two, False from ``commit`` and ``put``); nothing
partial reaches ``blocks/`` and blocks already stored keep serving, so the
caller can go on serving from memory. A full file system (ENOSPC, or SQLite's
"database or disk is full") also lowers the tier's limit and evicts down to
it, rows committed before files go, so later fills replace old blocks; the
flush loop measures the room again and raises the limit back (at most to the
capacity) when the file system gives space back. The limit, the passes that
make room, the fills in flight counted as the tier's own, and the errors logged
once per interval and kind are ``disk_space.FullDisk``'s (``space``).

Other programs writing into ``cache.dir``: a block is checked (header, size,
checksum) when it is opened, and a kept descriptor is lent again only while
the file's stat fingerprint (inode, size, mtime, ctime) is unchanged, so a
write in place is caught at the next open and the block dropped as corrupt.
A write that lands while a block is being sent (after its check, before or
during sendfile) reaches that client as the bytes now in the file, with a 200
and the right length: it is not detected for that response. Files deleted by
others are misses; files put into ``blocks/`` fail the header check. The cache
directory belongs to Hoard alone.

fsync: off by default. A block lost in a crash is fetched again, a torn one
fails its checksum and is dropped, and the index tolerates rows without files
and (after ``start``, ``disk_recovery.py``) files without rows. ``fsync=True`` syncs each block
before it is indexed, its directory after the rename, and runs SQLite with
``synchronous=FULL``, for caches that are expensive to refill.

Not guaranteed: that a block survives a power cut without ``fsync``; that the
LRU order includes other processes' hits younger than their touch interval;
that a fill racing an eviction of the same block keeps its file (the row
stays and ages out); that a drop racing a fill of the same key removes the
block being committed (its row lands after the drop); that following saves
the fetch: a follower whose filler died gets ``FillAbandoned`` and must claim
the fill itself.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gateway.cache import disk_claims, disk_recovery, disk_space
from gateway.cache import disk_files as files
from gateway.cache.block import HEADER_SIZE, BlockId, encode_header
from gateway.cache.disk_files import BlockFile, Corrupt, FillAbandoned, PartFollower
from gateway.cache.disk_index import DiskIndex, IndexRow
from gateway.cache.disk_open import OpenBlocks, opening, within_fd_limit
from gateway.cache.disk_packed import PackedBlocks
from gateway.cache.disk_removal import Removal
from gateway.cache.disk_writer import BlockWriter
from gateway.cache.packed_claims import PackedClaims
from gateway.cache.segment_leases import Lease
from gateway.cache.segment_sql import Place
from gateway.core.tasks import TaskSet

__all__ = ["BlockFile", "BlockWriter", "DiskStats", "DiskTier", "FillAbandoned", "PartFollower"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_KEEP_OPEN_MAX = 1 << 20  # blocks up to this size keep their descriptors open when hot
_CLAIM_WAIT = 30.0  # seconds a reader waits for a packed block's claim (a part's follower: 30)


@dataclass(frozen=True, slots=True)
class DiskStats:
    used_bytes: int  # file bytes indexed, all processes, as of this process's last index call
    capacity: int
    entries: int  # blocks indexed, all processes
    evictions: int  # blocks this process evicted
    corrupt: int  # bad block files this process found and removed
    pinned_bytes: int = 0  # bytes under a live pin (see disk_pins.py)


class DiskTier:
    """Blocks on local disk, shared by the processes of one node."""

    def __init__(
        self,
        directory: Path,
        capacity: int,
        *,
        fsync: bool = False,
        touch_interval: float = 1.0,
        open_files: int = 4096,
        on_evict: Callable[[int], None] | None = None,
        on_corrupt: Callable[[], None] | None = None,
        on_full: Callable[[], None] | None = None,
        packed_max: int = 0,
        segment_size: int = 64 << 20,
    ) -> None:
        """``capacity`` counts file bytes (headers included) across all processes.

        ``packed_max``: blocks up to this many bytes are packed into segment files
        of up to ``segment_size`` bytes (``disk_packed.py``; 0: every block has its own file).
        ``open_files``: descriptors of hot small blocks kept open (``disk_open.py``; 0: none).

        ``on_evict(n)`` is called with the number of blocks each eviction pass
        removed, ``on_corrupt()`` once per bad block file found, ``on_full()``
        each time a full file system lowered the limit (``disk_space.py``).
        """
        if touch_interval <= 0:
            raise ValueError("touch_interval must be positive")
        self.directory = Path(directory)
        self.capacity = capacity
        self._fsync = fsync
        self._touch_interval = touch_interval
        self._blocks = self.directory / "blocks"
        self._tmp = self.directory / "tmp"
        self._index = DiskIndex(self.directory / "index.sqlite3", durable=fsync)
        self._open = OpenBlocks(within_fd_limit(open_files), _KEEP_OPEN_MAX)
        # What leaves the tier (evicted, dropped, corrupt): rows first, files after, counted.
        self._removal = Removal(self.directory, self._index, self._open, self._final,
                                on_evict, on_corrupt)  # fmt: skip
        # The limit, lowered when the file system fills first, and the passes making room.
        self.space = disk_space.FullDisk(self.directory, capacity, self._index, self._removal,
                                         on_full, log)  # fmt: skip
        self._touched: dict[str, float] = {}  # hits not yet written to the index
        self._touched_as: dict[str, str] = {}  # segment -> the digest its hits are under
        # Stat fingerprints of block files whose checksum passed (see files.open_block).
        self._verified: dict[str, tuple[int, ...]] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._background = TaskSet()  # commits and aborts that outlive a cancelled caller
        self.packed_max = packed_max
        self._packed: PackedBlocks | None = None
        if packed_max > 0:
            self._packed = PackedBlocks(self.directory / "segments", self._index, segment_size,
                                        self._take_touches, lambda: self.space.limit,
                                        self._removal.remove_evicted,
                                        self._removal.count_corrupt,
                                        self.space.batch_failed)  # fmt: skip
        self._removal.packed = self._packed
        # Packed blocks are claimed without part files (``packed_claims.py``).
        self._claims = PackedClaims(self.directory / "claims") if self._packed is not None else None

    @property
    def limit(self) -> int:
        """The capacity, or less while the file system gives the tier less room
        (lowered by a full disk, raised when room comes back: ``disk_space.py``)."""
        return self.space.limit

    @property
    def rooms_made(self) -> int:
        """Full-disk passes that made room: a write lost to one may retry."""
        return self.space.rooms_made

    def packs(self, length: int) -> bool:
        """Whether a block of ``length`` bytes is packed into a segment."""
        return self._packed is not None and 0 < length <= self.packed_max

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Create the directories and the index; clean up after crashed processes."""
        for path in (self._blocks, self._tmp, self.directory / "segments"):
            await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        if self._claims is not None:
            await asyncio.to_thread(self._claims.open)
        await self._index.open()
        await asyncio.to_thread(self.space.reserve.hold)
        await disk_recovery.recover(self._index, self._blocks, self._tmp, self._final, self._packed)
        await self._removal.remove_evicted(await self._index.evict(self.capacity))
        self._flusher = asyncio.create_task(self._flush_loop())

    async def close(self) -> None:
        if self._flusher is None:
            return
        self._flusher.cancel()
        await asyncio.gather(self._flusher, return_exceptions=True)
        await self._background.settle()
        await self.space.aclose()
        self._flusher = None
        if self._packed is not None:
            await self._packed.close()
        self._open.clear()
        await self.flush()
        await self._index.close()
        if self._claims is not None:
            self._claims.close()

    # -- reading ---------------------------------------------------------------

    async def get(self, block: BlockId) -> BlockFile | None:
        """The verified block, open for reading, or None (missing, or corrupt and removed).

        The caller closes what it gets.
        """
        kept = self._open.get(block.digest)
        if kept is not None:
            self._touched[block.digest] = time.time()
            return kept
        if self._packed is not None:
            place = await self._packed.locate(block.digest)
            if place is None:
                return None  # not indexed (or its row still on the way)
            if isinstance(place, Place):
                packed = await self._packed.get(block, place)
                if packed is not None:
                    self._touch_packed(block.digest, place.segment)
                return packed
        found = await opening(
            asyncio.to_thread(files.open_block, self._final(block), block, self._verified)
        )
        if isinstance(found, Corrupt):
            await self._removal.discard(block, found)
            return None
        if found is None:
            return None
        self._touched[block.digest] = time.time()
        return self._open.keep(block.digest, found)

    def get_held(self, block: BlockId) -> BlockFile | None:
        """``get`` when no await is needed (its file kept open, or its packed record
        known and checked); None otherwise, and then ``get`` tells."""
        found = self._open.get(block.digest)
        if found is not None:
            self._touched[block.digest] = time.time()
        elif self._packed is not None:
            found = self._packed.open_held(block)
            if found is not None:
                self._touch_packed(block.digest, self._packed.segment_of(block.digest))
        return found

    def lease(self, block: BlockId) -> Lease | None:
        """A lease of ``block``'s packed record just found by ``get_held``, to lend it again
        with no lookup (``segment_leases.py``); None: not packed, or not lendable so."""
        if self._packed is None:
            return None
        return self._packed.lease(block, self._touched, self._touched_as)

    def _touch_packed(self, digest: str, segment: str | None) -> None:
        """A hit on a packed block: its segment's, under one digest per batch (a block
        whose segment is not known here stands for itself)."""
        stands_for = digest if segment is None else self._touched_as.setdefault(segment, digest)
        self._touched[stands_for] = time.time()

    async def follow(self, block: BlockId) -> PartFollower | None:
        """Tail the fill another process claimed; None if no fill is in progress.

        After None, or FillAbandoned from the follower, retry ``get`` and then
        ``begin``. Raises FillAbandoned if the filler died before its header.
        A packed block's claim (``packed_claims.py``) is waited for (its bytes land
        whole at its group commit), then None; so is the row of a block file renamed
        into place and not indexed yet (``disk_claims.wait_for_row``).
        """
        claims = self._claims
        if claims is not None and claims.holds(block.digest):
            await claims.wait(block.digest, lambda: False, _CLAIM_WAIT)
            return None
        follower = await opening(asyncio.to_thread(files.open_part, self._part(block)))
        if follower is None:

            def landed() -> bool:  # the block's row is in (SQLite busy: not yet known)
                return disk_claims.indexed_now(self._index, block.digest) is True

            if claims is not None:
                await claims.wait(block.digest, landed, _CLAIM_WAIT)
            if self._packed is not None and not landed():  # (landed: no hop to look)
                await disk_claims.wait_for_row(self._final(block), landed, _CLAIM_WAIT)
            return None
        try:
            await follower.read_header(block)
        except BaseException:
            follower.close()
            raise
        return follower

    # -- writing ---------------------------------------------------------------

    async def begin(self, block: BlockId, length: int) -> BlockWriter | None:
        """Claim the fill of ``block``: None if another process holds the claim
        (``follow`` it) or the block is already stored (``get`` it).

        Raises OSError: ENOSPC, or EFBIG for a block larger than the tier.
        """
        if HEADER_SIZE + length > self.capacity:
            raise OSError(errno.EFBIG, f"a block of {length} bytes exceeds the disk tier")
        if self._claims is not None and self.packs(length):
            return await self._begin_packed(block, length)
        part, final = self._part(block), self._final(block)
        header = encode_header(block, length, 0)  # provisional: tells followers the length
        try:
            if self._packed is not None:  # no final file to look for: ask the index too
                fd = await disk_claims.claim_packed(self._index, part, final, header, block.digest)
            else:
                fd = await opening(asyncio.to_thread(files.claim, part, final, header))
        except OSError as exc:
            await self.space.failed("start", exc, block)
            raise
        return None if fd is None else BlockWriter(self, block, fd, part, length)

    async def _begin_packed(self, block: BlockId, length: int) -> BlockWriter | None:
        """``begin`` of a packed block (``packed_claims.py``): no part file; the index is
        asked whether the block is stored, as ``disk_claims`` asks it."""
        claims = self._claims
        assert claims is not None
        if not claims.take(block.digest):
            return None
        try:
            indexed = await disk_claims.indexed(self._index, block.digest)
        except BaseException:
            claims.release(block.digest)
            raise
        if indexed:
            claims.release(block.digest)
            return None
        release = functools.partial(claims.release, block.digest)
        return BlockWriter(self, block, -1, None, length, on_release=release)

    async def put(self, block: BlockId, data: bytes) -> bool:
        """Store ``data`` as ``block``; False if not stored (claimed elsewhere, no space)."""
        try:
            writer = await self.begin(block, len(data))
            if writer is None:
                return False
            await writer.write(data)  # removes its part file itself on OSError
        except OSError:
            return False
        return await writer.commit()

    async def _publish(self, writer: BlockWriter, checksum: int) -> bool:
        # Rename first, index second: an eviction in another process cannot
        # delete a row whose file is still on its way (and leave the file
        # unindexed); until the row lands, the file is a block in flight.
        if writer.chunks is not None and self._packed is not None:
            return await self._publish_packed(writer, checksum)
        block, final = writer.block, self._final(writer.block)
        header = encode_header(block, writer.length, checksum)
        try:
            await asyncio.to_thread(files.seal, writer.fd, header, writer.path, final, self._fsync)
        except OSError as exc:
            await writer.abort()
            await self.space.failed("commit", exc, block)
            return False
        writer.land()
        row = IndexRow(block, writer.length, HEADER_SIZE + writer.length)
        touches = self._take_touches()  # so this eviction pass sees our hits
        try:
            evicted = await self._index.publish(row, touches, self.space.limit)
        except sqlite3.Error as exc:
            await asyncio.to_thread(files.unlink, final)  # an unindexed file would never go
            await self.space.failed("index", exc, block)
            return False
        finally:  # the lock, on the renamed file, is held until its row lands (disk_claims)
            writer.release()  # (not its part's name: that may already be another filler's)
        await self._removal.remove_evicted(evicted)
        return block.digest not in evicted.files  # it evicts itself only if nothing else fits

    async def _publish_packed(self, writer: BlockWriter, checksum: int) -> bool:
        # The claim is held until the block is indexed (or not to be), so a sibling
        # asking meanwhile waits for the record instead of fetching the block again.
        assert self._packed is not None and writer.chunks is not None
        writer.land()  # (a few bytes before they are appended: the block is small)
        try:
            stored = await self._packed.store(writer.block, writer.chunks, checksum)
        except (OSError, sqlite3.Error) as exc:  # served from the origin, not stored
            await writer.abort()
            await self.space.failed("append", exc, writer.block)
            return False
        writer.release()
        return stored

    # -- dropping --------------------------------------------------------------

    async def drop_object(self, origin: str, bucket: str, key: str) -> int:
        """Drop every block of every version of one object; returns how many."""
        return await self._removal.unlink(await self._index.drop_object(origin, bucket, key))

    async def drop_prefix(self, origin: str, bucket: str, prefix: str) -> int:
        """Drop every block of every key starting with ``prefix``; returns how many."""
        return await self._removal.unlink(await self._index.drop_prefix(origin, bucket, prefix))

    async def clear(self) -> int:
        """Drop every stored block; fills in progress finish and stay."""
        return await self._removal.unlink(await self._index.clear())

    # -- pinning ---------------------------------------------------------------

    async def pin(self, job: str, block: BlockId, length: int, expires: float, quota: int) -> bool:
        """Keep ``block`` (of ``length`` data bytes) from eviction for ``job`` until ``expires``.

        May come before the block is stored. False, and nothing pinned, when
        the pinned bytes would exceed ``quota``.
        """
        return await self._index.pin(job, block.digest, HEADER_SIZE + length, expires, quota)

    async def unpin(self, job: str) -> int:
        """Release every pin of ``job``; returns how many there were."""
        return await self._index.unpin(job)

    async def flush(self) -> None:
        """Write pending hits to the index and refresh the totals behind ``stats``;
        close kept descriptors of files that sibling workers removed meanwhile."""
        self._open.sweep()
        if self._packed is not None:
            self._packed.sweep()
        touches = self._take_touches()
        try:
            await self._index.touch(touches)
        except sqlite3.Error as exc:  # only LRU hints are lost
            log.error("disk tier: cannot record %d hits: %s", len(touches), exc)

    def stats(self) -> DiskStats:
        totals = self._index.totals
        removal = self._removal
        return DiskStats(totals.used, self.space.limit, totals.entries, removal.evictions,
                         removal.corrupt, self._index.pinned)  # fmt: skip

    # -- internals -------------------------------------------------------------

    def _final(self, block: BlockId | str) -> Path:
        digest = block if isinstance(block, str) else block.digest
        return self._blocks / digest[:2] / digest

    def _take_touches(self) -> dict[str, float]:
        touches = self._touched.copy()  # (emptied in place: leases hold both)
        self._touched.clear()
        self._touched_as.clear()  # a digest stands for its segment one batch at most
        return touches

    def _part(self, block: BlockId) -> Path:
        return self._tmp / f"{block.digest}.part"

    async def _keep(self, work: Awaitable[T]) -> T:
        """Await ``work``, which finishes even if the caller is cancelled."""
        return await asyncio.shield(self._background.spawn(work))

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._touch_interval)
            await self.flush()
            await self.space.recheck()  # a limit lowered by a full disk comes back with room
