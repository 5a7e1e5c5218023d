"""Object metadata on disk, so a restarted worker (or a sibling worker) knows objects.

Blocks are named by ETag, so blocks on disk are useless after a restart until
the ETag of their object is known again. The in-memory ``MetadataCache`` is
per process and empty after a restart; this store keeps each HEAD result
(size, ETag, headers) in SQLite beside the block index, with the wall-clock
time it was learned. A worker that misses in memory asks here before the
origin: within the mount's TTL the stored answer is as good as a fresh one;
past it, the object is known, so a cheap HEAD revalidates it.

Each row also keeps ``learned``: the node journal's sequence number read
before the origin request that taught it (``journal.py``). A write
through any worker marks the journal after that, so the reader trusts a row
only while the journal says nothing touched its key since: a sibling's fetch
that raced a write may store its old answer, and it is never believed.

Saves are batched in memory and written every ``flush_interval`` seconds by
one dedicated thread (SQLite's threading rules; no write blocks the loop); a
row sibling workers must see at once is committed on the loop if that costs no
wait (``share``, ``loop_writes.py``). A
point read (``load``, one per cold object) runs on the loop, on a read-only
connection of its own: it is an index lookup of a few cached pages, a WAL
reader never waits for a writer, and a thread hop cost more than the read
(and, on two busy cores, woke a thread that contended for the GIL). Should
the database be busy anyway (a recovery, a lock held by a crashed process),
the read goes to the store's thread, which waits as writes do. A
crash loses at most that interval of metadata, which costs a HEAD later, never
a wrong answer: ETags name the blocks, and the origin has the last word after
the TTL. Bounded by ``max_rows`` (oldest first out). What a row holds, and how
an answer is packed into it: ``store_rows.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gateway.core.sqlite_wal import point_reader, share_pages, use_wal
from gateway.metadata.fetch_locks import FetchLocks
from gateway.metadata.loop_writes import LoopWriter
from gateway.metadata.store_rows import (
    INSERT,
    SCHEMA,
    THIS_ROW,
    Row,
    Scope,
    Stored,
    decode,
    encode,
    etag_column,
    row_id,
    rows_of,
    select,
)
from gateway.origins.base import ListEntry, ObjectInfo

log = logging.getLogger(__name__)
_WAL_PAGES = 256  # write-ahead log pages before a checkpoint (1 MiB)
_ABSENT_KEPT = 4096  # keys found absent, remembered for their next read
_RECOUNT_EVERY = 60.0  # seconds: the longest sibling workers' rows go uncounted


class MetadataStore:
    def __init__(self, path: Path, max_rows: int = 1_000_000, flush_interval: float = 0.5,
                 shared: bool = False) -> None:  # fmt: skip
        self._path = path
        self._shared = shared
        self._max_rows = max_rows
        self._flush_interval = flush_interval
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata-store")
        self._db: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None  # point reads, on the loop
        self._loop_writer: LoopWriter | None = None  # shared: rows for siblings, on the loop
        self._pending: dict[tuple[str, str, str], Row] = {}
        # Keys a point read found absent, with their fetch lock's version before the read:
        # only this process's ``save`` (which forgets the key here) or a sibling holding
        # the lock (which bumps the version) adds a row another read should see, so a cold
        # GET's second read (the general path's, after the hit path's) is answered without
        # SQLite. Each answers one read; the oldest go first. A row a sibling's write saved
        # is missed for that read: it costs a HEAD, as a row not flushed yet does.
        self._absent: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        self._confirmations: list[tuple[float, Scope, Sequence[ListEntry]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[None] | None = None  # the write on the store's thread
        self._next_write: asyncio.Future[None] | None = None  # the one callers join now
        self._turn_share: asyncio.Future[bool] | None = None  # the loop commit of this turn
        # The row bound costs a count, which scans an index (seconds at 10 M rows), so it is
        # counted only when the rows this process wrote since could have passed the bound,
        # and once a minute for what sibling workers wrote. Touched in the store's thread.
        self._counted = 0  # rows at the last count
        self._written = 0  # rows written since: an upper bound (a replaced row adds none)
        self._loop_counted = 0  # the loop writer's ``written`` at the last count
        self._counted_at = -math.inf
        lock_path = path.with_name(path.name + ".locks")
        self._locks = FetchLocks(lock_path)

    @property
    def shared(self) -> bool:
        """Whether sibling worker processes use the same store."""
        return self._shared

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def start(self) -> None:
        await self._call(self._open)
        # Made on the loop, which is the only thread that uses it (sqlite3's thread check).
        self._reader = point_reader(self._path, "objects")
        if self._shared:
            self._loop_writer = LoopWriter(self._path, INSERT, _WAL_PAGES * 4096)
        self._flusher = asyncio.create_task(self._flush_forever())

    def _open(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # Before one lock file, a directory of a thousand stripe files: not needed now.
        shutil.rmtree(self._path.parent / "locks", ignore_errors=True)
        if self._shared:
            self._locks.open()
        self._db = sqlite3.connect(self._path, timeout=30, isolation_level=None)
        use_wal(self._db)  # siblings may be opening it at this very moment
        self._db.execute("PRAGMA synchronous=NORMAL")
        share_pages(self._db)
        # The log is checkpointed at SQLite's default of 1,000 pages but never cut back, so it
        # stayed at its largest (6 MB at 100k objects: 60 bytes an object). A smaller log,
        # cut back to that size after each checkpoint, holds no copy of the database.
        self._db.execute(f"PRAGMA wal_autocheckpoint = {_WAL_PAGES}")
        self._db.execute(f"PRAGMA journal_size_limit = {_WAL_PAGES * 4096}")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(objects)")}
        if columns and "modified" not in columns:  # an older layout: a cache, so start over
            self._db.execute("DROP TABLE objects")
        self._db.executescript(SCHEMA)

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.flush()
        if self._loop_writer is not None and self._loop_writer.maintaining is not None:
            await asyncio.gather(self._loop_writer.maintaining, return_exceptions=True)
        if self._loop_writer is not None:
            self._loop_writer.close()
            self._loop_writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._db is not None:
            await self._call(self._db.close)
        self._locks.close()
        self._thread.shutdown(wait=True)

    async def load(self, scope: Scope, key: str) -> Stored | None:
        """The stored metadata of ``key``, if any."""
        try:
            return self.load_now(scope, key)
        except sqlite3.OperationalError:  # busy or locked: wait for it off the loop
            pass
        name = (*scope, key)
        version = self._locks.version(scope, key)
        row = self._pending.get(name) or await self._call(self._select, scope, key)
        return self._stored(name, key, row, version)

    def load_now(self, scope: Scope, key: str) -> Stored | None:
        """``load`` without leaving the loop (see the module's docstring); raises
        ``sqlite3.OperationalError`` if the database is busy (``load`` then waits)."""
        name = (*scope, key)
        row = self._pending.get(name)
        version = 0
        if row is None:
            version = self._locks.version(scope, key)
            if self._absent.pop(name, -1) == version:
                return None
            if self._reader is None:
                raise sqlite3.OperationalError("the store's point reader is not open")
            row = select(self._reader, scope, key)
        return self._stored(name, key, row, version)

    def _stored(
        self, name: tuple[str, str, str], key: str, row: Row | None, version: int
    ) -> Stored | None:
        if row is None:
            self._absent[name] = version
            if len(self._absent) > _ABSENT_KEPT:
                self._absent.popitem(last=False)
            return None
        return Stored(decode(key, row), time.time() - row[1], row[2])

    def _select(self, scope: Scope, key: str) -> Row | None:
        assert self._db is not None
        return select(self._db, scope, key)

    def fetch_lock(
        self, scope: Scope, key: str, kind: str = "meta"
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        """Hold while fetching ``key``'s metadata, so sibling workers fetch it once
        (``fetch_locks.py``); yields whether another task or worker held it first.
        ``kind`` names a separate set of stripes (``"list"``: a directory's listing),
        so a task holding a key's lock may take a listing's without waiting on itself.
        Without ``shared`` (one worker) this is free: the in-memory cache already
        coalesces."""
        return self._locks.hold(scope, key, kind)

    @staticmethod
    def lock_offset(scope: Scope, key: str, kind: str = "meta") -> int:
        """The byte of the lock file that ``fetch_lock(scope, key, kind)`` locks."""
        return FetchLocks.offset(scope, key, kind)

    async def clear(self) -> None:
        """Forget every stored object (a cluster peer missed too many invalidations)."""
        self._pending.clear()
        await self._call(self._delete_all)

    def _delete_all(self) -> None:
        assert self._db is not None
        self._db.execute("DELETE FROM objects")

    def save(self, scope: Scope, key: str, info: ObjectInfo, learned: int) -> None:
        """Remember ``info``, asked of the origin at journal sequence ``learned``;
        written with the next flush."""
        self._pending[(*scope, key)] = encode(info, time.time(), learned)
        self._absent.pop((*scope, key), None)

    def confirm(self, scope: Scope, entries: Sequence[ListEntry], listed_at: float) -> None:
        """A listing asked at wall time ``listed_at`` showed ``entries``: every stored
        row it shows unchanged (same ETag and size) is as young as the listing. A
        row keeps its ``learned``: a write after that still makes it suspect.
        Written with the next flush, by the store's thread (``entries`` must not
        change: a snapshot of a million keys is walked there, not on the loop)."""
        self._confirmations.append((listed_at, scope, entries))

    async def drop(self, scope: Scope, key_prefix: str, exact: bool = False) -> None:
        """Forget ``key_prefix`` (or every key under it): a write or an admin drop."""
        for pending in [k for k in self._pending if k[:2] == scope and
                        (k[2] == key_prefix if exact else k[2].startswith(key_prefix))]:  # fmt: skip
            del self._pending[pending]
        await self._call(self._delete, scope, key_prefix, exact)

    def _delete(self, scope: Scope, key_prefix: str, exact: bool) -> None:
        assert self._db is not None
        if exact:
            self._db.execute(
                f"DELETE FROM objects WHERE {THIS_ROW}",
                (row_id(scope, key_prefix), *scope, key_prefix),
            )
            return
        # substr, not LIKE: LIKE ignores ASCII case and treats % and _ specially.
        self._db.execute(
            "DELETE FROM objects WHERE origin=? AND bucket=? AND substr(key, 1, ?)=?",
            (*scope, len(key_prefix), key_prefix),
        )

    async def flush(self) -> None:
        """Write every row saved before the call (and whatever joins it).

        A group commit: callers that arrive while a write runs share the next
        one. With sibling workers each cold object's fetch flushes its row
        before opening the fetch lock; one transaction and one trip to the
        store's thread then serves every object that finished meanwhile.
        """
        if self._db is None or not (self._pending or self._confirmations or self._writing):
            return
        if self._next_write is None:
            self._next_write = asyncio.ensure_future(self._write_after(self._writing))
        await asyncio.shield(self._next_write)

    async def share(self, scope: Scope, key: str) -> None:
        """Make every row saved before the call visible to sibling workers now, and
        tell those that found ``key`` absent to read it again (its lock's version):
        while holding ``key``'s fetch lock.

        On the loop (``loop_writes.py``) when no write is under way here and
        the database is free; else a ``flush``. A batch the store's thread has
        taken may hold an older answer for the same key, so it must land first.

        The fetches that end in one turn of the loop share one transaction, at
        the end of that turn: with a fast origin ~3 cold objects a turn did
        (``loadtest.coldcost``, two workers), each with a commit of its own.
        """
        if not await asyncio.shield(self._share_this_turn()):
            await self.flush()
        self._locks.bump(scope, key)

    def _share_this_turn(self) -> asyncio.Future[bool]:
        """The commit on the loop of the rows saved by the end of this turn; True if it
        was made, False if the thread must write them (``flush``)."""
        if self._turn_share is None:
            loop = asyncio.get_running_loop()
            self._turn_share = loop.create_future()
            loop.call_soon(self._share_now)
        return self._turn_share

    def _share_now(self) -> None:
        done, self._turn_share = self._turn_share, None
        shared = False
        try:
            shared = self._write_on_loop()
        finally:  # whatever happened, the callers go on (to ``flush`` if nothing was written)
            if done is not None and not done.done():
                done.set_result(shared)

    def _write_on_loop(self) -> bool:
        writer = self._loop_writer
        if writer is None or self._writing is not None or not self._pending:
            return False
        if not writer.write(rows_of(self._pending)):
            return False
        self._pending = {}
        writer.maintain(lambda: self._call(self._maintain))
        return True

    def _maintain(self) -> None:
        """What the loop writer leaves to the store's thread: a checkpoint (the log
        stays bounded) and the row bound."""
        assert self._db is not None
        self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        if self._past_the_bound():
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._keep_the_bound()

    def _past_the_bound(self) -> bool:
        """Whether the rows written since the last count could pass the bound, or that
        count is too old (siblings' rows). In the store's thread."""
        since = self._written + self._loop_written() - self._loop_counted
        return self._counted + since > self._max_rows or (
            time.monotonic() - self._counted_at > _RECOUNT_EVERY
        )

    def _loop_written(self) -> int:
        """Rows the loop writer has committed since it opened (none without siblings)."""
        return 0 if self._loop_writer is None else self._loop_writer.written

    async def _write_after(self, previous: asyncio.Future[None] | None) -> None:
        """Write what is pending once ``previous`` (the write running when this one
        was asked for) is done; its failure is its own callers' to see."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        self._writing, self._next_write = self._next_write, None
        try:
            if self._pending or self._confirmations:
                batch, self._pending = self._pending, {}
                confirmations, self._confirmations = self._confirmations, []
                await self._call(self._write, batch, confirmations)
        finally:
            if self._writing is asyncio.current_task():
                self._writing = None

    def _write(
        self,
        batch: dict[tuple[str, str, str], Row],
        confirmations: list[tuple[float, Scope, Sequence[ListEntry]]],
    ) -> None:
        assert self._db is not None
        rows = rows_of(batch)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(INSERT, rows)
            for listed_at, scope, entries in confirmations:
                self._db.executemany(
                    f"UPDATE objects SET stored_at=? WHERE {THIS_ROW}"
                    " AND etag=? AND size=? AND stored_at<?",
                    (
                        (
                            listed_at,
                            row_id(scope, e.key),
                            *scope,
                            e.key,
                            etag_column(e.etag),
                            e.size,
                            listed_at,
                        )
                        for e in entries
                    ),
                )
            self._written += len(rows)
            if self._past_the_bound():
                self._keep_the_bound()

    def _keep_the_bound(self) -> None:
        """Drop the oldest rows past ``max_rows`` (inside ``_write``'s transaction)."""
        assert self._db is not None
        on_loop = self._loop_written()
        (count,) = self._db.execute("SELECT count(*) FROM objects").fetchone()
        if count > self._max_rows:
            self._db.execute(
                "DELETE FROM objects WHERE id IN "
                "(SELECT id FROM objects ORDER BY stored_at LIMIT ?)",
                (count - self._max_rows,),
            )
        self._counted, self._written = min(count, self._max_rows), 0
        self._loop_counted = on_loop
        self._counted_at = time.monotonic()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval)
            try:
                await self.flush()
            except sqlite3.Error as exc:  # a busy or full disk must not kill the worker
                log.warning("metadata store flush failed: %s", exc)
