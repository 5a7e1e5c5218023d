"""Turning a shared SQLite database to WAL mode when several processes open it at once.

A node's workers start together and open the same databases (the block index,
the metadata store). Setting ``journal_mode = WAL`` needs the database to
itself for a moment, and SQLite does not always wait on its busy handler for
that: a worker opening the file while a sibling is inside its first
transaction got "database is locked" and exited at start (its supervisor
started it again). The mode is a property of the file, so once any process
has set it the others find it set; until then each retries for a bounded time.

Shared, such a database is also re-read more than a private one: a connection
that finds the log changed by anyone else (a sibling worker, or another
connection of its own process) drops its whole page cache, and reads every page
it needs again, one ``pread`` each. ``share_pages`` maps the database file
instead (``mmap_size``): the pages already in the database file are read from
the kernel's page cache, which every process shares, with no system call.
Pages still in the log are read as before. Writes are unchanged (SQLite writes
with ``pwrite`` whatever the mapping), so durability is what ``synchronous``
says; the mapping only costs address space, and resident memory for the pages
a process touches (file pages, which the kernel may drop).

A point read a request needs at once (is this object known, is this block
indexed) runs on the event loop, on a ``point_reader`` of its own: a WAL
reader never waits for a writer, and the hop to a thread and back cost more
than the read. Should the database be busy anyway (a recovery, a lock held by
a crashed process), the read raises at once and its caller asks its thread.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

_MAPPED = 64 << 20  # bytes of a database file read through a mapping; the rest with pread
_RETRY_FOR = 30.0  # seconds: the longest a sibling's first transaction may hold the file
_PAUSE = 0.01


def use_wal(conn: sqlite3.Connection) -> None:
    """Put ``conn``'s database in WAL mode, waiting out siblings opening it at once."""
    deadline = time.monotonic() + _RETRY_FOR
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(_PAUSE)


def share_pages(conn: sqlite3.Connection) -> None:
    """Read ``conn``'s database file through a memory mapping (see the module's essay)."""
    conn.execute(f"PRAGMA mmap_size = {_MAPPED}").fetchall()


def point_reader(path: Path, table: str) -> sqlite3.Connection:
    """A read-only connection for point reads on the event loop: it never waits
    (``timeout=0``: a busy database raises ``OperationalError`` at once, and the
    caller asks its thread instead), and reads through the mapping. One read of
    ``table`` now: a connection opens the log's files at its first read, and a
    process's descriptors are what it holds from its start, not from its first miss."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    conn.execute("PRAGMA query_only = ON")
    share_pages(conn)
    conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()
    return conn
