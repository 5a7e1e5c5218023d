"""Pins: blocks the disk tier must not evict, each held by a job until it is unpinned or expires.

A pin is a row (job, digest, bytes, expires) in the index database, beside the
``blocks`` table and in the same transactions, so every process of a node sees
the same pins and eviction can skip them in its one query (``segment_sql._LRU``:
a packed block's pin keeps its whole segment). A pin names a
digest, not a row of ``blocks``: a warm job pins a block *before* filling it,
so the block is protected from the moment it is committed, and the pin's
``bytes`` count against the quota from the moment it is taken (a reservation).

Pinned bytes are the distinct digests under a live pin (two jobs pinning one
block count it once), summed over their ``bytes``; ``pin`` checks the quota
and inserts in one write transaction, so two processes cannot both squeeze
under it.

Not guaranteed: that a pinned block is on disk. An explicit drop
(``DELETE /_hoard/cache``) or a corrupt file still removes it; its pin keeps
counting against the quota until unpinned or expired. The quota check sums
every live pin, which costs time in proportion to the pinned blocks.
"""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS pins (
    digest BLOB NOT NULL,            -- 20 raw bytes, as in blocks
    job TEXT NOT NULL,
    bytes INTEGER NOT NULL,          -- file bytes the block takes (header + data)
    expires REAL NOT NULL,           -- time.time() after which the pin is void (inf: never)
    PRIMARY KEY (digest, job)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pins_by_job ON pins (job);
"""

_PINNED = """
SELECT coalesce(sum(size), 0) FROM
    (SELECT max(bytes) AS size FROM pins WHERE expires > ? GROUP BY digest)
"""


def pinned_bytes(conn: sqlite3.Connection, now: float) -> int:
    return conn.execute(_PINNED, (now,)).fetchone()[0]


def pin(
    conn: sqlite3.Connection, job: str, digest: str, size: int, expires: float, quota: int,
    now: float,
) -> bool:  # fmt: skip
    """Pin ``digest`` for ``job`` unless that takes the pinned bytes over ``quota``."""
    key = bytes.fromhex(digest)
    held = conn.execute(
        "SELECT 1 FROM pins WHERE digest = ? AND expires > ?", (key, now)
    ).fetchone()
    if held is None and pinned_bytes(conn, now) + size > quota:
        return False
    conn.execute(
        "INSERT INTO pins VALUES (?, ?, ?, ?) ON CONFLICT (digest, job) DO UPDATE SET"
        " bytes = excluded.bytes, expires = max(expires, excluded.expires)",
        (key, job, size, expires),
    )
    return True


def unpin(conn: sqlite3.Connection, job: str) -> int:
    """Remove every pin of ``job``; returns how many."""
    return conn.execute("DELETE FROM pins WHERE job = ?", (job,)).rowcount


def expire(conn: sqlite3.Connection, now: float) -> None:
    """Forget pins past their time (they no longer protect anything)."""
    conn.execute("DELETE FROM pins WHERE expires <= ?", (now,))
