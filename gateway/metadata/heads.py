"""HEAD answers in memory, packed, least recently used first, bounded in bytes.

A training set of millions of small objects needs millions of HEAD answers
held, and as ``ObjectInfo`` dataclasses each costs ~870 bytes (the object,
its key, ETag, content-type and size objects, a datetime, two empty dicts, a
cache entry and a tuple key: measured with ``python -m loadtest.metamem``).
Almost every object of such a set looks the same but for its key, ETag, size
and time, so a common answer is packed into one ``bytes`` record:

  fresh_until, learned (doubles), size, last-modified in microseconds
  (int64), an index into the table's interned (content type, storage class)
  pairs, and the ETag's 16 bytes (``snapshot.pack_etag``),

keyed by one string, the scope's short id and the key (~214 bytes an
object in all, ~4x less). Unpacking builds a new ``ObjectInfo``, a few
microseconds, so the last ``_DECODED`` answers unpacked are kept by record:
a hot key is unpacked once, a key read once an epoch once an epoch.
An answer that does not pack (user metadata, stored headers, a version id, a
multipart or otherwise odd ETag, a naive time) is kept as it is, weighed as
such. A negative entry (the origin said NoSuchKey) packs too, unless its 404
carried headers to repeat (a delete marker's).

Recency is the dict's own order: a hit moves its key to the end (pop and
insert), and eviction takes from the front. Weights are estimates of the
bytes each entry holds (the record, its key string, a dict slot), kept as a
running sum; ``python -m loadtest.metamem`` checks them against tracemalloc.

NOT guaranteed: interned (content type, storage class) pairs are never
forgotten; past ``_MAX_INTERNED`` distinct pairs, answers are kept unpacked.
Not thread-safe.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from gateway.metadata.snapshot import microseconds, moment, pack_etag, unpack_etag
from gateway.origins.base import ObjectInfo

_RECORD = struct.Struct("<ddqqI16s")
_NEGATIVE = 0xFFFFFFFF  # the interned index of a negative entry
_MAX_INTERNED = 65_536
_DECODED = 1024
_SLOT = 48  # a dict slot (hash, key, value) and its share of the index, per entry
_UNPACKED = 700  # an ObjectInfo, its strings, datetime and dicts, beyond the headers' text


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
        self.weight = 0
        self.empty = 0  # negative entries held
        self._records: dict[str, bytes | Entry] = {}
        self._scopes: dict[Hashable, str] = {}  # scope -> short id, the key's first part
        self._interned: dict[tuple[str, str], int] = {}
        self._pairs: list[tuple[str, str]] = []
        # The last _DECODED answers decoded, by record: a hot key is decoded once.
        self._decoded: dict[bytes, Entry] = {}

    def __len__(self) -> int:
        return len(self._records)

    def get(self, scope: Hashable, key: str) -> Entry | None:
        """The entry of ``key``, marked most recently used."""
        k = self._key(scope, key)
        record = self._records.pop(k, None)
        if record is None:
            return None
        self._records[k] = record
        return self._decode(key, record)

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
        self.weight += self._weigh(k, record)
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
        if record is not None:
            self.weight -= self._weigh(k, record)
            self.empty -= _is_negative(record)

    def _encode(self, key: str, entry: Entry) -> bytes | Entry:
        info = entry.value
        if info is None and entry.absent:
            return entry  # a delete marker's 404 keeps its headers: not packed
        if info is None:
            return _RECORD.pack(entry.fresh_until, entry.learned, 0, 0, _NEGATIVE, bytes(16))
        etag = pack_etag(info.etag)
        pair = self._intern(info.content_type, info.storage_class)
        if (
            etag is None
            or pair is None
            or info.key != key
            or info.metadata
            or info.headers
            or info.version_id is not None
            or info.last_modified.tzinfo is None
        ):
            return entry
        us = microseconds(info.last_modified)
        return _RECORD.pack(entry.fresh_until, entry.learned, info.size, us, pair, etag)

    def _decode(self, key: str, record: bytes | Entry) -> Entry:
        if isinstance(record, Entry):
            return record
        entry = self._decoded.get(record)
        if entry is None or entry.value is None or entry.value.key != key:
            entry = self._decoded[record] = self._unpack(key, record)
            if len(self._decoded) > _DECODED:
                del self._decoded[next(iter(self._decoded))]
        return entry

    def _unpack(self, key: str, record: bytes) -> Entry:
        fresh_until, learned, size, us, pair, etag = _RECORD.unpack(record)
        if pair == _NEGATIVE:
            return Entry(None, fresh_until, 0, learned)
        content_type, storage_class = self._pairs[pair]
        info = ObjectInfo(key, size, unpack_etag(etag), moment(us), content_type,
                          storage_class=storage_class)  # fmt: skip
        return Entry(info, fresh_until, 0, learned)

    def _intern(self, content_type: str, storage_class: str) -> int | None:
        pair = (content_type, storage_class)
        index = self._interned.get(pair)
        if index is None and len(self._pairs) < _MAX_INTERNED:
            index = self._interned[pair] = len(self._pairs)
            self._pairs.append((sys.intern(content_type), sys.intern(storage_class)))
        return index

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


def _is_negative(record: bytes | Entry) -> bool:
    if isinstance(record, Entry):
        return record.value is None
    return _RECORD.unpack_from(record)[4] == _NEGATIVE
