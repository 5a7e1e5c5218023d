"""What a metadata lookup answers, under which policy, and the byte-bounded LRU of listings.

The values ``memory.py`` (the metadata cache) and its callers exchange: a
``Lookup`` (the value and how it was served: hit, miss, stale), the
``Policy`` of a mount (TTLs and how stale an answer may be served), an
``Aged`` answer (from a slower tier, as old as it is), the fetch callables'
shapes; and ``Lru``, the listings' table, evicting the least recently used
beyond a byte limit.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeGuard, TypeVar

from gateway.core.errors import NoSuchKey
from gateway.metadata.heads import Entry
from gateway.origins.base import ListPage, ObjectInfo

log = logging.getLogger("gateway.metadata.memory")  # the cache whose refreshes fail

T = TypeVar("T")
FetchPage = Callable[[str, str, str, int], Awaitable[ListPage]]
FetchHead = Callable[[], Awaitable["ObjectInfo | Aged"]]


@dataclass(frozen=True, slots=True)
class Lookup(Generic[T]):
    value: T
    state: str  # "hit" | "miss" | "stale" (served while revalidating) | "stale_error"


@dataclass(frozen=True, slots=True)
class Policy:
    ttl: float = 60.0  # math.inf allowed
    negative_ttl: float = 10.0
    stale_while_revalidate: float = math.inf  # past expiry: serve stale while one refresh runs
    stale_if_error: float = math.inf  # past expiry: serve stale when the origin errors
    label: str = ""  # the mount these lookups are for, passed to ``on_event`` (metrics)


@dataclass(frozen=True, slots=True)
class Aged:
    """An answer ``age`` seconds old (from the node's store or a listing), not just asked."""

    info: ObjectInfo
    age: float


class Lru:
    """Entries by key, least recently used first, evicted beyond ``limit`` total weight;
    ``on_drop`` hears of every entry that leaves (evicted, replaced or dropped)."""

    def __init__(self, limit: int, on_drop: Callable[[Entry], None] = lambda entry: None) -> None:
        self.entries: OrderedDict[tuple[Any, ...], Entry] = OrderedDict()
        self.limit = limit
        self._on_drop = on_drop
        self.weight = 0  # sum of entry weights
        self.empty = 0  # entries whose value is None

    def get(self, k: tuple[Any, ...]) -> Entry | None:
        entry = self.entries.get(k)
        if entry is not None:
            self.entries.move_to_end(k)
        return entry

    def put(self, k: tuple[Any, ...], entry: Entry) -> int:
        """Store ``entry``; returns how many old entries were evicted for it."""
        self.pop(k)
        self.entries[k] = entry
        self.weight += entry.weight
        self.empty += entry.value is None
        evicted = 0
        while self.weight > self.limit:
            self.pop(next(iter(self.entries)))
            evicted += 1
        return evicted

    def pop(self, k: tuple[Any, ...]) -> None:
        entry = self.entries.pop(k, None)
        if entry is not None:
            self.weight -= entry.weight
            self.empty -= entry.value is None
            self._on_drop(entry)

    def drop_where(self, matches: Callable[[tuple[Any, ...]], bool]) -> None:
        for k in [k for k in self.entries if matches(k)]:
            self.pop(k)


def usable(entry: Entry | None, now: float, grace: float) -> TypeGuard[Entry]:
    """Whether ``entry`` holds a value that may be served ``grace`` seconds past expiry."""
    return entry is not None and entry.value is not None and now < entry.fresh_until + grace


def directory_of(key: str) -> str:
    """Everything up to the last ``/`` of ``key`` ("" at the top)."""
    return key[: key.rfind("/") + 1]


def covering(prefix: str) -> Iterator[str]:
    """``prefix``, then its ancestors at ``/`` boundaries, longest first, then ``""``."""
    yield prefix
    end = len(prefix)
    while (i := prefix.rfind("/", 0, end)) >= 0:
        if i + 1 < len(prefix):
            yield prefix[: i + 1]
        end = i
    if prefix:
        yield ""


# Lookup outcome -> stats() counter; a negative hit is a hit ("evicted" is no lookup).
COUNTERS = dict(
    hit="hits", negative="hits", miss="misses", stale="stale", stale_error="stale_error"
)


def log_refresh_failure(fk: tuple[str, Any], task: asyncio.Future[Any]) -> None:
    """A background refresh's failure: the stale entry stays (NoSuchKey is stored)."""
    exc = None if task.cancelled() else task.exception()
    if exc is not None and not isinstance(exc, NoSuchKey):
        log.warning("metadata refresh of %s %r failed, stale entry kept: %r", *fk, exc)
