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

The mechanism (a connection of the loop's own that never waits, and the
checkpoints left to the thread) is ``gateway/sqlite_loop.py``; the store asks
its thread for a checkpoint every ``CHECKPOINT_EVERY`` commits made here
(``MetadataStore._maintain``). The row bound is the store's too: it counts
the rows written here (``written``), only ever read elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.core.sqlite_loop import CHECKPOINT_EVERY, LoopTransactions

__all__ = ["CHECKPOINT_EVERY", "LoopWriter"]


class LoopWriter(LoopTransactions):
    """A connection that writes rows on the loop, or says at once that it cannot."""

    def __init__(self, path: Path, insert: str, log_limit: int) -> None:
        """``insert``: the statement each row is bound to; ``log_limit``: bytes the log
        is cut back to when this connection restarts it."""
        super().__init__(path, log_limit)
        self._insert = insert
        self.written = 0  # rows committed here since it opened

    def write(self, rows: Sequence[tuple[Any, ...]]) -> bool:
        """Commit ``rows``; False (nothing written) if the database is busy, or if
        anything else failed: the store's thread then tries, and reports what fails."""
        done, _ = self.transact(lambda db: db.executemany(self._insert, rows))
        if done:
            self.written += len(rows)
        return done
