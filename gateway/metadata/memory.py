"""The metadata cache: HEAD answers and listings, so LIST/HEAD storms stop here.

A thousand data-loader workers start at once and each HEADs and LISTs the same
prefixes; the origin should see one request. This module keeps what the origin
said, for how long, and makes concurrent askers share one origin call.

What is cached
  * ``head``: an object's :class:`ObjectInfo` per (scope, key), or a *negative*
    entry when the origin said NoSuchKey (with the headers of its 404, so a delete
    marker is still named as one). ``put_head`` stores what a GET taught.
  * ``listing``: on a miss, the *whole* listing of the prefix, walked flat (no
    delimiter) in origin pages of 1000 and kept as one sorted list. Why whole:
    workers page differently (delimiter or not, page sizes, resuming after any
    marker), so caching pages by their parameters would still send most of them
    to the origin; with the whole list every page is a local :func:`paginate`,
    identical to the origin's. A whole listing also answers longer prefixes
    under it (looked up at ``/`` boundaries). A cold lister does not wait for
    the whole walk: a page that the origin pages so far already settle is
    answered at once, while the walk goes on (``metadata/walk.py``). A prefix with more than
    ``whole_listing_limit`` keys is recognised after ``limit / 1000 + 1`` pages,
    remembered as *too big* for a TTL, and its pages are cached one by one,
    keyed by all four parameters.
  ``scope`` names the store (say (origin, bucket)); keys and prefixes are in the
  terms of the ``fetch`` callables passed with them.

Time
  An entry is fresh for ``Policy.ttl`` after it was *learned*: when the origin
  request that taught it began (``math.inf``: an immutable dataset never
  revalidates). A ``fetch`` that answers from a slower tier (the node's store,
  a listing) returns ``Aged(info, age)``, and the entry is as old as that
  answer: no tier restarts the clock, so what is served is never more than
  ``ttl`` old while fresh. Past that it is *stale*:
    * stale-while-revalidate: up to ``stale_while_revalidate`` past expiry it is
      served at once (``"stale"``) while exactly one background refresh runs;
      callers after it lands see the new value. A failed refresh is logged and
      leaves the stale entry in place. A covering listing is refreshed whole.
    * stale-if-error: when a foreground fetch fails with ``OriginUnavailable``
      (``OriginThrottled`` included), an entry up to ``stale_if_error`` past
      expiry is served (``"stale_error"``); with none, the error is raised.
  Negative entries live ``negative_ttl`` and are never served stale: a key that
  appears at the origin should be seen promptly, and a "no" is cheap to re-ask.

Coalescing
  Every origin call runs as one flight per cache key (``singleflight.Group``)
  that stores its own result, so it lands even if every caller gave up; the
  first caller's ``fetch`` and ``policy`` serve the whole flight. A refresh is
  a flight too, so a refresh and a miss never both run for a key. Serving by
  age and the flights are the class this cache is built on (``freshness.py``);
  this module holds the tables and what a flight stores in them.

Writes through Hoard call ``invalidate_key``: the key's entry and every listing
whose prefix contains it are dropped, and flights for them are *detached*: they
still answer their waiters but no longer store, so a fetch that began before
the write cannot put the old answer back. Invalidation scans the tables, which
is fine for the rare writes of a training workload.

Memory is bounded in bytes, least recently used evicted first: heads up to
``head_bytes`` (packed records, ``metadata/heads.py``), listings up to
``listing_bytes`` (whole ones as columnar snapshots, ``metadata/snapshot.py``;
pages as they came). A prefix is held whole while its snapshot stays within
``whole_listing_bytes``: the limit is memory, not a key count, so with the
defaults a prefix of a few million keys is one snapshot. A walk stops as soon
as the snapshot would outgrow it, having held no more, and the prefix is then
cached page by page (counted as a ``too_big`` lookup). An eighth of
``listing_bytes`` (``page_body_bytes``) holds rendered pages: ``listing_body``
renders a page of a whole listing once per snapshot and query and serves the
same bytes after (``metadata/bodies.py``), dropped with their snapshot.

NOT guaranteed: writes that bypass Hoard show up only after the TTL (never, with
``forever``). The cache is per process, not shared between workers or nodes.
Not thread-safe: use it from one event loop only.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

from gateway.core.errors import NoSuchKey
from gateway.metadata import lookups
from gateway.metadata.bodies import PageBodies
from gateway.metadata.freshness import Freshness
from gateway.metadata.heads import Entry, HeadTable, Mark
from gateway.metadata.lookups import Aged, FetchHead, FetchPage, Lookup, Lru, Policy
from gateway.metadata.snapshot import Snapshot, SnapshotBuilder
from gateway.metadata.walk import Walk, settled_page
from gateway.origins.base import ListPage, ObjectInfo
from gateway.origins.listing import paginate

ORIGIN_PAGE = 1000  # keys per origin page while walking a whole listing: S3's maximum
_PAGE_ENTRY_BYTES = 330  # a ListEntry in a cached page, its strings and datetime


class MetadataCache(Freshness):
    """HEAD and LIST answers per scope, with TTLs, SWR/SIE and coalesced misses."""

    def __init__(
        self,
        *,
        head_bytes: int = 512 << 20,
        listing_bytes: int = 512 << 20,
        whole_listing_bytes: int | None = None,
        page_body_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str, str, str, int], None] | None = None,
    ) -> None:
        """``page_body_bytes``: the part of ``listing_bytes`` for rendered pages
        (default an eighth); ``whole_listing_bytes``: the largest snapshot of one
        prefix (default: all the rest of ``listing_bytes``)."""
        bodies = listing_bytes // 8 if page_body_bytes is None else page_body_bytes
        self._whole_limit = min(
            listing_bytes - bodies,
            listing_bytes if whole_listing_bytes is None else whole_listing_bytes,
        )
        super().__init__(clock, on_event)  # serving by age, flights, counts (freshness.py)
        self._heads = HeadTable(head_bytes)
        self._bodies = PageBodies(bodies)
        self._versions = itertools.count(1)  # of snapshots: what their bodies are keyed by
        # Keyed (scope, prefix) for whole listings and too-big markers,
        # (scope, prefix, delimiter, start_after, max_keys) for pages.
        self._lists = Lru(listing_bytes - bodies, self._dropped)

    async def head(
        self, scope: Hashable, key: str, policy: Policy, fetch: FetchHead
    ) -> Lookup[ObjectInfo]:
        """The metadata of ``key``, from the cache or one coalesced ``fetch()``.

        :raises NoSuchKey: the origin said so, now or within ``negative_ttl``.
        :raises HoardError: the fetch's error when no stale entry may be served.
        """
        k = (scope, key)
        entry = self._heads.get(scope, key)
        if entry is not None and entry.value is None and self._clock() < entry.fresh_until:
            self._count("head", "negative", policy.label)
            raise NoSuchKey(key, entry.absent)
        load = partial(self._load_head, k, policy, fetch)
        return await self._lookup("head", k, load, policy, entry)

    def head_held(
        self, scope: Hashable, key: str, policy: Policy, fetch: FetchHead,
        entry: Entry | None = None,
    ) -> ObjectInfo | None:  # fmt: skip
        """``head`` when the answer is held (fresh, or stale and refreshed meanwhile by
        ``fetch``), counted as ``head`` counts it; None when only a flight can tell.
        ``entry``: ``known_entry``'s answer for ``key`` in this same turn of the loop
        (nothing awaited since): only marked recently used, not looked up again."""
        if entry is None:
            entry = self._heads.get(scope, key)
        else:
            self._heads.touch(scope, key)
        if entry is None or entry.value is None:
            return None
        if self._clock() < entry.fresh_until:  # ``_held``'s first case, without its Lookup
            self._count("head", "hit", policy.label)
            return entry.value
        k = (scope, key)
        held = self._held("head", k, partial(self._load_head, k, policy, fetch), policy, entry)
        return None if held is None else held.value

    def record(self, scope: Hashable, key: str) -> Mark | None:
        """The stored form of ``key``'s head, as a mark of that very answer (``still_held``)."""
        return self._heads.record(scope, key)

    def still_held(self, mark: Mark, fresh_until: float) -> bool:
        """Whether ``mark``'s answer is still its key's and fresh: if so it is marked
        recently used, as ``head_held`` marks it (``count_head_hit`` counts it)."""
        return self._clock() < fresh_until and self._heads.touch_if(mark)

    def count_head_hit(self, label: str, times: int = 1) -> None:
        """Count ``times`` heads answered from memory (a ticket's uses), as ``head_held``
        counts each."""
        self._count("head", "hit", label, times)

    def known(self, scope: Hashable, key: str) -> tuple[ObjectInfo, float] | None:
        """The held metadata of ``key``, fresh or stale, and when it was learned."""
        entry = self.known_entry(scope, key)
        return None if entry is None else (entry.value, entry.learned)

    def known_entry(self, scope: Hashable, key: str) -> Entry | None:
        """``known``'s entry itself (for ``head_held``); a look, recency unchanged."""
        entry = self._heads.peek(scope, key)
        return None if entry is None or entry.value is None else entry

    def now(self) -> float:
        """This cache's clock (``learned`` times are on it)."""
        return self._clock()

    async def whole_listing(
        self, scope: Hashable, prefix: str, since: float, policy: Policy, fetch_page: FetchPage
    ) -> tuple[Snapshot, float] | None:
        """The whole listing covering ``prefix``, learned at ``since`` or later, and
        when it was learned; ``None`` if the prefix is too big to hold whole.

        A cached one that is older is not served stale (as ``listing`` would):
        the caller must know what the origin held after ``since``. Concurrent
        callers share one walk.
        """
        for _ in range(2):  # a flight that began before ``since`` is joined, then one more
            k = self._find_whole(scope, prefix) or (scope, prefix)
            entry = self._lists.get(k)
            if entry is not None and entry.learned >= since:
                return None if entry.value is None else (entry.value, entry.learned)
            load = partial(self._load_whole, (scope, prefix), policy, fetch_page)
            await self._flights.do(("list", (scope, prefix)), load)
        entry = self._lists.get((scope, prefix))
        if entry is None or entry.value is None:
            return None
        return entry.value, entry.learned

    def listed(self, scope: Hashable, key: str) -> tuple[Snapshot, float] | None:
        """The nearest whole listing held whose prefix covers ``key``, fresh or not, and
        when it was learned; None if none is held. A look, not a use: nothing is
        counted and the listing keeps its place in the LRU."""
        found = self._find_whole(scope, lookups.directory_of(key))
        if found is None:
            return None
        entry = self._lists.entries[found]
        return entry.value, entry.learned

    def put_head(
        self, scope: Hashable, key: str, info: ObjectInfo, policy: Policy, age: float = 0.0
    ) -> None:
        """Remember ``info`` (a GET response carried it, or the node's store held it
        ``age`` seconds old) as fresh for what is left of ``policy.ttl``."""
        self._flights.detach(("head", (scope, key)))  # a HEAD under way may be older
        self._store("head", (scope, key), info, policy.ttl, learned=self._clock() - age)

    def holds(self, scope: Hashable, key: str) -> bool:
        """Whether anything is held of ``key``: an answer, fresh or stale, or a 404."""
        return self._heads.peek(scope, key) is not None

    async def listing(
        self,
        scope: Hashable,
        prefix: str,
        delimiter: str,
        start_after: str,
        max_keys: int,
        policy: Policy,
        fetch_page: FetchPage,
    ) -> Lookup[ListPage]:
        """One page, as the origin would list it; ``fetch_page(prefix, delimiter,
        start_after, max_keys)`` asks the origin.

        :raises HoardError: the fetch's error when no stale listing may be served.
        """
        found = await self._whole_or_page(scope, prefix, delimiter, start_after, max_keys,
                                          policy, fetch_page)  # fmt: skip
        if isinstance(found.value, Snapshot):
            page = paginate(found.value, prefix, delimiter, start_after, max_keys)
            return Lookup(page, found.state)
        return found

    async def listing_body(
        self,
        scope: Hashable,
        query: tuple[str, str, str, int],
        policy: Policy,
        fetch_page: FetchPage,
        render: Callable[[ListPage], bytes],
        variant: Hashable,
    ) -> Lookup[bytes]:
        """``listing``'s page of ``query`` (prefix, delimiter, start_after, max_keys) as
        ``render`` makes it into bytes; from a whole listing, rendered once per snapshot
        and ``variant`` (whatever else the bytes depend on) and kept (``bodies.py``)."""
        found = await self._whole_or_page(scope, *query, policy, fetch_page)
        if not isinstance(found.value, Snapshot):
            return Lookup(render(found.value), found.state)
        version = found.value.version
        body = self._bodies.get(version, (query, variant))
        if self._on_event is not None:
            self._on_event("page", "miss" if body is None else "hit", policy.label, 1)
        if body is None:
            body = render(paginate(found.value, *query))
            self._bodies.put(version, (query, variant), body)
        return Lookup(body, found.state)

    async def _whole_or_page(
        self,
        scope: Hashable,
        prefix: str,
        delimiter: str,
        start_after: str,
        max_keys: int,
        policy: Policy,
        fetch_page: FetchPage,
    ) -> Lookup[Snapshot | ListPage]:
        """The whole listing covering ``prefix`` if one may be held, else the page."""
        # The nearest cached whole listing covering the prefix, else the prefix's own
        # (a fresh too-big marker there answers None, as does a walk that finds it so).
        k = self._find_whole(scope, prefix) or (scope, prefix)
        load = partial(self._load_whole, k, policy, fetch_page)
        early = partial(settled_page, (prefix, delimiter, start_after, max_keys))
        whole = await self._lookup("list", k, load, policy, self._lists.get(k), early)
        if whole.value is not None:
            return whole  # a snapshot, or a page the walk so far settled
        k = (scope, prefix, delimiter, start_after, max_keys)
        load = partial(self._load_page, k, policy, fetch_page)
        return await self._lookup("page", k, load, policy, self._lists.get(k))

    def invalidate_key(self, scope: Hashable, key: str) -> None:
        """Drop ``key``'s head entry and every listing that could contain it."""
        self._heads.pop(scope, key)  # not a scan of millions of heads per write
        self._drop_where(
            lambda k: k == (scope, key),
            lambda k: k[0] == scope and key.startswith(k[1]),
            scan_heads=False,
        )

    def invalidate_prefix(self, scope: Hashable, prefix: str) -> None:
        """Drop every head under ``prefix`` and every listing overlapping it."""
        self._drop_where(
            lambda k: k[0] == scope and k[1].startswith(prefix),
            lambda k: k[0] == scope and (k[1].startswith(prefix) or prefix.startswith(k[1])),
        )

    def clear(self) -> None:
        """Forget every entry; running flights finish but no longer store."""
        self._drop_where(lambda k: True, lambda k: True)

    def stats(self) -> dict[str, int]:
        """Entries held (``heads``: positive ones; ``listings``: whole or page) and
        lookups by outcome (a negative hit is a hit)."""
        heads, lists = self._heads, self._lists
        return {
            "heads": len(heads) - heads.empty,
            "negative": heads.empty,
            "listings": len(lists.entries) - lists.empty,
            "head_bytes": heads.weight,
            "listing_bytes": lists.weight,
            "page_bodies": len(self._bodies),
            "page_body_bytes": self._bodies.weight,
            **self._counts,
        }

    async def aclose(self) -> None:
        """Cancel running fetches and refreshes (server shutdown)."""
        await self._flights.aclose()

    # --- loading: one flight per key, storing its own result ---------------------

    async def _load_head(
        self, k: tuple[Hashable, str], policy: Policy, fetch: FetchHead
    ) -> ObjectInfo:
        learned = self._clock()
        try:
            answer = await fetch()
        except NoSuchKey as exc:
            if self._flights.owns(("head", k)):
                self._store("head", k, None, policy.negative_ttl, learned=learned - exc.age,
                            absent=exc.headers)  # fmt: skip
            raise
        if isinstance(answer, Aged):
            answer, learned = answer.info, self._clock() - answer.age
        if self._flights.owns(("head", k)):
            self._store("head", k, answer, policy.ttl, learned=learned)
        return answer

    async def _load_whole(
        self,
        k: tuple[Hashable, str],
        policy: Policy,
        fetch_page: FetchPage,
        walk: Walk | None = None,
    ) -> Snapshot | None:
        # Flat pages in order, into columns; trusted sorted, as paginate() trusts them.
        # ``walk``: where callers waiting for this walk see it grow (``_join``).
        learned = self._clock()
        walk = walk or Walk(SnapshotBuilder(k[1]))
        try:
            return await self._walk_whole(k, policy, fetch_page, walk, learned)
        finally:
            walk.grown()
            if self._walks.get(("list", k)) is walk:
                del self._walks[("list", k)]

    async def _walk_whole(
        self,
        k: tuple[Hashable, str],
        policy: Policy,
        fetch_page: FetchPage,
        walk: Walk,
        learned: float,
    ) -> Snapshot | None:
        builder = walk.builder
        marker = ""
        while builder.nbytes <= self._whole_limit:
            page = await fetch_page(k[1], "", marker, ORIGIN_PAGE)
            builder.add(page.entries)
            walk.grown()
            if not page.is_truncated or not page.next_marker:
                snapshot = builder.build(next(self._versions))
                if self._flights.owns(("list", k)):
                    self._store("list", k, snapshot, policy.ttl, snapshot.nbytes, learned)
                return snapshot
            marker = page.next_marker
        # Over the limit: stop reading (the prefix may hold more keys than memory
        # allows) and remember for a TTL that it is too big, so misses go to pages.
        self._count("list", "too_big", policy.label)
        if self._flights.owns(("list", k)):
            self._store("list", k, None, policy.ttl, learned=learned)
        return None

    async def _load_page(
        self, k: tuple[Any, ...], policy: Policy, fetch_page: FetchPage
    ) -> ListPage:
        learned = self._clock()
        page = await fetch_page(*k[1:])
        if self._flights.owns(("page", k)):
            weight = _PAGE_ENTRY_BYTES * (len(page.entries) + len(page.common_prefixes))
            self._store("list", k, page, policy.ttl, weight, learned)
        return page

    def _store(
        self,
        table: str,
        k: tuple[Any, ...],
        value: Any,
        ttl: float,
        weight: int = 1,
        learned: float | None = None,
        absent: dict[str, str] | None = None,
    ) -> None:
        learned = self._clock() if learned is None else learned
        # Weight at least 1: an empty listing or a marker still costs memory.
        entry = Entry(value, learned + ttl, max(1, weight), learned, absent or None)
        evicted = self._heads.put(*k, entry) if table == "head" else self._lists.put(k, entry)
        for _ in range(evicted):
            self._count(table, "evicted")

    def _dropped(self, entry: Entry) -> None:
        """A listing left the cache: the pages rendered from it go with it."""
        if isinstance(entry.value, Snapshot):
            self._bodies.drop(entry.value.version)

    def _entry(self, kind: str, k: tuple[Any, ...]) -> Entry | None:
        return self._heads.get(*k) if kind == "head" else self._lists.get(k)

    def _find_whole(self, scope: Hashable, prefix: str) -> tuple[Hashable, str] | None:
        for candidate in lookups.covering(prefix):
            entry = self._lists.entries.get((scope, candidate))
            if entry is not None and entry.value is not None:
                return scope, candidate
        return None

    def _drop_where(
        self,
        head: Callable[[tuple[Any, ...]], bool],
        lists: Callable[[tuple[Any, ...]], bool],
        scan_heads: bool = True,
    ) -> None:
        if scan_heads:
            self._heads.drop_where(lambda scope, key: head((scope, key)))
        self._lists.drop_where(lists)
        # Detach, don't cancel: waiters still get an answer, but a fetch that
        # began before the write must not store what it read.
        self._flights.detach_where(lambda fk: (head if fk[0] == "head" else lists)(fk[1]))
