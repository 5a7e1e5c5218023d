"""HEAD answers in memory, packed, least recently used first, bounded in bytes.

A training set of millions of small objects needs millions of HEAD answers
held, and as ``ObjectInfo`` dataclasses each costs ~870 bytes (the object,
its key, ETag, content-type and size objects, a datetime, two empty dicts, a
cache entry and a tuple key: measured with ``python -m loadtest.metamem``).
Almost every object of such a set looks the same but for its key, ETag, size
and time, so a common answer is packed into one ``bytes`` record:

  fresh_until, learned (doubles), size, last-modified in microseconds
  (int64), the number of the answer's *shape* (``shapes.py``: content type,
  storage class, stored headers, user metadata, interned once for all the
  objects that share them), the ETag's 16 bytes (``snapshot.pack_etag``),
  then the object's own tail: its checksums, decoded (5 bytes for a CRC32),
  and its version id, if any,

keyed by one string, the scope's short id and the key (~214 bytes an
object in all, ~4x less; ~225 with a CRC32 and SSE headers, not ~1 KB). Unpacking builds a new ``ObjectInfo``, a few
microseconds, so the last ``_DECODED`` answers unpacked are kept by record:
a hot key is unpacked once, a key read once an epoch once an epoch.
An answer that does not pack (a multipart or otherwise odd ETag, a naive
time, a checksum value of 128 bytes or more) is kept as it is, weighed as
such. A negative entry (the origin said NoSuchKey) packs too, unless its 404
carried headers to repeat (a delete marker's).

Recency is the dict's own order: a hit moves its key to the end (pop and
insert), and eviction takes from the front. Weights are estimates of the
bytes each entry holds (the record, its key string, a dict slot), kept as a
running sum; ``python -m loadtest.metamem`` checks them against tracemalloc.

Shapes are counted by use and forgotten with their last record, their bytes
counted in the table's weight while held, so headers that differ per object
(a per-object metadata value) cost a shape each but never outlive it.

NOT guaranteed: not thread-safe.
"""

from __future__ import annotations

import struct
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.metadata import shapes
from gateway.metadata.snapshot import microseconds, moment, pack_etag, unpack_etag
from gateway.origins.base import ObjectInfo

_RECORD = struct.Struct("<ddqqI16s")
_NEGATIVE = 0xFFFFFFFF  # the shape number of a negative entry
_DECODED = 1024
_SLOT = 48  # a dict slot (hash, key, value) and its share of the index, per entry
_UNPACKED = 700  # an ObjectInfo, its strings, datetime and dicts, beyond the headers' text


class Mark(NamedTuple):
    """A stored record, the very object, and its key in the table (``HeadTable.record``)."""

    at: str
    record: bytes | Entry


@dataclass(slots=True)
class Entry:
    """One cached answer; ``value`` None: a negative head (or a too-big listing)."""

    value: Any  # ObjectInfo | Snapshot | ListPage | None
    fresh_until: float
    weight: int = 1  # bytes held
    learned: float = 0.0  # the clock when the answer was asked of the origin
    absent: dict[str, str] | None = None  # a negative head: what the origin's 404 said


class HeadTable:
    """Heads per (scope, key): packed records, LRU, at most ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.records_weight = 0  # the records', keys' and slots' bytes; shapes apart
        self.empty = 0  # negative entries held
        self._records: dict[str, bytes | Entry] = {}
        self._scopes: dict[Hashable, str] = {}  # scope -> short id, the key's first part
        self._shapes = shapes.Shapes()
        # The last _DECODED answers decoded, by record: a hot key is decoded once.
        self._decoded: OrderedDict[bytes, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    @property
    def weight(self) -> int:
        """Bytes held: records and the shapes they use."""
        return self.records_weight + self._shapes.weight

    def get(self, scope: Hashable, key: str) -> Entry | None:
        """The entry of ``key``, marked most recently used."""
        k = self._key(scope, key)
        record = self._records.pop(k, None)
        if record is None:
            return None
        self._records[k] = record
        return self._decode(key, record)

    def touch(self, scope: Hashable, key: str) -> None:
        """Mark ``key`` most recently used (``get`` without the decoding)."""
        k = self._key(scope, key)
        record = self._records.pop(k, None)
        if record is not None:
            self._records[k] = record

    def record(self, scope: Hashable, key: str) -> Mark | None:
        """What is stored for ``key`` as it is stored, and where (a ticket's mark:
        ``read/tickets.py``): any change to the entry stores another object."""
        at = self._key(scope, key)
        record = self._records.get(at)
        return None if record is None else Mark(at, record)

    def touch_if(self, mark: Mark) -> bool:
        """``touch`` if ``mark``'s record (the very object) is still what is stored."""
        at, record = mark
        records = self._records
        if records.get(at) is not record:
            return False
        del records[at]
        records[at] = record
        return True

    def peek(self, scope: Hashable, key: str) -> Entry | None:
        """The entry of ``key``, recency unchanged."""
        record = self._records.get(self._key(scope, key))
        return None if record is None else self._decode(key, record)

    def put(self, scope: Hashable, key: str, entry: Entry) -> int:
        """Store ``entry``; returns how many old entries were evicted for it."""
        k = self._key(scope, key)
        self._pop(k)
        record = self._encode(key, entry)
        self._records[k] = record
        self.records_weight += self._weigh(k, record)
        self.empty += entry.value is None
        evicted = 0
        while self.weight > self.limit and len(self._records) > 1:
            self._pop(next(iter(self._records)))
            evicted += 1
        return evicted

    def pop(self, scope: Hashable, key: str) -> None:
        self._pop(self._key(scope, key))

    def drop_where(self, matches: Callable[[Hashable, str], bool]) -> None:
        """Drop every entry whose (scope, key) ``matches``."""
        for k, (scope, key) in list(self._named()):
            if matches(scope, key):
                self._pop(k)

    def held(self) -> Iterator[tuple[Hashable, str]]:
        """(scope, key) of every entry, least recently used first."""
        for _, named in self._named():
            yield named

    # --- records -------------------------------------------------------------

    def _key(self, scope: Hashable, key: str) -> str:
        sid = self._scopes.get(scope)
        if sid is None:
            sid = self._scopes[scope] = f"{len(self._scopes):x}\0"
        return sid + key

    def _named(self) -> Iterator[tuple[str, tuple[Hashable, str]]]:
        scopes = {sid: scope for scope, sid in self._scopes.items()}
        for k in self._records:
            sid, key = k.split("\0", 1)
            yield k, (scopes[sid + "\0"], key)

    def _pop(self, k: str) -> None:
        record = self._records.pop(k, None)
        if record is None:
            return
        self.records_weight -= self._weigh(k, record)
        if isinstance(record, Entry):
            self.empty -= record.value is None
            return
        number = _RECORD.unpack_from(record)[4]
        if number == _NEGATIVE:
            self.empty -= 1
        else:
            self._shapes.release(number)

    def _encode(self, key: str, entry: Entry) -> bytes | Entry:
        info = entry.value
        if info is None and entry.absent:
            return entry  # a delete marker's 404 keeps its headers: not packed
        if info is None:
            return _RECORD.pack(entry.fresh_until, entry.learned, 0, 0, _NEGATIVE, bytes(16))
        etag = pack_etag(info.etag)
        split = shapes.split(info)
        if etag is None or split is None or info.key != key or info.last_modified.tzinfo is None:
            return entry
        number = self._shapes.use(split[0])
        if number is None:
            return entry
        us = microseconds(info.last_modified)
        fixed = _RECORD.pack(entry.fresh_until, entry.learned, info.size, us, number, etag)
        return fixed + split[1]

    def _decode(self, key: str, record: bytes | Entry) -> Entry:
        if isinstance(record, Entry):
            return record
        entry = self._decoded.get(record)
        if entry is None or entry.value is None or entry.value.key != key:
            entry = self._decoded[record] = self._unpack(key, record)
            if len(self._decoded) > _DECODED:
                self._decoded.popitem(last=False)
        return entry

    def _unpack(self, key: str, record: bytes) -> Entry:
        fresh_until, learned, size, us, number, etag = _RECORD.unpack_from(record)
        if number == _NEGATIVE:
            return Entry(None, fresh_until, 0, learned)
        shape = self._shapes[number]
        headers, metadata, version_id = shapes.join(shape, record[_RECORD.size :])
        info = ObjectInfo(key, size, unpack_etag(etag), moment(us), shape.content_type,
                          metadata, headers, shape.storage_class, version_id)  # fmt: skip
        return Entry(info, fresh_until, 0, learned)

    @staticmethod
    def _weigh(k: str, record: bytes | Entry) -> int:
        held = sys.getsizeof(k) + _SLOT
        if isinstance(record, bytes):
            return held + sys.getsizeof(record)
        info: ObjectInfo | None = record.value
        text = (
            0
            if info is None
            else sum(
                len(name) + len(value)
                for name, value in (*info.metadata.items(), *info.headers.items())
            )
        )
        return held + _UNPACKED + 2 * len(k) + 2 * text
