"""Where the reader gets metadata: this worker's memory, the node's store, the owner node, the origin.

The reader asks for one thing (a HEAD answer, a listing page) and this
module walks the tiers, fastest first:

  1. this worker's memory (``memory.py``: TTLs, stale-while-revalidate,
     one flight per key);
  2. the node's store (``store.py``), believed only if no write
     since the row was learned made it stale (``_believable``, the node's
     journal decides), and used as old as it is;
  3. a known object past its TTL is revalidated in bulk by a listing of its
     directory (``revalidate.py``), not by its own HEAD;
  4. in a cluster, the key's (or prefix's) owner node (``cluster/directory.py``);
  5. the origin.

What a miss costs is chosen by the caller, at the call site: ``head`` asks
with a HEAD; ``for_read`` takes the read's own ``first_block`` fetch (one
ranged GET answers the metadata and fills the block the client needs), used
only when nothing about the key is known — a refresh needs no bytes.

Invalidation reaches this module's tiers through ``forget_locally`` (this
worker's memory), ``drop_stored`` (the node's store) and the journal
(``publish``/``news``: sibling workers); ``Invalidator.apply`` (``coherence/invalidator.py``) is the one
place that names every tier a change reaches, blocks included.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol, TypeVar

from gateway.core import errors
from gateway.core.invalidation import Invalidation
from gateway.metadata import codec
from gateway.metadata.bucket_config import BucketConfigs
from gateway.metadata.heads import Entry
from gateway.metadata.journal import EVERYTHING, Journal, SoloJournal
from gateway.metadata.lookups import Aged, FetchHead, FetchPage, Policy
from gateway.metadata.memory import MetadataCache
from gateway.metadata.query import MetadataQuery
from gateway.metadata.revalidate import Revalidator
from gateway.metadata.store import MetadataStore, Stored
from gateway.origins.base import ListPage, ObjectInfo, Origin
from gateway.origins.namespace import Mount

Scope = tuple[str, str]  # (origin name, origin bucket)
T = TypeVar("T")


def scope_of(mount: Mount) -> Scope:
    return (mount.origin.name, mount.origin_bucket)


def policy_of(mount: Mount) -> Policy:
    return _policy(mount.metadata_ttl, mount.negative_ttl, mount.label)


@functools.lru_cache(maxsize=256)  # pure; built per lookup it cost a hit ~1.4 µs of its ~70
def _policy(ttl: float, negative_ttl: float, label: str) -> Policy:
    # A TTL of 0 asks the origin every time (a local directory): never a stale answer.
    stale = math.inf if ttl > 0 else 0.0
    return Policy(ttl=ttl, negative_ttl=negative_ttl, stale_while_revalidate=stale, label=label)


class OwnerNode(Protocol):
    """Who answers a metadata miss before the origin: in a cluster, the node that owns
    the key or prefix (``cluster/directory.py``); alone, nobody (``NoOwner``)."""

    async def head(
        self, query: MetadataQuery, origin: Callable[[], Awaitable[ObjectInfo]]
    ) -> ObjectInfo: ...

    async def page(
        self, query: MetadataQuery, origin: Callable[[], Awaitable[ListPage]]
    ) -> ListPage: ...

    def invalidated(self, scope: Scope) -> None: ...


class NoOwner:
    """A node alone: every miss goes to the origin."""

    async def head(
        self, query: MetadataQuery, origin: Callable[[], Awaitable[ObjectInfo]]
    ) -> ObjectInfo:
        return await origin()

    async def page(
        self, query: MetadataQuery, origin: Callable[[], Awaitable[ListPage]]
    ) -> ListPage:
        return await origin()

    def invalidated(self, scope: Scope) -> None:
        pass


class SharedAnswers(Protocol):
    """Origin answers shared with sibling workers that asked at the same time
    (``node/pages.py``): listing pages, and keys found missing."""

    async def fetch(
        self, scope: Scope, query: tuple[str, str, str, int], ask: Callable[[], Awaitable[ListPage]]
    ) -> ListPage: ...

    def leave_missing(
        self, scope: Scope, key: str, missing: errors.NotFound, learned: int
    ) -> None: ...

    def raise_missing(
        self, scope: Scope, key: str, since: float, believable: Callable[[int], bool]
    ) -> None: ...


class MetadataSource:
    """Object heads and listing pages of mounts, through the metadata tiers."""

    def __init__(self, memory: MetadataCache, store: MetadataStore | None,
                 owner: OwnerNode, journal: Journal | SoloJournal,
                 on_revalidated: Callable[[str, str], None],
                 shared: SharedAnswers | None = None) -> None:  # fmt: skip
        """``on_revalidated(outcome, mount)``: a bulk revalidation's end (origin requests
        are observed by each origin's guard, ``origins/guard.py``); ``shared``: answers
        shared with sibling workers asking at once (None: one worker)."""
        self.memory = memory
        self.store = store
        self.owner = owner
        self._shared = shared
        self.journal = journal
        self.buckets = BucketConfigs()  # bucket-level answers (CORS rules), per worker
        self._revalidator = Revalidator(memory, store, self._believable, on_revalidated)

    # -- asking --------------------------------------------------------------------------

    async def head(self, mount: Mount, okey: str) -> ObjectInfo:
        """``okey``'s HEAD answer; a miss costs a HEAD (of the owner node, or the origin)."""
        return await self.for_read(mount, okey, None)

    async def for_read(self, mount: Mount, okey: str, first_block: FetchHead | None) -> ObjectInfo:
        """``okey``'s metadata for a read; a miss of a key nothing is known of costs
        ``first_block`` (None: a HEAD)."""
        scope = scope_of(mount)
        fetch: FetchHead = lambda: self.owner_head(mount, okey)  # noqa: E731
        if first_block is not None and self.memory.known(scope, okey) is None:
            fetch = first_block
        lookup = await self.memory.head(
            scope, okey, policy_of(mount), lambda: self._stored_or(mount, okey, fetch)
        )
        return lookup.value

    def held_for_read(
        self, mount: Mount, okey: str, entry: Entry | None = None
    ) -> ObjectInfo | None:
        """``for_read`` when memory holds the answer (a stale one starts its refresh, as
        ``for_read`` does); None when only an await could tell (the hit path's).
        ``entry``: what ``memory.known_entry`` found of ``okey`` in this same turn of
        the loop (nothing awaited since), so it is not looked up and decoded again."""

        def refresh() -> Awaitable[ObjectInfo | Aged]:
            return self._stored_or(mount, okey, lambda: self.owner_head(mount, okey))

        return self.memory.head_held(scope_of(mount), okey, policy_of(mount), refresh, entry)

    async def held_in_store(self, mount: Mount, okey: str) -> ObjectInfo | None:
        """What the node's store holds of ``okey``, fresh and believable, now held in
        memory too; None if memory already holds anything of it or the store has no such
        answer (nothing is asked of the origin). For the hit path of a worker that has not
        seen a key its siblings have: without it, every worker's first read of every key
        took the general path, however long ago a sibling learned it."""
        if not self._may_hold_in_store(mount, okey):
            return None
        return self._hold(mount, okey, await self._believable(scope_of(mount), okey))

    def held_in_store_now(self, mount: Mount, okey: str) -> ObjectInfo | None:
        """``held_in_store`` without leaving the loop (a point read of the store there);
        raises ``sqlite3.OperationalError`` if the store is busy (``held_in_store`` waits)."""
        if not self._may_hold_in_store(mount, okey):
            return None
        assert self.store is not None
        scope = scope_of(mount)
        return self._hold(mount, okey, self._current(scope, okey, self.store.load_now(scope, okey)))

    def _may_hold_in_store(self, mount: Mount, okey: str) -> bool:
        return (
            self.store is not None
            and mount.metadata_ttl > 0
            and not self.memory.holds(scope_of(mount), okey)
        )

    def _hold(self, mount: Mount, okey: str, stored: Stored | None) -> ObjectInfo | None:
        """``stored`` held in memory if it is fresh and memory has learned nothing of
        ``okey`` meanwhile (that answer stands)."""
        scope = scope_of(mount)
        if stored is None or stored.age >= mount.metadata_ttl or self.memory.holds(scope, okey):
            return None
        self.memory.put_head(scope, okey, stored.info, policy_of(mount), stored.age)
        return stored.info

    async def bucket_config(self, mount: Mount, kind: str, fetch: Callable[[], Awaitable[T]]) -> T:
        """``mount``'s origin bucket's ``kind`` configuration (``bucket_config.py``): held
        for the mount's TTL, a miss costs one ``fetch`` however many ask at once."""
        return await self.buckets.get(scope_of(mount), kind, mount.metadata_ttl,
                                      mount.negative_ttl, fetch)  # fmt: skip

    async def listing(self, mount: Mount, prefix: str, delimiter: str, after: str,
                      max_keys: int) -> ListPage:  # fmt: skip
        """A page of ``mount``'s origin bucket, in origin keys."""
        lookup = await self.memory.listing(scope_of(mount), prefix, delimiter, after, max_keys,
                                           policy_of(mount), self._page_fetcher(mount))  # fmt: skip
        return lookup.value

    async def listing_body(
        self,
        mount: Mount,
        query: tuple[str, str, str, int],
        render: Callable[[ListPage], bytes],
        variant: Hashable,
    ) -> bytes:
        """A page of ``query`` as ``render`` makes it, rendered once per cached listing
        and ``variant`` (``memory.py``: rendered page bodies)."""
        lookup = await self.memory.listing_body(scope_of(mount), query, policy_of(mount),
                                                self._page_fetcher(mount), render, variant)  # fmt: skip
        return lookup.value

    async def answer_peer(self, query: MetadataQuery, origin: Origin) -> dict[str, object]:
        """Another node's metadata miss, answered as the owner: this node's memory,
        else one coalesced origin call (never another node). JSON-ready.

        A stale entry is revalidated before it is answered (no stale-while-revalidate
        here): the asking node would otherwise store it as fresh for a whole TTL.
        """
        scope = (query.origin, query.bucket)
        policy = Policy(ttl=query.ttl, negative_ttl=query.negative_ttl, stale_while_revalidate=0)
        if query.kind == "head":

            def head() -> Awaitable[ObjectInfo]:
                return origin.head_object(query.bucket, query.key)

            return codec.jsonable((await self.memory.head(scope, query.key, policy, head)).value)
        lookup = await self.memory.listing(
            scope, query.key, query.delimiter, query.start_after, query.max_keys, policy,
            self._origin_pages(origin, query.bucket),
        )  # fmt: skip
        return codec.jsonable(lookup.value)

    async def origin_head(self, mount: Mount, okey: str) -> ObjectInfo:
        """The origin's own HEAD answer, past every tier (a write's metadata)."""
        return await mount.origin.head_object(mount.origin_bucket, okey)

    async def owner_head(self, mount: Mount, okey: str) -> ObjectInfo:
        """A HEAD miss: in a cluster, the key's metadata owner answers (one origin
        HEAD per cluster, see ``cluster/directory.py``); else the origin."""
        query = MetadataQuery("head", mount.origin.name, mount.origin_bucket, okey,
                              mount.metadata_ttl, mount.negative_ttl)  # fmt: skip
        return await self.owner.head(query, lambda: self.origin_head(mount, okey))

    # -- learning ------------------------------------------------------------------------

    def remember(self, mount: Mount, okey: str, info: ObjectInfo, learned: int) -> None:
        """What a write told about ``okey``, learned at journal position ``learned``."""
        scope = scope_of(mount)
        self.memory.put_head(scope, okey, info, policy_of(mount))
        if self.store is not None:
            self.store.save(scope, okey, info, learned)

    # -- forgetting ----------------------------------------------------------------------

    def forget_locally(self, item: Invalidation) -> None:
        """Drop from this worker's memory the metadata ``item`` makes stale."""
        if item.key is not None:
            self.memory.invalidate_key(item.scope, item.key)
        else:  # a bucket-level write (its CORS rules, say) is published as a prefix
            self.memory.invalidate_prefix(item.scope, item.prefix or "")
            self.buckets.forget(item.scope)
        self.owner.invalidated(item.scope)

    def forget_memory(self) -> None:
        """Drop everything this worker's memory holds (too much news to know what changed)."""
        self.memory.clear()
        self.buckets.clear()

    async def drop_stored(self, item: Invalidation) -> None:
        """Drop from the node's store the rows ``item`` makes stale."""
        if self.store is None:
            return
        if item.key is None:
            await self.store.drop(item.scope, item.prefix or "")
        else:
            await self.store.drop(item.scope, item.key, exact=True)

    async def forget_all(self) -> None:
        """Every metadata entry of the node, in every worker's memory and in the store."""
        self.forget_memory()
        self.journal.publish([EVERYTHING])
        if self.store is not None:
            await self.store.clear()

    # -- the tiers -----------------------------------------------------------------------

    async def _stored_or(self, mount: Mount, okey: str, fetch: FetchHead) -> ObjectInfo | Aged:
        """A memory miss or expiry: the node's store, else what is known revalidated,
        else ``fetch`` from the origin.

        A stored answer within the TTL is used as it is, as old as it is (so a
        restart costs no origin request, and no tier restarts the TTL). An
        object known here or in the store, past its TTL, is revalidated in bulk
        (``revalidate.py``). A stored answer some write made stale since it was
        learned is not believed (``_believable``).

        The store is read once, under the fetch lock (free for one worker): a
        sibling worker that fetched the key flushed it before opening the lock,
        so a read taken before the lock would only be read again after it,
        which cost every cold object a second trip to the store's thread.

        A key found missing is not in the store; the worker that learned it leaves
        the 404 beside it (``node/pages.py``) with the journal's ``seq`` from before
        its origin request. A sibling answers that 404 within ``negative_ttl`` of it
        unless a write of the key came after, as it would its own (so a HEAD storm
        of a missing key costs the node one origin request, however the storm is
        spread over the workers and over time).
        """
        if self.store is None:
            return await self._known_or(mount, okey, None, fetch)
        scope = scope_of(mount)
        asked = time.time()
        async with self.store.fetch_lock(scope, okey):
            stored = await self._believable(scope, okey)
            if stored is not None and stored.age < mount.metadata_ttl:
                return Aged(stored.info, stored.age)
            if self._shared is not None:  # a 404 a sibling learned within the negative TTL
                current = functools.partial(self.journal.current, *scope, okey)
                self._shared.raise_missing(scope, okey, asked - mount.negative_ttl, current)
            learned = self.journal.seq()  # before asking: a write after it makes this suspect
            try:
                answer = await self._known_or(mount, okey, stored, fetch)
            except errors.NotFound as missing:
                if self._shared is not None:
                    self._shared.leave_missing(scope, okey, missing, learned)
                raise
            if not isinstance(answer, Aged):  # a confirmed row was refreshed in the store
                self.store.save(scope, okey, answer, learned)
                if self.store.shared:
                    await self.store.share(scope, okey)  # seen by siblings before the lock opens
        return answer

    async def _known_or(
        self, mount: Mount, okey: str, stored: Stored | None, fetch: FetchHead
    ) -> ObjectInfo | Aged:
        """What is known of ``okey`` (in memory, else ``stored``) revalidated, else ``fetch``."""
        scope = scope_of(mount)
        known = self.memory.known(scope, okey)
        if known is None and stored is not None:
            known = (stored.info, self.memory.now() - stored.age)
        if known is None:
            return await fetch()
        return await self._revalidator.known(
            scope, okey, *known, policy_of(mount), self._page_fetcher(mount),
            lambda: self.owner_head(mount, okey),
        )  # fmt: skip

    async def _believable(self, scope: Scope, okey: str) -> Stored | None:
        """The store's answer for ``okey``, unless a write since it was learned made it stale."""
        assert self.store is not None
        return self._current(scope, okey, await self.store.load(scope, okey))

    def _current(self, scope: Scope, okey: str, stored: Stored | None) -> Stored | None:
        """``stored`` unless the journal knows of a write of ``okey`` since it was learned."""
        if stored is None or not self.journal.current(*scope, okey, stored.learned):
            return None
        return stored

    def _page_fetcher(self, mount: Mount) -> FetchPage:
        """Origin pages of ``mount``'s bucket; in a cluster, asked of the prefix's owner."""
        from_origin = self._origin_pages(mount.origin, mount.origin_bucket)
        owner = self.owner

        async def fetch_page(prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
            query = MetadataQuery("list", mount.origin.name, mount.origin_bucket, prefix,
                                  mount.metadata_ttl, mount.negative_ttl, delimiter, after, limit)  # fmt: skip
            return await owner.page(query, lambda: from_origin(prefix, delimiter, after, limit))

        return fetch_page

    def _origin_pages(self, origin: Origin, origin_bucket: str) -> FetchPage:
        async def from_origin(prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
            return await origin.list_objects(origin_bucket, prefix, delimiter, after, limit)

        if self._shared is None:
            return from_origin
        shared = self._shared

        async def fetch_page(prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
            query = (prefix, delimiter, after, limit)
            return await shared.fetch((origin.name, origin_bucket), query,
                                      lambda: from_origin(*query))  # fmt: skip

        return fetch_page


def origin_named(origins: list[Origin], name: str) -> Origin:
    """The origin called ``name`` on this node (a peer's query names it)."""
    found = next((o for o in origins if o.name == name), None)
    if found is None:
        raise errors.OriginUnavailable(f"no origin named {name!r} here")
    return found
