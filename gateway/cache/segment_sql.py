"""The index's side of packed blocks: where a block sits in a segment, and whole-segment eviction.

A packed block's row in ``blocks`` carries ``segment`` (the segment file's
name; NULL for a block with its own file), ``seg_offset`` (where its record
starts: header, then data) and ``checksum``; its ``file_size`` is 0, because
the bytes it occupies are counted once, by its segment's row in ``segments``
(whose ``size`` is every byte appended, live or dead). So ``totals.used`` is
the disk the tier holds: own files plus whole segments.

Eviction is by last use, over own-file blocks and whole segments together: a
segment's ``last_access`` is the latest hit on any of its blocks (a trigger
keeps it), so a segment goes when none of its blocks was read for longer than
the least recently used own file. Its live blocks go with it (see
``disk_packed.py`` for why they are dropped rather than re-appended). A
segment holding a pinned block is not evicted.

Every function here runs inside a write transaction of ``DiskIndex``, in its
thread.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

# Columns added to ``blocks`` by this feature; an index made before it gains them at open.
_COLUMNS = {
    "segment": "ALTER TABLE blocks ADD COLUMN segment TEXT",
    "seg_offset": "ALTER TABLE blocks ADD COLUMN seg_offset INTEGER NOT NULL DEFAULT 0",
    "checksum": "ALTER TABLE blocks ADD COLUMN checksum INTEGER NOT NULL DEFAULT 0",
}

_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS blocks_by_segment ON blocks (segment) WHERE segment IS NOT NULL",
    # Segments evicted (row and file gone) whose block rows are still to be deleted.
    "CREATE TABLE IF NOT EXISTS dead_segments (name TEXT PRIMARY KEY) WITHOUT ROWID",
    """
CREATE TRIGGER IF NOT EXISTS blocks_touch_segment AFTER UPDATE OF last_access ON blocks
WHEN NEW.segment IS NOT NULL BEGIN
    UPDATE segments SET last_access = max(last_access, NEW.last_access)
    WHERE name = NEW.segment;
END
""",
)

# Least recently used first: own-file blocks (unpinned) and segments (no pinned block).
_LRU = """
SELECT 0, digest, file_size, last_access FROM blocks
WHERE segment IS NULL AND NOT EXISTS
    (SELECT 1 FROM pins WHERE pins.digest = blocks.digest AND pins.expires > ?1)
UNION ALL
SELECT 1, name, size, last_access FROM segments
WHERE NOT EXISTS (SELECT 1 FROM blocks JOIN pins ON pins.digest = blocks.digest
                  WHERE blocks.segment = segments.name AND pins.expires > ?1)
ORDER BY 4 LIMIT ?2
"""

_PACKED_UPSERT = """
INSERT INTO blocks (digest, origin, bucket, key, etag, block_index, length, file_size,
                    last_access, created, segment, seg_offset, checksum)
VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)
ON CONFLICT (digest) DO UPDATE SET
    length = excluded.length, file_size = 0, last_access = excluded.last_access,
    created = excluded.created, segment = excluded.segment,
    seg_offset = excluded.seg_offset, checksum = excluded.checksum
"""

_GROW = "UPDATE segments SET size = max(size, ?), last_access = max(last_access, ?) WHERE name = ?"
_U64 = (1 << 64) - 1
# A row of a dead segment (evicted, not yet buried) is no block: its segment row is gone.
_LOCATE = """
SELECT segment, seg_offset, length, checksum FROM blocks WHERE digest = ?
AND (segment IS NULL OR EXISTS (SELECT 1 FROM segments WHERE name = segment))
"""


@dataclass(slots=True)
class Removed:
    """What an eviction or a drop took out of the index; the caller removes the bytes.

    ``files``: digests of blocks with their own file (unlink them); ``packed``:
    digests of packed blocks (forget where they were); ``segments``: names of
    whole segment files (unlink them).
    """

    files: list[str] = field(default_factory=list)
    packed: list[str] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.files) + len(self.packed)

    def extend(self, other: Removed) -> None:
        self.files += other.files
        self.packed += other.packed
        self.segments += other.segments


@dataclass(frozen=True, slots=True)
class Place:
    """Where a packed block's record is: segment file, record offset, data length, checksum."""

    segment: str
    offset: int
    length: int
    checksum: int


def migrate(conn: sqlite3.Connection) -> None:
    """Add the packed-block columns to an index made before them (idempotent)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(blocks)")}
    for column, statement in _COLUMNS.items():
        if column not in have:
            conn.execute(statement)
    for statement in _SCHEMA:
        conn.execute(statement)


def locate(conn: sqlite3.Connection, digest: str) -> Place | bool | None:
    """The block's place in a segment; True if it has its own file; None if not indexed."""
    row = conn.execute(_LOCATE, (digest,)).fetchone()
    if row is None:
        return None
    segment, offset, length, checksum = row
    if segment is None:
        return True
    return Place(segment, offset, length, checksum & _U64)


def add_segment(conn: sqlite3.Connection, name: str) -> None:
    now = time.time()
    conn.execute("INSERT OR IGNORE INTO segments VALUES (?, 0, ?, ?)", (name, now, now))


def add_packed(
    conn: sqlite3.Connection, rows: list[tuple[tuple[object, ...], Place]], sizes: dict[str, int]
) -> set[str]:
    """Index packed blocks and grow their segments to ``sizes``; returns the segments
    that are gone (evicted or dropped meanwhile), whose blocks were not indexed."""
    gone = set()
    now = time.time()  # a new block is a use: the segment is as recent as its newest block
    for name, size in sizes.items():
        grown = conn.execute(_GROW, (size, now, name))
        if grown.rowcount == 0:
            gone.add(name)
    conn.executemany(_PACKED_UPSERT, [
        (*identity, now, now, place.segment, place.offset, _signed(place.checksum))
        for identity, place in rows if place.segment not in gone
    ])  # fmt: skip
    return gone


def evict(
    conn: sqlite3.Connection, capacity: int, batch: int, victims: int | None = None,
    *, mark: bool = False,
) -> Removed:  # fmt: skip
    """Delete least recently used own-file blocks and whole segments until used <= capacity,
    or until ``victims`` of them are taken. ``mark``: a segment's row goes and its name is
    marked dead, its blocks' rows stay for ``bury`` (a commit of a few pages, not of every
    row of the segment: on a full disk, what must fit before any file may go)."""
    removed = Removed()
    used = _used(conn)
    now = time.time()
    taken = 0
    while used > capacity and (victims is None or taken < victims):
        rows = conn.execute(_LRU, (now, batch)).fetchall()
        if not rows:
            break
        for is_segment, name, size, _ in rows:
            if used <= capacity or (victims is not None and taken >= victims):
                break
            if is_segment and mark:
                conn.execute("DELETE FROM segments WHERE name = ?", (name,))
                conn.execute("INSERT OR IGNORE INTO dead_segments VALUES (?)", (name,))
                removed.segments.append(name)
            elif is_segment:
                removed.extend(drop_segment(conn, name))
            else:
                conn.execute("DELETE FROM blocks WHERE digest = ?", (name,))
                removed.files.append(name)
            used -= size
            taken += 1
        used = _used(conn)
    return removed


def bury(conn: sqlite3.Connection) -> Removed:
    """Delete the block rows of segments marked dead by ``evict(mark=True)``."""
    removed = Removed()
    for (name,) in conn.execute("SELECT name FROM dead_segments").fetchall():
        removed.packed += _delete_rows(conn, name)
        conn.execute("DELETE FROM dead_segments WHERE name = ?", (name,))
    return removed


def drop_segment(conn: sqlite3.Connection, name: str) -> Removed:
    """Delete a segment's row and the rows of every block in it. A segment already
    evicted (marked dead, its rows not yet buried) is not named in ``segments``, and its
    rows are not named in ``packed``: they were no longer blocks."""
    packed = _delete_rows(conn, name)
    if conn.execute("DELETE FROM segments WHERE name = ?", (name,)).rowcount == 0:
        conn.execute("DELETE FROM dead_segments WHERE name = ?", (name,))
        return Removed()
    return Removed(packed=packed, segments=[name])


def _delete_rows(conn: sqlite3.Connection, name: str) -> list[str]:
    packed = [d for (d,) in conn.execute("SELECT digest FROM blocks WHERE segment = ?", (name,))]
    conn.execute("DELETE FROM blocks WHERE segment = ?", (name,))
    return packed


def delete_where(conn: sqlite3.Connection, where: str, args: tuple[object, ...]) -> Removed:
    """Delete the block rows matching ``where``; a packed block's bytes stay in its
    segment as dead bytes until the segment is evicted."""
    removed = Removed()
    for digest, segment in conn.execute(f"SELECT digest, segment FROM blocks WHERE {where}", args):
        (removed.files if segment is None else removed.packed).append(digest)
    conn.execute(f"DELETE FROM blocks WHERE {where}", args)
    return removed


def segment_names(conn: sqlite3.Connection) -> dict[str, float]:
    """Every indexed segment with its creation time (for reconciliation)."""
    return dict(conn.execute("SELECT name, created FROM segments"))


def _signed(checksum: int) -> int:
    """An unsigned 64-bit checksum as SQLite's signed INTEGER."""
    return checksum - (1 << 64) if checksum >= 1 << 63 else checksum


def _used(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT used FROM totals").fetchone()[0]
