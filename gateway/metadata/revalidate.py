"""Bulk revalidation: a known object past its TTL is checked against a listing of its directory.

An epoch longer than ``metadata_ttl`` used to cost one origin HEAD per object
per epoch (1.28 M HEADs for ImageNet). An object Hoard already knows (its
metadata is held in memory or in the node's store, past its TTL) needs only
to be told "unchanged", and one ListObjectsV2 page says that for up to 1,000
keys. So:

  1. the key's directory (everything up to its last ``/``; "" at the top) is
     listed whole — one walk shared by every key of the directory, through the
     memory cache's listing machinery (coalesced, cached for the TTL, asked of
     the prefix's owner in a cluster) — and the listing must have been asked
     *after* the known answer was learned, or it could not see a change;
  2. the key with the same ETag and size is confirmed: the known answer is
     served as ``Aged`` by the listing's age (content type and user metadata
     are not in listings, and an unchanged ETag means they did not change);
  3. a key listed with another ETag or size, or not listed at all, gets its
     own HEAD: the changed object's headers are needed, and "not listed" is
     confirmed before it becomes a negative entry (a listing may lag, and a
     cluster owner's listing may be older than this node's knowledge);
  4. a directory too big to hold whole (its snapshot would outgrow
     ``cache.metadata_memory``'s share for listings), or a
     listing that fails, falls back to the HEAD, counted by outcome and the
     failure logged once a minute per origin.

Every listing confirms, in the node's store, each stored row it shows
unchanged (same ETag and size), so sibling workers reading those keys find
young rows and list nothing; a striped lock per directory makes the siblings
that arrive during a walk wait for it and then read the store. A node
therefore lists a directory about once per TTL, however many workers it has.

The staleness bound: a confirmed answer is as old as the listing that
confirmed it, so it expires when that listing would. In a cluster the
listing's pages come from the prefix's owner, whose cached whole listing may
itself be up to its TTL old; the bound there is twice ``metadata_ttl``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from gateway.core import errors
from gateway.metadata.lookups import Aged, FetchPage, Policy, directory_of
from gateway.metadata.memory import MetadataCache
from gateway.metadata.snapshot import Snapshot
from gateway.metadata.store import MetadataStore, Stored
from gateway.origins.base import ObjectInfo

log = logging.getLogger(__name__)

Scope = tuple[str, str]
Head = Callable[[], Awaitable[ObjectInfo]]
Believable = Callable[[Scope, str], Awaitable[Stored | None]]
_LOG_EVERY = 60.0


class Revalidator:
    """Revalidates known objects from listings of their directory; HEAD where it cannot."""

    def __init__(
        self,
        metadata: MetadataCache,
        store: MetadataStore | None,
        believable: Believable,
        on_outcome: Callable[[str, str], None],
    ) -> None:
        """``believable(scope, key)``: the store's row for a key unless a write made it
        stale; ``on_outcome(outcome, mount)`` is told how each revalidation went."""
        self._metadata = metadata
        self._store = store
        self._believable = believable
        self._on_outcome = on_outcome
        # Listings written to the store (ordered: the oldest goes in O(1)).
        self._confirmed: OrderedDict[tuple[Scope, str], float] = OrderedDict()
        self._failures_logged: dict[str, float] = {}

    async def known(
        self,
        scope: Scope,
        key: str,
        known: ObjectInfo,
        learned: float,
        policy: Policy,
        fetch_page: FetchPage,
        head: Head,
    ) -> ObjectInfo | Aged:
        """``known`` (learned at ``learned``, on the memory cache's clock) as it is now."""
        directory = directory_of(key)
        try:
            listing = await self._listing(scope, key, directory, learned, policy, fetch_page)
        except errors.NoSuchBucket:
            raise
        except errors.HoardError as exc:
            self._log_failure(scope[0], exc)
            return await self._head(head, "list_failed", policy)
        if isinstance(listing, Aged):
            return listing  # a sibling worker's listing confirmed it meanwhile
        if listing is None:
            return await self._head(head, "too_big", policy)
        entries, listed = listing
        entry = entries.find(key)
        if entry is None:
            return await self._head(head, "unlisted", policy)
        if entry.etag != known.etag or entry.size != known.size:
            return await self._head(head, "changed", policy)
        self._on_outcome("confirmed", policy.label)
        return Aged(known, max(0.0, self._metadata.now() - listed))

    async def _listing(
        self,
        scope: Scope,
        key: str,
        directory: str,
        learned: float,
        policy: Policy,
        fetch_page: FetchPage,
    ) -> tuple[Snapshot, float] | Aged | None:
        """The directory's whole listing asked after ``learned`` (``None``: too big),
        or the key's row if a sibling's listing confirmed it while we waited."""
        if self._store is None:
            return await self._metadata.whole_listing(scope, directory, learned, policy, fetch_page)
        async with self._store.fetch_lock(scope, directory, kind="list"):
            if self._store.shared:
                stored = await self._believable(scope, key)
                if stored is not None and stored.age < policy.ttl:
                    return Aged(stored.info, stored.age)
            listing = await self._metadata.whole_listing(
                scope, directory, learned, policy, fetch_page
            )
            if listing is not None:
                await self._confirm(scope, directory, listing)
        return listing

    async def _confirm(self, scope: Scope, directory: str, listing: tuple[Snapshot, float]) -> None:
        """Tell the node's store what ``listing`` showed unchanged, once per listing."""
        assert self._store is not None
        entries, listed = listing
        if self._confirmed.get((scope, directory)) == listed:
            return
        self._confirmed[(scope, directory)] = listed
        if len(self._confirmed) > 10_000:  # bounded: the oldest directories go first
            self._confirmed.popitem(last=False)
        wall = time.time() - (self._metadata.now() - listed)
        self._store.confirm(scope, entries, wall)
        if self._store.shared:
            await self._store.flush()  # siblings waiting on the lock read the rows next

    async def _head(self, head: Head, outcome: str, policy: Policy) -> ObjectInfo:
        self._on_outcome(outcome, policy.label)
        return await head()

    def _log_failure(self, origin: str, exc: errors.HoardError) -> None:
        now = time.monotonic()
        if now - self._failures_logged.get(origin, -_LOG_EVERY) >= _LOG_EVERY:
            self._failures_logged[origin] = now
            log.warning(
                "origin %s: listing for bulk revalidation failed (%s); revalidating with "
                "HEAD per key while it fails",
                origin,
                exc,
            )
