"""The disk tier's index: one SQLite table that every process of a node shares.

The index answers what the file system cannot answer cheaply: how many bytes
the tier holds, which blocks were used least recently, which blocks belong to
an object or a prefix. It never holds block data (``disk.py`` owns the files),
and a hit never reads it: a hit opens the block's file by name.

Rules that keep several processes honest:

- One connection per process for writes, used only from one dedicated
  thread, so the event loop never waits on a write and sqlite3's thread rule
  holds (``check_same_thread`` stays on and would raise if it were broken).
  Point reads a cold fill needs at once (is this block indexed?) run on the
  loop instead, on a read-only connection (``read_now``,
  ``sqlite_wal.point_reader``); a busy database sends them to the thread.
  So does a packed batch's group commit, its rows alone (hits and evictions
  stay in the thread): on the loop's own connection if the write lock is
  free at once, else in the thread (``publish_packed_now``, ``sqlite_loop.py``).
- WAL mode, a busy timeout, and short ``BEGIN IMMEDIATE`` transactions: a
  writer takes the write lock up front instead of failing half-way when it
  upgrades from a read.
- ``totals`` is one row kept exact by triggers, so "bytes used, across all
  processes" is a one-row read inside the same transaction that inserts and
  evicts: capacity is checked against the truth without a ``SUM`` per commit.
  The tables, their triggers and their layout number are ``disk_schema.py``'s.
- A row is inserted just after its file is renamed into place and deleted
  just before its file is unlinked, so an eviction never deletes a row whose
  file is still to come, and the only files without a row are those between
  the two steps: one per process committing (the blocks in flight), or, after
  a crash, leftovers that ``DiskTier.start`` removes. A row without a file (a
  refill racing an eviction) costs only capacity until it ages out.

An index of another layout is started over at open (``disk_schema.py``: each
row is kept small, one per block, and the layout says how to read it).

Not guaranteed: ``last_access`` is as fresh as the callers' batches (see
``touch``); ``totals`` as seen by another process is as fresh as its last
transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gateway.cache import disk_pins, disk_schema, segment_sql
from gateway.cache.block import BlockId
from gateway.cache.disk_schema import Totals
from gateway.cache.segment_sql import Place, Removed
from gateway.core.sqlite_loop import LoopTransactions
from gateway.core.sqlite_wal import point_reader, share_pages, use_wal

T = TypeVar("T")

THREAD_NAME = "hoard-disk-index"
_WAL_PAGES = 64  # write-ahead log pages before a checkpoint (SQLite's default: 1,000)
# The loop's commits between checkpoints in the thread: a packed batch adds a few pages
# to the log, so the log stays near the thread's own _WAL_PAGES.
_LOOP_CHECKPOINT_EVERY = 8
_EVICT_BATCH = 64  # least recently used rows fetched per eviction query

# An upsert, not INSERT OR REPLACE: REPLACE deletes without firing delete
# triggers (unless recursive_triggers is on), which would skew `totals`.
_UPSERT = """
INSERT INTO blocks (digest, origin, bucket, key, block_index, length, file_size,
                    last_access, created, segment, seg_offset, checksum)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL)
ON CONFLICT (digest) DO UPDATE SET
    origin = excluded.origin, bucket = excluded.bucket, key = excluded.key,
    block_index = excluded.block_index, length = excluded.length,
    file_size = excluded.file_size, last_access = excluded.last_access,
    created = excluded.created, segment = NULL, seg_offset = NULL, checksum = NULL
"""

_OBJECT = "origin = ? AND bucket = ? AND key = ?"
# LIKE narrows through the index; substr() makes the match exact, because
# SQLite's LIKE ignores ASCII case and S3 keys do not.
_PREFIX = "origin = ? AND bucket = ? AND key LIKE ? ESCAPE '\\' AND substr(key, 1, ?) = ?"


@dataclass(frozen=True, slots=True)
class IndexRow:
    block: BlockId
    length: int
    file_size: int

    def values(self, now: float) -> tuple[Any, ...]:
        b = self.block
        return (segment_sql.raw(b.digest), b.origin, b.bucket, b.key, b.index, self.length,
                self.file_size, now, now)  # fmt: skip


def like_prefix(prefix: str) -> str:
    """A LIKE pattern (with ESCAPE '\\') matching strings that start with ``prefix``."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


class DiskIndex:
    """The SQLite index behind one ``DiskTier``; every method runs in its own thread."""

    def __init__(self, path: Path, *, durable: bool = False, busy_timeout: float = 30.0) -> None:
        self.path = path
        self.totals = Totals(0, 0)  # as of this process's last transaction
        self.pinned = 0  # bytes under a live pin, as of this process's last pin call
        self._durable = durable
        self._busy_timeout = busy_timeout
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._loop_reader: sqlite3.Connection | None = None  # read_now's, on the loop
        self._loop_writes: LoopTransactions | None = None  # publish_packed_now's

    async def open(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        await self.run(self._connect)
        # Made on the loop, the only thread that uses them; after _connect made the tables.
        self._loop_reader = point_reader(self.path, "totals")
        if not self._durable:  # a durable commit syncs: never on the loop
            self._loop_writes = LoopTransactions(self.path, _WAL_PAGES * 4096)

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._loop_reader is not None:
            self._loop_reader.close()
            self._loop_reader = None
        if self._loop_writes is not None:
            self._loop_writes.close()
            self._loop_writes = None
        await self.run(self._disconnect)
        self._executor.shutdown(wait=False)  # idle by now: the last job just finished
        self._executor = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the index thread (the only thread that touches SQLite)."""
        if self._executor is None:
            raise RuntimeError("disk index is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- the async API, one transaction each ----------------------------------

    async def publish(self, row: IndexRow, touches: dict[str, float], capacity: int) -> Removed:
        """Record pending hits, add ``row``, evict LRU rows until used <= capacity.

        Returns the digests evicted (possibly ``row``'s own); the caller unlinks
        their files after this commit.
        """
        return await self.run(self._publish, row, touches, capacity)

    async def touch(self, touches: dict[str, float]) -> None:
        """Record a batch of hits ({digest: time}) and refresh ``totals``."""
        await self.run(self._touch, touches)

    async def evict(self, capacity: int) -> Removed:
        return await self.run(self._in_write, _evict, capacity)

    async def evict_marking(self, capacity: int, victims: int) -> Removed:
        """``evict`` for a full disk: at most ``victims`` own files and segments, each
        segment only marked dead (its row goes, its blocks' rows wait for ``bury``), so
        the commit writes a few pages. The caller removes the files after it."""
        return await self.run(self._in_write, _evict_marking, capacity, victims)

    async def bury(self) -> Removed:
        """Delete the block rows of segments marked dead; returns their digests."""
        return await self.run(self._in_write, segment_sql.bury)

    async def remove(self, digest: str) -> None:
        await self.run(self._in_write, _delete_where, "digest = ?", (segment_sql.raw(digest),))

    async def drop_object(self, origin: str, bucket: str, key: str) -> Removed:
        return await self.run(self._in_write, _delete_where, _OBJECT, (origin, bucket, key))

    async def drop_prefix(self, origin: str, bucket: str, prefix: str) -> Removed:
        args = (origin, bucket, like_prefix(prefix), len(prefix), prefix)
        return await self.run(self._in_write, _delete_where, _PREFIX, args)

    async def pin(self, job: str, digest: str, size: int, expires: float, quota: int) -> bool:
        """Pin one block for ``job`` within ``quota`` pinned bytes; False if it does not fit."""
        return await self.run(self._in_write, self._pin, job, digest, size, expires, quota)

    async def unpin(self, job: str) -> int:
        return await self.run(self._in_write, self._unpin, job)

    async def clear(self) -> Removed:
        return await self.run(self._in_write, _clear)

    # -- packed blocks (segment_sql.py) ------------------------------------------

    async def locate(self, digest: str) -> Place | bool | None:
        """A packed block's place; True if the block has its own file; None if not indexed."""
        try:
            return self.read_now(segment_sql.locate, digest)
        except sqlite3.OperationalError:  # busy or locked: wait for it in the thread
            return await self.run(self.read, segment_sql.locate, digest)

    async def add_segment(self, name: str) -> None:
        await self.run(self._in_write, segment_sql.add_segment, name)

    async def publish_packed(
        self,
        rows: list[tuple[tuple[object, ...], Place]],
        sizes: dict[str, int],
        written: dict[str, str | None],
        touches: dict[str, float],
        capacity: int,
    ) -> tuple[Removed, set[str]]:
        """One transaction for a batch of packed blocks: record hits, index the rows,
        grow their segments (noting the fingerprints their writer vouches for), evict to
        ``capacity``. Returns what was evicted and the segments found gone (their rows
        were not indexed)."""
        return await self.run(self._publish_packed, rows, sizes, written, touches, capacity)

    def publish_packed_now(
        self,
        rows: list[tuple[tuple[object, ...], Place]],
        sizes: dict[str, int],
        written: dict[str, str | None],
    ) -> set[str] | None:
        """``publish_packed`` without its hits and eviction, on the loop, if the write
        lock is free at once: the segments found gone. None: nothing written (busy, or any
        SQLite error), ask ``publish_packed``. If ``totals`` is then over the capacity,
        the caller records its hits and evicts in the thread (``publish_packed`` of no
        rows)."""
        writes = self._loop_writes
        if writes is None:
            return None
        done, result = writes.transact(_add_packed_counted, rows, sizes, written)
        if not done or result is None:
            return None
        gone, self.totals = result
        writes.maintain(lambda: self.run(self._checkpoint_passive), _LOOP_CHECKPOINT_EVERY)
        return gone

    async def drop_segment(self, name: str) -> Removed:
        return await self.run(self._in_write, segment_sql.drop_segment, name)

    async def segments(self) -> dict[str, float]:
        return await self.run(self.read, segment_sql.segment_names)

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        """In the index thread (via ``run``): ``fn(connection, *args)`` outside a transaction."""
        assert self._conn is not None
        return fn(self._conn, *args)

    def read_now(self, fn: Callable[..., T], *args: Any) -> T:
        """On the event loop: ``fn(connection, *args)`` on the read-only connection.

        Raises ``sqlite3.OperationalError`` at once if the database is busy or
        locked (the caller then asks the thread, ``run(read, ...)``, which waits).
        """
        if self._loop_reader is None:
            raise RuntimeError("disk index is not open")
        return fn(self._loop_reader, *args)

    def _publish_packed(
        self,
        rows: list[tuple[tuple[object, ...], Place]],
        sizes: dict[str, int],
        written: dict[str, str | None],
        touches: dict[str, float],
        capacity: int,
    ) -> tuple[Removed, set[str]]:
        with self._transaction() as conn:
            gone = _add_packed(conn, rows, sizes, written, touches)
            return _evict(conn, capacity), gone

    async def created(self) -> dict[str, float]:
        """Every indexed digest with its creation time (for reconciliation)."""
        return await self.run(self._created)

    async def forget(self, rows: list[tuple[str, float]]) -> None:
        """Delete rows by (digest, created): a row replaced since is left alone."""
        await self.run(self._in_write, _forget, rows)

    async def checkpoint(self) -> None:
        """Move the write-ahead log into the database and truncate it (a full disk:
        the log is the one file of the index that grows with every commit)."""
        await self.run(self._checkpoint)

    def _checkpoint_passive(self) -> None:
        """What the loop's commits leave to the thread: a checkpoint that waits on nobody."""
        if self._conn is not None:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _checkpoint(self) -> None:
        if self._conn is not None:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def recount(self) -> None:
        """Recompute ``totals`` from the rows (start-up reconciliation)."""
        await self.run(self._in_write, disk_schema.recount)

    # -- in the index thread ---------------------------------------------------

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
        use_wal(conn)  # siblings may be opening it at this very moment
        conn.execute("PRAGMA temp_store = MEMORY")  # sorting for eviction needs no disk
        share_pages(conn)
        # A small log, checkpointed often and cut back after: on a full disk the log is
        # what must still find room for the eviction that frees it (disk_space.py).
        conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_PAGES}")
        conn.execute(f"PRAGMA journal_size_limit = {_WAL_PAGES * 4096}")
        # NORMAL in WAL mode never corrupts the database; a power cut may drop
        # the last transactions, which reconciliation at start-up absorbs.
        conn.execute(f"PRAGMA synchronous = {'FULL' if self._durable else 'NORMAL'}")
        disk_schema.create(conn)  # the tables, started over if of another layout
        self._conn = conn
        self._read_totals()
        self.pinned = disk_pins.pinned_bytes(conn, time.time())

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        if conn is None:
            raise RuntimeError("disk index is not open")
        # IMMEDIATE takes the write lock now, so the busy timeout applies here
        # rather than a deadlock error surfacing when a read upgrades to a write.
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            totals = disk_schema.read_totals(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self.totals = totals

    def _in_write(self, fn: Callable[..., T], *args: Any) -> T:
        with self._transaction() as conn:
            return fn(conn, *args)

    def _publish(self, row: IndexRow, touches: dict[str, float], capacity: int) -> Removed:
        with self._transaction() as conn:
            segment_sql.touch(conn, touches)
            # stamped under the write lock: the new row is the most recent in
            # the index, so its own eviction pass takes it only if nothing else fits
            conn.execute(_UPSERT, row.values(time.time()))
            return _evict(conn, capacity)

    def _pin(self, conn: sqlite3.Connection, job: str, digest: str, size: int,
             expires: float, quota: int) -> bool:  # fmt: skip
        now = time.time()
        disk_pins.expire(conn, now)
        pinned = disk_pins.pin(conn, job, digest, size, expires, quota, now)
        self.pinned = disk_pins.pinned_bytes(conn, now)
        return pinned

    def _unpin(self, conn: sqlite3.Connection, job: str) -> int:
        removed = disk_pins.unpin(conn, job)
        self.pinned = disk_pins.pinned_bytes(conn, time.time())
        return removed

    def _touch(self, touches: dict[str, float]) -> None:
        if not touches:
            self._read_totals()  # autocommit read: a refresh costs no write lock
            return
        with self._transaction() as conn:
            segment_sql.touch(conn, touches)

    def _created(self) -> dict[str, float]:
        assert self._conn is not None
        rows = self._conn.execute("SELECT digest, created FROM blocks WHERE segment IS NULL")
        return {digest.hex(): created for digest, created in rows}

    def _read_totals(self) -> None:
        assert self._conn is not None
        self.totals = disk_schema.read_totals(self._conn)


# -- statements, run inside a write transaction --------------------------------


def _add_packed(
    conn: sqlite3.Connection,
    rows: list[tuple[tuple[object, ...], Place]],
    sizes: dict[str, int],
    written: dict[str, str | None],
    touches: dict[str, float],
) -> set[str]:
    """Record hits, index a batch's rows, grow their segments: the segments found gone."""
    if touches:
        segment_sql.touch(conn, touches)
    return segment_sql.add_packed(conn, rows, sizes, written)


def _add_packed_counted(
    conn: sqlite3.Connection,
    rows: list[tuple[tuple[object, ...], Place]],
    sizes: dict[str, int],
    written: dict[str, str | None],
) -> tuple[set[str], Totals]:
    """``_add_packed`` without hits (a second's worth of them is too long a write for
    the loop), and the totals it leaves (``_transaction`` reads them too)."""
    return _add_packed(conn, rows, sizes, written, {}), disk_schema.read_totals(conn)


def _evict(conn: sqlite3.Connection, capacity: int) -> Removed:
    """Delete least recently used rows until the total fits ``capacity``; pinned ones stay."""
    return segment_sql.evict(conn, capacity, _EVICT_BATCH)


def _evict_marking(conn: sqlite3.Connection, capacity: int, victims: int) -> Removed:
    return segment_sql.evict(conn, capacity, _EVICT_BATCH, victims, mark=True)


def _delete_where(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> Removed:
    return segment_sql.delete_where(conn, where, args)


def _clear(conn: sqlite3.Connection) -> Removed:
    removed = segment_sql.delete_where(conn, "1", ())
    for name in segment_sql.segment_names(conn):
        removed.segments.extend(segment_sql.drop_segment(conn, name).segments)
    return removed


def _forget(conn: sqlite3.Connection, rows: list[tuple[str, float]]) -> None:
    conn.executemany(
        "DELETE FROM blocks WHERE digest = ? AND created = ?",
        [(segment_sql.raw(digest), created) for digest, created in rows],
    )
