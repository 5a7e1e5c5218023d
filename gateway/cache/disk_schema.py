"""The disk index's tables: their layout, the triggers that keep ``totals`` exact, starting over.

One SQLite database per node holds the disk tier's index (``disk_index.py``
runs its transactions): ``blocks`` (a row per block), ``segments`` and
``dead_segments`` (packed blocks, ``segment_sql.py``), ``pins``
(``disk_pins.py``) and ``totals``. This module is what those tables *are*, apart
from what is done with them, so the row format can be read (and changed) in
one place.

``totals`` is one row kept exact by triggers on every insert, delete and
resize of ``blocks`` and ``segments``, so "bytes used, across all processes"
is a one-row read inside the same transaction that inserts and evicts: the
capacity is checked against the truth without a ``SUM`` per commit
(``recount`` rebuilds it from the rows at start-up).

Each row is kept small, because there is one per block and a cache of small
objects holds millions: the digest is 20 raw bytes, a packed block names its
segment by an integer id and keeps no last use or creation time (its segment
does), and the by-access index covers own-file blocks only (eviction orders
segments, not their blocks). About 180 bytes a packed block, indexes included.

The tables have a layout number (``LAYOUT``, SQLite's ``user_version``); an
index of another layout, as every index made before the number was, is
started over at open rather than read with today's meaning. A column that
older code does not read is added in place instead (``_ADDED``), so a new
version keeps the cache: ``segments.written``, the segment's fingerprint as
its writer's last indexed append left it, while no one else had changed the
file (NULL: unknown). A sibling that finds the file so need not check its
records (``disk_packed.py``).

Not guaranteed: that an index of another layout is migrated. It is dropped,
and the block files it named are removed as unindexed (``disk_recovery.py``):
a cache refills.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from gateway.cache import disk_pins

# The layout of the tables below (PRAGMA user_version). An index of another layout
# is started over at open: its rows would be misread (the block files it named are
# then unindexed, and ``disk_recovery.py`` removes them).
LAYOUT = 2
TABLES = ("blocks", "segments", "dead_segments", "totals", "pins")

SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS blocks (
    digest BLOB PRIMARY KEY,         -- BlockId.digest, 20 raw bytes
    origin TEXT NOT NULL,
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    block_index INTEGER NOT NULL,
    length INTEGER NOT NULL,         -- data bytes
    file_size INTEGER NOT NULL,      -- header + data: what counts against capacity (0: packed)
    last_access REAL,                -- time.time() of the last recorded hit (own files only)
    created REAL,                    -- own files only
    segment INTEGER,                 -- segments.id of a packed block; NULL: its own file
    seg_offset INTEGER,
    checksum INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blocks_by_object ON blocks (origin, bucket, key);
CREATE INDEX IF NOT EXISTS blocks_by_access ON blocks (last_access) WHERE segment IS NULL;
CREATE INDEX IF NOT EXISTS blocks_by_segment ON blocks (segment) WHERE segment IS NOT NULL;
CREATE TABLE IF NOT EXISTS totals (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    used INTEGER NOT NULL,
    entries INTEGER NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (1, 0, 0);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: rows of a dead one may linger
    name TEXT NOT NULL UNIQUE,       -- file name under segments/
    size INTEGER NOT NULL,           -- bytes appended so far: what counts against capacity
    last_access REAL NOT NULL,       -- the latest hit on any of its blocks
    created REAL NOT NULL,
    written TEXT                     -- its writer's fingerprint of the file (see below)
);
CREATE INDEX IF NOT EXISTS segments_by_access ON segments (last_access);
-- Segments evicted on a full disk whose block rows are still to be deleted.
CREATE TABLE IF NOT EXISTS dead_segments (id INTEGER PRIMARY KEY);
CREATE TRIGGER IF NOT EXISTS segments_insert AFTER INSERT ON segments BEGIN
    UPDATE totals SET used = used + NEW.size;
END;
CREATE TRIGGER IF NOT EXISTS segments_delete AFTER DELETE ON segments BEGIN
    UPDATE totals SET used = used - OLD.size;
END;
CREATE TRIGGER IF NOT EXISTS segments_resize AFTER UPDATE OF size ON segments BEGIN
    UPDATE totals SET used = used - OLD.size + NEW.size;
END;
CREATE TRIGGER IF NOT EXISTS blocks_insert AFTER INSERT ON blocks BEGIN
    UPDATE totals SET used = used + NEW.file_size, entries = entries + 1;
END;
CREATE TRIGGER IF NOT EXISTS blocks_delete AFTER DELETE ON blocks BEGIN
    UPDATE totals SET used = used - OLD.file_size, entries = entries - 1;
END;
CREATE TRIGGER IF NOT EXISTS blocks_resize AFTER UPDATE OF file_size ON blocks BEGIN
    UPDATE totals SET used = used - OLD.file_size + NEW.file_size;
END;
COMMIT;
"""


@dataclass(frozen=True, slots=True)
class Totals:
    used: int  # file bytes of all indexed blocks, all processes
    entries: int  # indexed blocks, all processes


def read_totals(conn: sqlite3.Connection) -> Totals:
    """The ``totals`` row, as this connection sees it now."""
    used, entries = conn.execute("SELECT used, entries FROM totals").fetchone()
    return Totals(used, entries)


# Columns added to a table of the current layout since it was first made: (table, column,
# its declaration). An index made before has them added at open, empty.
_ADDED = (("segments", "written", "TEXT"),)


def create(conn: sqlite3.Connection) -> None:
    """Make the tables, after dropping those of another layout (at open, in the index thread)."""
    start_over_unless_current(conn)
    conn.executescript(SCHEMA)
    conn.executescript(f"BEGIN IMMEDIATE; {disk_pins.SCHEMA} COMMIT;")
    add_missing_columns(conn)


def add_missing_columns(conn: sqlite3.Connection) -> None:
    """``_ADDED`` columns an older index lacks (one transaction: siblings opening it at
    once find them added)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, declaration in _ADDED:
            present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if column not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def start_over_unless_current(conn: sqlite3.Connection) -> None:
    """Drop the tables of an index of another layout (one transaction: the first worker
    to open it does it; its siblings then find the current layout)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] != LAYOUT:
            for table in TABLES:  # their indexes and triggers go with them
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"PRAGMA user_version = {LAYOUT}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def recount(conn: sqlite3.Connection) -> None:
    """Recompute ``totals`` from the rows (start-up reconciliation, in a write transaction)."""
    conn.execute(
        "UPDATE totals SET used = (SELECT coalesce(sum(file_size), 0) FROM blocks)"
        " + (SELECT coalesce(sum(size), 0) FROM segments),"
        " entries = (SELECT count(*) FROM blocks)"
    )
