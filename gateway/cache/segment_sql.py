"""The index's side of packed blocks: where a block sits in a segment, and whole-segment eviction.

A packed block's row in ``blocks`` carries ``segment`` (the segment's integer
id in ``segments``, whose row names its file; NULL for a block with its own
file), ``seg_offset`` (where its record starts: header, then data) and
``checksum``; its ``file_size`` is 0, because the bytes it occupies are counted
once, by its segment's row (whose ``size`` is every byte appended, live or
dead). So ``totals.used`` is the disk the tier holds: own files plus whole
segments.

Eviction is by last use, over own-file blocks and whole segments together: a
hit on a packed block moves its segment's ``last_access`` (the block's row has
none of its own, nor an entry in the by-access index: bytes an index row of
millions does not need), so a segment goes when none of its blocks was read
for longer than the least recently used own file. Its live blocks go with it
(see ``disk_packed.py`` for why they are dropped rather than re-appended). A
segment holding a pinned block is not evicted.

On a full disk an eviction only *marks* a segment dead (its row goes, its id
is kept in ``dead_segments``) so that the commit, which must be made before
any file goes, writes a few pages; ``bury`` deletes the dead segments' block
rows once room is made. Until then those rows are no blocks: ``locate`` finds a
packed block only through its segment's row.

Digests are stored as 20 raw bytes (``raw``), not 40 hex characters: a digest
is in the table and in each of its indexes, and the index has a row per block.

Every function here runs inside a write transaction of ``DiskIndex``, in its
thread (``locate`` also outside one).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

# Least recently used first: own-file blocks (unpinned) and segments (no pinned block).
_LRU = """
SELECT 0, digest, file_size, last_access FROM blocks
WHERE segment IS NULL AND NOT EXISTS
    (SELECT 1 FROM pins WHERE pins.digest = blocks.digest AND pins.expires > ?1)
UNION ALL
SELECT 1, name, size, last_access FROM segments
WHERE NOT EXISTS (SELECT 1 FROM blocks JOIN pins ON pins.digest = blocks.digest
                  WHERE blocks.segment = segments.id AND pins.expires > ?1)
ORDER BY 4 LIMIT ?2
"""

_PACKED_UPSERT = """
INSERT INTO blocks (digest, origin, bucket, key, block_index, length, file_size,
                    last_access, created, segment, seg_offset, checksum)
VALUES (?, ?, ?, ?, ?, ?, 0, NULL, NULL, ?, ?, ?)
ON CONFLICT (digest) DO UPDATE SET
    length = excluded.length, file_size = 0, last_access = NULL, created = NULL,
    segment = excluded.segment, seg_offset = excluded.seg_offset, checksum = excluded.checksum
"""

_GROW = """
UPDATE segments SET size = max(size, ?), last_access = max(last_access, ?), written = ?
WHERE name = ? RETURNING id
"""
_U64 = (1 << 64) - 1
# Through the segment's row: a row of a dead segment (evicted, not yet buried) is no block.
_LOCATE = """
SELECT segments.name, seg_offset, length, checksum, blocks.segment IS NULL
FROM blocks LEFT JOIN segments ON segments.id = blocks.segment WHERE digest = ?
"""
# A batch of hits goes into a temporary table first, then each own file's row and each
# segment's row is written once, with its latest hit: a thousand hits on one segment's
# blocks are one write, not a thousand (and a packed block's row is not written at all).
# max(): batches from several processes arrive out of order; never move an entry back.
_TOUCHED = (
    "CREATE TEMP TABLE IF NOT EXISTS touched (digest BLOB PRIMARY KEY, at REAL) WITHOUT ROWID"
)
_TOUCH_ADD = "INSERT INTO temp.touched VALUES (?2, ?1) ON CONFLICT DO UPDATE SET at = max(at, ?1)"
_TOUCH_FILE = """
UPDATE blocks SET last_access = max(last_access, touched.at)
FROM temp.touched WHERE blocks.digest = touched.digest AND blocks.segment IS NULL
"""
_TOUCH_SEGMENT = """
UPDATE segments SET last_access = max(last_access, latest.at)
FROM (SELECT blocks.segment AS id, max(touched.at) AS at
      FROM temp.touched JOIN blocks ON blocks.digest = touched.digest
      WHERE blocks.segment IS NOT NULL GROUP BY blocks.segment) AS latest
WHERE segments.id = latest.id
"""


def raw(digest: str) -> bytes:
    """A block digest as the index stores it: 20 bytes."""
    return bytes.fromhex(digest)


@dataclass(slots=True)
class Removed:
    """What an eviction or a drop took out of the index; the caller removes the bytes.

    ``files``: digests of blocks with their own file (unlink them); ``packed``:
    digests of packed blocks (forget where they were); ``segments``: names of
    whole segment files (unlink them). ``size``: the bytes those rows counted against
    the capacity (own files and whole segments): on disk until the unlinks are done.
    """

    files: list[str] = field(default_factory=list)
    packed: list[str] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    size: int = 0

    def __len__(self) -> int:
        return len(self.files) + len(self.packed)

    def extend(self, other: Removed) -> None:
        self.files += other.files
        self.packed += other.packed
        self.segments += other.segments
        self.size += other.size


@dataclass(frozen=True, slots=True)
class Place:
    """Where a packed block's record is: segment file, record offset, data length, checksum."""

    segment: str
    offset: int
    length: int
    checksum: int


def locate(conn: sqlite3.Connection, digest: str) -> Place | bool | None:
    """The block's place in a segment; True if it has its own file; None if not indexed."""
    row = conn.execute(_LOCATE, (raw(digest),)).fetchone()
    if row is None:
        return None
    name, offset, length, checksum, own_file = row
    if own_file:
        return True
    if name is None:  # its segment is dead
        return None
    return Place(name, offset, length, checksum & _U64)


def touch(conn: sqlite3.Connection, touches: dict[str, float]) -> None:
    """Record hits ({digest: time}): an own file's row, or a packed block's segment."""
    conn.execute(_TOUCHED)
    conn.executemany(_TOUCH_ADD, [(when, raw(digest)) for digest, when in touches.items()])
    conn.execute(_TOUCH_FILE)
    conn.execute(_TOUCH_SEGMENT)
    conn.execute("DELETE FROM temp.touched")


def add_segment(conn: sqlite3.Connection, name: str) -> None:
    now = time.time()
    conn.execute(
        "INSERT OR IGNORE INTO segments (name, size, last_access, created) VALUES (?, 0, ?, ?)",
        (name, now, now),
    )


def add_packed(
    conn: sqlite3.Connection,
    rows: list[tuple[tuple[object, ...], Place]],
    sizes: dict[str, int],
    written: dict[str, str | None],
) -> set[str]:
    """Index packed blocks and grow their segments to ``sizes``, noting the fingerprint
    their writer vouches for (``written``, None: none); returns the segments that are
    gone (evicted or dropped meanwhile), whose blocks were not indexed."""
    gone, ids = set(), {}
    now = time.time()  # a new block is a use: the segment is as recent as its newest block
    for name, size in sizes.items():
        grown = conn.execute(_GROW, (size, now, written.get(name), name)).fetchone()
        if grown is None:
            gone.add(name)
        else:
            ids[name] = grown[0]
    conn.executemany(_PACKED_UPSERT, [
        (raw(digest), *identity, ids[place.segment], place.offset, _signed(place.checksum))
        for (digest, *identity), place in rows if place.segment not in gone
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
                conn.execute("INSERT OR IGNORE INTO dead_segments SELECT id FROM segments"
                             " WHERE name = ?", (name,))  # fmt: skip
                conn.execute("DELETE FROM segments WHERE name = ?", (name,))
                removed.segments.append(name)
                removed.size += size
            elif is_segment:
                removed.extend(drop_segment(conn, name))
            else:
                conn.execute("DELETE FROM blocks WHERE digest = ?", (name,))
                removed.files.append(name.hex())
                removed.size += size
            used -= size
            taken += 1
        used = _used(conn)
    return removed


def bury(conn: sqlite3.Connection) -> Removed:
    """Delete the block rows of segments marked dead by ``evict(mark=True)``."""
    removed = Removed()
    for (segment,) in conn.execute("SELECT id FROM dead_segments").fetchall():
        removed.packed += _delete_rows(conn, segment)
        conn.execute("DELETE FROM dead_segments WHERE id = ?", (segment,))
    return removed


def drop_segment(conn: sqlite3.Connection, name: str) -> Removed:
    """Delete a segment's row and the rows of every block in it. A segment already
    evicted (marked dead, its rows not yet buried) has no row: nothing is dropped here,
    and its rows wait for ``bury``."""
    row = conn.execute("DELETE FROM segments WHERE name = ? RETURNING id, size",
                       (name,)).fetchone()  # fmt: skip
    if row is None:
        return Removed()
    return Removed(packed=_delete_rows(conn, row[0]), segments=[name], size=row[1])


def _delete_rows(conn: sqlite3.Connection, segment: int) -> list[str]:
    found = conn.execute("SELECT digest FROM blocks WHERE segment = ?", (segment,)).fetchall()
    conn.execute("DELETE FROM blocks WHERE segment = ?", (segment,))
    return [d.hex() for (d,) in found]


def delete_where(conn: sqlite3.Connection, where: str, args: tuple[object, ...]) -> Removed:
    """Delete the block rows matching ``where``; a packed block's bytes stay in its
    segment as dead bytes until the segment is evicted."""
    removed = Removed()
    found = conn.execute(f"SELECT digest, segment, file_size FROM blocks WHERE {where}", args)
    for digest, segment, file_size in found:
        (removed.files if segment is None else removed.packed).append(digest.hex())
        removed.size += file_size  # 0 for a packed block: its bytes go with its segment
    conn.execute(f"DELETE FROM blocks WHERE {where}", args)
    return removed


def written_of(conn: sqlite3.Connection, name: str) -> str | None:
    """The fingerprint the segment's writer vouched for at its last indexed append."""
    row = conn.execute("SELECT written FROM segments WHERE name = ?", (name,)).fetchone()
    return None if row is None else row[0]


def segment_names(conn: sqlite3.Connection) -> dict[str, float]:
    """Every indexed segment with its creation time (for reconciliation)."""
    return dict(conn.execute("SELECT name, created FROM segments"))


def _signed(checksum: int) -> int:
    """An unsigned 64-bit checksum as SQLite's signed INTEGER."""
    return checksum - (1 << 64) if checksum >= 1 << 63 else checksum


def _used(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT used FROM totals").fetchone()[0]
