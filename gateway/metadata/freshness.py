"""Serving a cached answer by its age, and one flight per key for what must be fetched.

``MetadataCache`` (``memory.py``) holds heads and listings. How an entry it
holds is served does not depend on which of the two it is, so that lives
here, in the class the cache is built on:

  * fresh (``hit``): served as it is;
  * past its TTL but within ``stale_while_revalidate`` (``stale``): served at
    once while exactly one background refresh runs, whose failure is logged
    and leaves the entry in place;
  * otherwise (``miss``): the caller joins the key's flight, or starts it;
  * a miss whose fetch fails with ``OriginUnavailable`` is answered with an
    entry still within ``stale_if_error`` (``stale_error``) if one is held by
    then (an invalidation may have dropped it meanwhile: ``_entry`` asks).

Every fetch runs as one flight per cache key (``singleflight.Group``), owned
by the group rather than by the caller that started it, so it lands even if
every caller gave up; a refresh is a flight too, so a refresh and a miss
never both run for a key. A whole listing's flight may answer a caller early,
with the page its walk so far settles (``walk.py``).

Each outcome is counted (the cache's ``stats``, ``lookups.COUNTERS``) and told
to ``on_event`` (metrics) once per lookup; a too-big verdict (a None value)
is no answer and is not counted.

Not thread-safe: one event loop owns it, as it owns the cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from gateway.cache.singleflight import Group
from gateway.core.errors import OriginUnavailable
from gateway.metadata import lookups
from gateway.metadata.heads import Entry
from gateway.metadata.lookups import Lookup, Policy
from gateway.metadata.snapshot import SnapshotBuilder
from gateway.metadata.walk import Early, Walk

T = TypeVar("T")
Load = Callable[..., Awaitable[Any]]


class Freshness:
    """Lookups of a cache of aged entries: served by age, fetched in one flight per key.

    A subclass holds the entries, stores what its loads fetch, and says which
    entry is held at a key now (``_entry``).
    """

    def __init__(
        self, clock: Callable[[], float], on_event: Callable[[str, str, str, int], None] | None
    ) -> None:
        self._clock = clock
        self._on_event = on_event
        self._flights: Group[tuple[str, tuple[Any, ...]], Any] = Group()
        self._walks: dict[tuple[str, Any], Walk] = {}  # whole listings being walked, by flight
        self._counts = dict.fromkeys(("hits", "misses", "stale", "stale_error"), 0)

    def _entry(self, kind: str, k: tuple[Any, ...]) -> Entry | None:
        """The entry held at ``k`` now (``kind``: "head" or "list")."""
        raise NotImplementedError

    async def _lookup(
        self,
        tag: str,
        k: tuple[Any, ...],
        load: Load,
        policy: Policy,
        entry: Entry | None,
        early: Early | None = None,
    ) -> Lookup[Any]:
        """Serve ``entry`` (the one at ``k``, looked up by the caller) if fresh (``hit``)
        or revalidating (``stale``, starting one refresh), else join or start the
        flight for it (``miss``; see ``_join`` for ``early``), falling back on an
        origin failure to a stale entry still young enough."""
        kind = "head" if tag == "head" else "list"
        held = self._held(tag, k, load, policy, entry)
        if held is not None:
            return held
        try:
            loaded = await self._join((tag, k), load, early)
            return self._served(kind, loaded, "miss", policy.label)
        except OriginUnavailable:
            # Again: invalidation may have dropped it meanwhile.
            entry = self._entry(kind, k)
            if lookups.usable(entry, self._clock(), policy.stale_if_error):
                return self._served(kind, entry.value, "stale_error", policy.label)
            self._count(kind, "miss", policy.label)
            raise
        except Exception:
            self._count(kind, "miss", policy.label)
            raise

    def _held(
        self, tag: str, k: tuple[Any, ...], load: Load, policy: Policy, entry: Entry | None
    ) -> Lookup[Any] | None:
        """``entry`` served without waiting if fresh (``hit``) or revalidating (``stale``,
        starting one refresh); None if only a flight can answer."""
        kind = "head" if tag == "head" else "list"
        now = self._clock()
        if entry is not None and now < entry.fresh_until:
            return self._served(kind, entry.value, "hit", policy.label)
        if lookups.usable(entry, now, policy.stale_while_revalidate):
            if (tag, k) not in self._flights:  # exactly one refresh; nobody awaits it
                self._flights.start((tag, k), load).add_done_callback(
                    partial(lookups.log_refresh_failure, (tag, k))
                )
            return self._served(kind, entry.value, "stale", policy.label)
        return None

    async def _join(self, fk: tuple[str, Any], load: Load, early: Early | None) -> Any:
        """The flight's answer; with ``early``, a whole listing's walk is watched as it
        grows, and the page ``early`` finds settled by the origin pages so far is
        answered at once (the walk goes on for everyone else; why this is sound:
        ``walk.py``). A write during the walk detaches it, as it would the whole
        answer: its waiters still get what it read."""
        if early is not None and fk not in self._flights:
            walk = self._walks[fk] = Walk(SnapshotBuilder(fk[1][1]))
            load = partial(load, walk=walk)
        task = self._flights.start(fk, load)
        watched = self._walks.get(fk) if early is not None else None
        while watched is not None and not task.done():
            page = early(watched.builder)  # type: ignore[misc]
            if page is not None:
                return page
            await asyncio.wait([task, watched.growth], return_when=asyncio.FIRST_COMPLETED)
        return await asyncio.shield(task)

    def _count(self, kind: str, state: str, label: str = "", times: int = 1) -> None:
        if state in lookups.COUNTERS:
            self._counts[lookups.COUNTERS[state]] += times
        if self._on_event is not None:
            self._on_event(kind, state, label, times)

    def _served(self, kind: str, value: T, state: str, label: str) -> Lookup[T]:
        # None is a too-big verdict, not an answer: the page lookup after it counts.
        if value is not None:
            self._count(kind, state, label)
        return Lookup(value, state)
