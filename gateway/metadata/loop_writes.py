"""Writing a cold object's row for sibling workers on the event loop, when nobody else is writing.

With sibling workers, a worker that fetched a cold object's metadata under
the fetch lock (``fetch_locks.py``) must make its row visible before the lock
opens: a sibling waiting on that lock reads the store next, and a row still
pending would cost the node a second origin request. Through the store's
thread, that was one trip there and one transaction per cold object (the
group commit rarely groups: the next object's fetch is not done yet), and on
two busy cores waking that thread was the costliest part of it: the loop
was descheduled while the store's thread took the GIL.

So the row is written here, on the loop's own connection, when that costs
nothing to wait for: ``busy_timeout`` is 0, so if a sibling or the store's
thread holds the write lock the write fails at once, and the caller flushes
through the thread as before (which waits). A write in WAL mode with
``synchronous=NORMAL`` appends a few pages to the log and syncs nothing:
a killed worker keeps what it committed, as with the thread's writes.

Checkpoints sync files, so they never run here: this connection has no
autocheckpoint, and after every ``CHECKPOINT_EVERY`` commits the store asks its
thread to checkpoint (``MetadataStore._maintain``), which keeps the log
bounded as the thread's own autocheckpoint does. The row bound is the store's
too: it counts the rows written here (``written``), only ever read elsewhere.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.sqlite_wal import share_pages

CHECKPOINT_EVERY = 64  # commits here between checkpoints (a commit adds ~2 pages to the log)


class LoopWriter:
    """A connection that writes rows on the loop, or says at once that it cannot."""

    def __init__(self, path: Path, insert: str, log_limit: int) -> None:
        """``insert``: the statement each row is bound to; ``log_limit``: bytes the log
        is cut back to when this connection restarts it."""
        self._insert = insert
        self._db = sqlite3.connect(path, timeout=0, isolation_level=None)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA wal_autocheckpoint = 0")
        self._db.execute(f"PRAGMA journal_size_limit = {log_limit}")
        share_pages(self._db)
        self.written = 0  # rows committed here since it opened
        self.commits = 0

    def write(self, rows: Sequence[tuple[Any, ...]]) -> bool:
        """Commit ``rows``; False (nothing written) if the database is busy, or if
        anything else failed: the store's thread then tries, and reports what fails."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False
        try:
            self._db.executemany(self._insert, rows)
            self._db.execute("COMMIT")
        except sqlite3.Error:
            self._roll_back()
            return False
        self.written += len(rows)
        self.commits += 1
        return True

    def _roll_back(self) -> None:
        """End a failed transaction: one left open would hold the write lock for good."""
        with contextlib.suppress(sqlite3.Error):
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")

    def close(self) -> None:
        self._db.close()
