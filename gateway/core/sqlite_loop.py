"""A transaction on the event loop, when nobody else is writing, or a plain "not now".

A node's shared SQLite databases (the metadata store, the block index) are
written by a thread of each worker, so the loop never waits on a lock or a
sync. But on busy cores the hop itself was the costliest part of a small write:
measured on a cold epoch of 4 KiB objects, the block index's group commit in
its thread cost the *loop's* thread ~100 µs of CPU per object on top of the
thread's own ~45 (the loop was descheduled each time the thread took the GIL
between its statements), and committing the same batch on the loop cut
Hoard's CPU per cold object by ~90 µs (``disk_packed.py``).

So a short write goes here first, on a connection of the loop's own that
never waits: ``busy_timeout`` is 0, so if a sibling or the thread holds the
write lock, ``BEGIN IMMEDIATE`` fails at once and the caller hands the write
to its thread as before (which waits). A commit in WAL mode with
``synchronous=NORMAL`` appends a few pages to the log and syncs nothing, so
a killed worker keeps what it committed, as with the thread's writes. A
database opened for durability (``synchronous=FULL``) is never written here.

Checkpoints sync files, so they never run here either: this connection has
no autocheckpoint, and after every ``CHECKPOINT_EVERY`` commits (or the
caller's count) ``maintain`` starts the caller's checkpoint in its thread, one
at a time, which keeps the log bounded as the thread's own autocheckpoint does.

Not guaranteed: that a write is tried here at all (busy, or any SQLite
error: the thread then tries, and reports what fails); that the caller's
write is short (it must keep anything long, like an eviction, for the thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from gateway.core.sqlite_wal import share_pages

T = TypeVar("T")

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 64  # commits here between checkpoints (a commit adds a few pages to the log)


class LoopTransactions:
    """A connection that commits a transaction on the loop, or says at once that it cannot."""

    def __init__(self, path: Path, log_limit: int) -> None:
        """``log_limit``: bytes the log is cut back to when this connection restarts it."""
        self._db = sqlite3.connect(path, timeout=0, isolation_level=None)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA wal_autocheckpoint = 0")
        self._db.execute(f"PRAGMA journal_size_limit = {log_limit}")
        self._db.execute("PRAGMA temp_store = MEMORY")
        share_pages(self._db)
        self._name = path.name
        self.commits = 0
        self._checkpointed = 0  # ``commits`` when the last checkpoint was started
        self.maintaining: asyncio.Future[None] | None = None  # that checkpoint, until done

    def transact(self, work: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """``(True, work(connection, *args))`` committed; ``(False, None)``, nothing
        written, if the database is busy or anything failed."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False, None
        try:
            result = work(self._db, *args)
            self._db.execute("COMMIT")
        except sqlite3.Error:
            self._roll_back()
            return False, None
        except BaseException:
            self._roll_back()
            raise
        self.commits += 1
        return True, result

    def maintain(self, start: Callable[[], Awaitable[None]], every: int = CHECKPOINT_EVERY) -> None:
        """After a commit here: once ``every`` commits were made since the last, and none
        is running, ``start()`` the caller's checkpoint in its thread (``maintaining``
        until done; a failure is logged, and the next one comes ``every`` commits on)."""
        if self.maintaining is not None or self.commits - self._checkpointed < every:
            return
        self._checkpointed = self.commits
        self.maintaining = asyncio.ensure_future(start())
        self.maintaining.add_done_callback(self._maintained)

    def _maintained(self, done: asyncio.Future[None]) -> None:
        self.maintaining = None
        if not done.cancelled() and done.exception() is not None:
            log.warning("%s: checkpoint failed: %s", self._name, done.exception())

    def _roll_back(self) -> None:
        """End a failed transaction: one left open would hold the write lock for good."""
        with contextlib.suppress(sqlite3.Error):
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")

    def close(self) -> None:
        self._db.close()
