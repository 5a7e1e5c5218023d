"""The rows of the node's metadata store: what a row holds and how an answer fits in it.

One row per object, keyed by a 64-bit hash of (origin, bucket, key) as the
table's rowid: a text primary key would be a second copy of every key in its
index (~100 bytes a row). A hash collision replaces the other key's row, and
every read checks the key it finds: a lost row costs a HEAD, never a wrong
answer. What a row's columns hold (the key, size, ETag, time) is not repeated
in ``info``, which keeps only what differs from the defaults, as compact JSON;
an ETag that is a quoted MD5 is kept as its 16 bytes. ``store.py`` decides
when rows are read and written; this module only says what they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sqlite3
from datetime import UTC, datetime
from typing import Any

from gateway.metadata.snapshot import microseconds, moment
from gateway.origins.base import ObjectInfo

Scope = tuple[str, str]
# info (the rest, compact JSON), stored_at, learned, etag (etag_column), size,
# modified (µs or None)
Row = tuple[str, float, int, str | bytes, int, int | None]

# Rows are keyed by a 64-bit hash of (origin, bucket, key), the table's rowid:
# a text primary key would be a second copy of every key in its index (~100
# bytes a row). A hash collision replaces the other key's row, and every read
# checks the key it finds: a lost row costs a HEAD, never a wrong answer.
# What a row's columns hold (the key, size, ETag, time) is not repeated in
# ``info``, which keeps only what differs from the defaults.
SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    id INTEGER PRIMARY KEY,
    origin TEXT NOT NULL, bucket TEXT NOT NULL, key TEXT NOT NULL,
    info TEXT NOT NULL, stored_at REAL NOT NULL, learned INTEGER NOT NULL,
    etag TEXT NOT NULL, size INTEGER NOT NULL, modified INTEGER
);
CREATE INDEX IF NOT EXISTS objects_age ON objects (stored_at);
"""
COLUMNS = "info, stored_at, learned, etag, size, modified"
THIS_ROW = "id=? AND origin=? AND bucket=? AND key=?"
INSERT = "INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# ObjectInfo's fields kept in ``info`` when not their defaults, by short name.
_FIELDS = {"content_type": "c", "metadata": "m", "headers": "h", "storage_class": "s",
           "version_id": "v"}  # fmt: skip
_DEFAULTS = ObjectInfo("", 0, "", datetime(1970, 1, 1, tzinfo=UTC))
# An ETag that is a quoted MD5 (a single-part upload's, the usual case) is stored as its
# 16 bytes, not 34 characters; any other is stored as it is. A BLOB never reads back as
# text, so rows written before either way decode unchanged.
_MD5_ETAG = re.compile(r'"[0-9a-f]{32}"')


def etag_column(etag: str) -> str | bytes:
    return bytes.fromhex(etag[1:-1]) if _MD5_ETAG.fullmatch(etag) else etag


def etag_text(stored: str | bytes) -> str:
    return f'"{stored.hex()}"' if isinstance(stored, bytes) else stored


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """A stored answer: the object, seconds since it was learned, and the journal
    sequence number read before it was asked (``learned``)."""

    info: ObjectInfo
    age: float
    learned: int


def row_id(scope: Scope, key: str) -> int:
    """The row's id: a signed 64-bit hash of where the key lives and the key."""
    text = "\0".join((*scope, key)).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big", signed=True)


def encode(info: ObjectInfo, stored_at: float, learned: int) -> Row:
    rest = {
        short: getattr(info, name)
        for name, short in _FIELDS.items()
        if getattr(info, name) != getattr(_DEFAULTS, name)
    }
    modified = None
    if info.last_modified.tzinfo is None:
        rest["n"] = info.last_modified.isoformat()  # naive: kept as it came
    else:
        modified = microseconds(info.last_modified)
    info_text = json.dumps(rest, separators=(",", ":"))
    return info_text, stored_at, learned, etag_column(info.etag), info.size, modified


def rows_of(batch: dict[tuple[str, str, str], Row]) -> list[tuple[object, ...]]:
    """``batch``'s rows as ``INSERT`` takes them."""
    return [(row_id(k[:2], k[2]), *k, *row) for k, row in batch.items()]


def select(db: sqlite3.Connection, scope: Scope, key: str) -> Row | None:
    cursor = db.execute(
        f"SELECT {COLUMNS} FROM objects WHERE {THIS_ROW}", (row_id(scope, key), *scope, key)
    )
    row: Row | None = cursor.fetchone()
    return row


def decode(key: str, row: Row) -> ObjectInfo:
    rest: dict[str, Any] = json.loads(row[0])
    fields = {name: rest[short] for name, short in _FIELDS.items() if short in rest}
    modified = row[5]
    when = datetime.fromisoformat(rest["n"]) if modified is None else moment(modified)
    return ObjectInfo(key, row[4], etag_text(row[3]), when, **fields)
