"""The read path: namespace → metadata → block plan → tiers → origin.

This is the one module that combines the leaves, the way groupcache.go
combines singleflight, hashing and peers. The S3 front calls it with gateway
bucket names and client keys and gets back values (``ObjectInfo``,
``ListPage``) or an ``ObjectRead`` to stream; how the bytes are obtained stays
behind this seam.

A cold GET costs one origin round trip before bytes flow: the metadata miss is
answered by a ranged GET of the first block the client needs, whose response
carries the size and ETag (Content-Range, ETag); that same response then fills
the block. Later blocks are fetched with If-Match on that ETag, so an object
that changes mid-read fails the read (and drops its metadata) instead of
mixing versions. Blocks are named by ETag, so new metadata means new blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from gateway import errors
from gateway.blocks import BlockSource
from gateway.cache.block import BlockId, block_bounds, block_plan
from gateway.cache.journal import EVERYTHING, Journal, SoloJournal
from gateway.cache.metadata import Aged, FetchHead, FetchPage, MetadataCache, Policy
from gateway.cache.metadata_store import MetadataStore, Stored
from gateway.cluster.directory import MetadataRouter, encode
from gateway.cluster.peers import MetadataQuery
from gateway.invalidation import Invalidation
from gateway.metadata.revalidate import Revalidator
from gateway.metrics import Metrics
from gateway.namespace import Mount, Namespace
from gateway.origins.base import BucketInfo, ListPage, ObjectInfo, Origin
from gateway.pieces import BlockRef, FileSegment, Piece
from gateway.readahead import ReadAheadPolicy, Window

__all__ = ["FileSegment", "ObjectRead", "Piece", "RangeSpec", "Reader", "Watch"]

Precondition = Callable[[ObjectInfo], None]
_SEQUENTIAL_MEMORY = 4096  # objects whose last read position is remembered for read-ahead


@dataclass(frozen=True, slots=True)
class RangeSpec:
    """One HTTP byte range before the object size is known (RFC 9110 §14.1.2).

    ``bytes=a-b`` → first=a, last=b; ``bytes=a-`` → first=a; ``bytes=-n`` → suffix=n.
    """

    first: int | None = None
    last: int | None = None
    suffix: int | None = None

    def applies(self, size: int) -> bool:
        """Whether a byte range can answer this; if not, the whole object is the answer.

        RFC 9110 §14.1.1: on an empty representation a suffix range with a
        non-zero length is satisfiable, yet no byte range can express it, so
        it is answered as if no Range was sent (as S3 answers: 200, no body).
        """
        return not (size == 0 and self.suffix)

    def resolve(self, size: int) -> tuple[int, int]:
        """The inclusive (start, end) this range selects, or ``RangeNotSatisfiable``."""
        if self.suffix is not None:
            if self.suffix == 0 or size == 0:
                raise errors.RangeNotSatisfiable(size)
            return max(0, size - self.suffix), size - 1
        first = self.first or 0
        if first >= size:
            raise errors.RangeNotSatisfiable(size)
        last = size - 1 if self.last is None else min(self.last, size - 1)
        return first, last


class ObjectRead:
    """An object (or a range of it) being read: metadata first, then pieces of bytes.

    ``prime()`` pulls the first piece so a failure to get any byte can still be
    answered as an S3 error before the response headers go out. The caller
    must ``aclose()`` it, also when it stops early.
    """

    def __init__(self, info: ObjectInfo, start: int, end: int, partial: bool,
                 pieces: AsyncIterator[Piece] | None, sources: Counter[str] | None = None,
                 reopen: Callable[[], Awaitable[ObjectRead]] | None = None) -> None:  # fmt: skip
        """``reopen``: the same read afresh, tried once if the object changed before
        the first byte (its metadata is dropped by then)."""
        self._reopen = reopen
        self.info = info
        self.start = start
        self.end = end
        self.partial = partial
        self._pieces = pieces
        self._first: Piece | None = None
        # Bytes by the tier they came from (memory, disk, peer, origin), tallied as read.
        self.sources = sources if sources is not None else Counter()

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    async def prime(self) -> None:
        if self._pieces is None or self._first is not None:
            return
        try:
            self._first = await anext(self._pieces, None)
        except errors.OriginChanged:
            if self._reopen is None:
                raise
            fresh = await self._reopen()
            await self.aclose()
            self.info, self.start, self.end, self.partial = (
                fresh.info, fresh.start, fresh.end, fresh.partial
            )  # fmt: skip
            self._pieces, self.sources, self._reopen = fresh._pieces, fresh.sources, None
            await self.prime()

    async def chunks(self) -> AsyncIterator[Piece]:
        if self._pieces is None:
            return
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for piece in self._pieces:
            yield piece

    async def aclose(self) -> None:
        if isinstance(self._first, FileSegment):
            self._first.release()
        self._first = None
        if self._pieces is not None:
            pieces, self._pieces = self._pieces, None
            await pieces.aclose()  # type: ignore[attr-defined]


class Watch:
    """Whether a key was invalidated since watching began (``changed``); ``close()`` when done.

    What a per-key generation counter would tell ("bumped since I looked?"),
    kept only for keys someone watches: bounded by the write-throughs in
    flight, not by every key ever written.
    """

    __slots__ = ("_registry", "changed", "key")

    def __init__(self, key: tuple[str, str, str], registry: dict[tuple[str, str, str], set[Watch]]):
        self.key = key  # (origin, origin bucket, origin key)
        self.changed = False
        self._registry = registry
        registry.setdefault(key, set()).add(self)

    def close(self) -> None:
        watching = self._registry.get(self.key)
        if watching is not None:
            watching.discard(self)
            if not watching:
                del self._registry[self.key]


class Reader:
    """Answers reads for gateway buckets from the cache, filling it from origins."""

    def __init__(self, namespace: Namespace, blocks: BlockSource, metadata: MetadataCache,
                 metrics: Metrics, block_size: int, read_ahead: ReadAheadPolicy | None = None,
                 store: MetadataStore | None = None, router: MetadataRouter | None = None,
                 observe: Callable[[str, str], None] | None = None,
                 journal: Journal | SoloJournal | None = None) -> None:  # fmt: skip
        """``router``: in a cluster, metadata misses go to their owner node;
        ``observe(bucket, key)`` is told of every object GET (epoch-order prefetch);
        ``journal``: the node's invalidations, shared with sibling workers."""
        self.namespace = namespace
        self.journal = journal or SoloJournal()
        self.router = router  # a cluster: metadata misses go to their owner node
        self.store = store
        self.blocks = blocks
        self.metadata = metadata
        self.metrics = metrics
        self.block_size = block_size
        self.read_ahead = read_ahead or ReadAheadPolicy(4, 4, 10.0)
        self._observe = observe
        # Per object a reader streams: where its last read ended, and its read-ahead window.
        self._read_ends: OrderedDict[BlockId, tuple[int, Window]] = OrderedDict()
        self._watches: dict[tuple[str, str, str], set[Watch]] = {}
        self._revalidator = Revalidator(metadata, store, self._believable, metrics.revalidated)

    async def list_buckets(self) -> list[BucketInfo]:
        return await self.namespace.list_buckets()

    async def head_bucket(self, bucket: str) -> Mount:
        mount = self.namespace.resolve(bucket)
        await mount.origin.head_bucket(mount.origin_bucket)
        return mount

    async def bucket_region(self, bucket: str) -> str:
        mount = await self.head_bucket(bucket)
        return await mount.origin.bucket_region(mount.origin_bucket)

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        okey = mount.origin_key(key)
        fetch = lambda: self._owner_head(mount, okey)  # noqa: E731
        lookup = await self.metadata.head(
            _scope(mount), okey, _policy(mount), lambda: self._stored_or(mount, okey, fetch)
        )
        return dataclasses.replace(lookup.value, key=key)

    async def open_object(
        self,
        bucket: str,
        key: str,
        byte_range: RangeSpec | None = None,
        precondition: Precondition | None = None,
        retry: bool = True,
    ) -> ObjectRead:
        """Open ``key`` for reading; ``precondition`` runs on the metadata before any range.

        ``retry``: an object found changed at the origin before the first byte
        (``ObjectRead.prime``) is opened once more, with fresh metadata.
        """
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        if self._observe is not None:
            self._observe(bucket, key)
        okey = mount.origin_key(key)
        info = await self._metadata_for_read(mount, okey, byte_range)
        if precondition is not None:
            precondition(info)
        if byte_range is not None and not byte_range.applies(info.size):
            byte_range = None
        start, end = byte_range.resolve(info.size) if byte_range else (0, info.size - 1)
        client_info = info if info.key == key else dataclasses.replace(info, key=key)
        if info.size == 0:
            return ObjectRead(client_info, 0, -1, False, None)
        sources: Counter[str] = Counter()
        pieces = self._pieces(mount, okey, info, start, end, sources)

        async def again() -> ObjectRead:
            return await self.open_object(bucket, key, byte_range, precondition, retry=False)

        partial = byte_range is not None
        return ObjectRead(
            client_info, start, end, partial, pieces, sources, again if retry else None
        )

    async def held(self, bucket: str, key: str) -> tuple[ObjectInfo, Piece, str] | None:
        """A whole object of one block that this node holds (for ``s3/hits.py``): its
        metadata as ``open_object`` finds it, its bytes (memory, else a disk segment to
        ``release()``) and the tier; None for anything else, which ``open_object`` answers.

        None is decided from what is held (no entry, a negative one, an empty
        object, more than one block, the block not held, or the entry replaced
        during the disk lookup) before the counted metadata lookup, so the
        general read that follows counts its lookup once.
        """
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        okey = mount.origin_key(key)
        known = self.metadata.known(_scope(mount), okey)
        # A TTL of 0 asks the origin on every read: nothing held is an answer by itself.
        if known is None or mount.metadata_ttl <= 0 or not 0 < known[0].size <= self.block_size:
            return None
        found = await self.blocks.cached(self._ref(mount, okey, known[0], 0), 0, known[0].size)
        if found is None:
            return None
        # An entry held is served (stale ones while one refresh runs): the same object.
        again = self.metadata.known(_scope(mount), okey)
        info = await self._metadata_for_read(mount, okey, None) if again == known else None
        if info is not known[0]:
            if isinstance(found[0], FileSegment):
                found[0].release()
            return None
        if self._observe is not None:
            self._observe(bucket, key)
        client_info = info if info.key == key else dataclasses.replace(info, key=key)
        return client_info, *found

    async def read_whole(self, bucket: str, key: str, limit: int) -> bytes:
        """A whole (small) object through the cache, as bytes — a manifest of keys.

        :raises ValueError: the object is larger than ``limit`` bytes.
        """
        read = await self.open_object(bucket, key)
        try:
            if read.length > limit:
                raise ValueError(f"{key} is {read.length} bytes, more than {limit}")
            return b"".join([await _as_bytes(piece) async for piece in read.chunks()])
        finally:
            await read.aclose()

    async def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        max_keys: int = 1000,
    ) -> ListPage:
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        fetch_page = self._page_fetcher(mount)
        lookup = await self.metadata.listing(
            _scope(mount),
            mount.origin_key(prefix),
            delimiter,
            mount.origin_key(start_after) if start_after else "",
            max_keys,
            _policy(mount),
            fetch_page,
        )
        return _strip_prefix(lookup.value, mount) if mount.prefix else lookup.value

    async def drop(self, bucket: str, prefix: str) -> dict[str, int]:
        """Forget cached blocks and metadata of ``bucket`` under ``prefix``."""
        mount = self.namespace.resolve(bucket)
        origin, origin_bucket = _scope(mount)
        okey_prefix = mount.origin_key(prefix)
        await self._invalidate(Invalidation(origin, origin_bucket, prefix=okey_prefix))
        memory = self.blocks.memory.discard_where(
            lambda b: (
                b.origin == origin and b.bucket == origin_bucket and b.key.startswith(okey_prefix)
            )
        )
        disk = (
            await self.blocks.disk.drop_prefix(origin, origin_bucket, okey_prefix)
            if self.blocks.disk
            else 0
        )
        return {"memory_blocks": memory, "disk_blocks": disk}

    async def invalidate(self, bucket: str, key: str) -> None:
        """A write changed ``key``: forget its metadata, its listings and its blocks."""
        mount = self.namespace.resolve(bucket)
        await self._invalidate(Invalidation(*_scope(mount), key=mount.origin_key(key)))

    async def invalidate_prefix(self, bucket: str, prefix: str) -> None:
        """A bucket-level change: forget metadata under ``prefix`` (blocks stay valid by ETag)."""
        mount = self.namespace.resolve(bucket)
        await self._invalidate(Invalidation(*_scope(mount), prefix=mount.origin_key(prefix)))

    async def invalidate_origin(self, items: list[Invalidation]) -> None:
        """Another node's write: the same drops, named by origin, origin bucket and key."""
        for item in items:
            await self._invalidate(item)

    async def forget_metadata(self) -> None:
        """Drop every metadata entry, in memory and on disk, in every worker (this node
        missed more invalidations than another node could remember for it). Blocks
        stay: they are named by ETag, and fresh metadata names the right ones."""
        self._forget_all_locally()
        self.journal.publish([EVERYTHING])
        if self.store is not None:
            await self.store.clear()

    def invalidation(self, bucket: str, key: str | None) -> Invalidation:
        """What to tell other nodes about a change of ``key`` (None: the whole bucket)."""
        mount = self.namespace.resolve(bucket)
        origin, origin_bucket = _scope(mount)
        if key is None:
            return Invalidation(origin, origin_bucket, prefix=mount.origin_key(""))
        return Invalidation(origin, origin_bucket, key=mount.origin_key(key))

    def catch_up(self) -> None:
        """Apply what sibling workers invalidated since this worker last looked.

        Called as every read starts: a write any worker acknowledged before is
        then forgotten here too (see ``cache/journal.py``).
        """
        news = self.journal.news()
        if news is None:
            self._forget_all_locally()
            return
        for item in news:
            self._forget_locally(item)

    async def _invalidate(self, item: Invalidation) -> None:
        """Every place a change of ``item`` reaches on this node, before the write is
        acknowledged: this worker's memory, the siblings' (through the journal),
        the metadata store, and the key's blocks in memory and on disk."""
        self._forget_locally(item)  # first: a write-through under way must not land after this
        self.journal.publish([item])
        origin, origin_bucket = item.scope
        if item.key is None:
            if self.store is not None:
                await self.store.drop(item.scope, item.prefix or "")
            return
        okey = item.key
        if self.store is not None:
            await self.store.drop(item.scope, okey, exact=True)
        self.blocks.memory.discard_where(
            lambda b: b.key == okey and b.bucket == origin_bucket and b.origin == origin
        )
        if self.blocks.disk is not None:
            await self.blocks.disk.drop_object(origin, origin_bucket, okey)

    def _forget_locally(self, item: Invalidation) -> None:
        """Drop from this process's memory the metadata ``item`` makes stale (blocks are
        named by ETag: new metadata names new blocks, so old ones may stay)."""
        if item.key is not None:
            self._changed(item.scope, item.key)
            self.metadata.invalidate_key(item.scope, item.key)
        else:
            self._changed(item.scope, item.prefix or "", prefix=True)
            self.metadata.invalidate_prefix(item.scope, item.prefix or "")
        if self.router is not None:
            self.router.invalidated(item.scope)

    def _forget_all_locally(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.changed = True
        self.metadata.clear()

    # -- write-through -------------------------------------------------------------------

    def watch(self, bucket: str, key: str) -> Watch:
        """Start noticing invalidations of ``key`` (see ``write_through``)."""
        mount = self.namespace.resolve(bucket)
        return Watch((*_scope(mount), mount.origin_key(key)), self._watches)

    async def write_through(
        self, bucket: str, key: str, etag: str, data: Iterable[bytes], size: int, watch: Watch
    ) -> int:
        """Cache the bytes a write just stored at the origin; returns the bytes cached.

        ``data`` is the object as it was sent, in pieces, ``etag`` what the
        origin answered the write with. An S3 PUT answer carries no
        Last-Modified or Content-Type, so one origin HEAD learns the metadata.
        Nothing is cached when the HEAD shows another version (a write landed
        in between) or ``watch`` saw the key invalidated meanwhile (a later
        write through Hoard). Blocks go first and metadata last, so a reader
        that finds the metadata finds the blocks; a reader that comes earlier
        fills from the origin as usual.

        A write through a sibling worker reaches ``watch`` through the
        node's journal, which is read before each check.
        """
        mount = self.namespace.resolve(bucket)
        okey = mount.origin_key(key)
        learned = self.journal.seq()
        info = await self._origin_head(mount, okey)
        if self._changed_since(watch) or _bare(info.etag) != _bare(etag) or info.size != size:
            return 0
        cached = 0
        for index, block in enumerate(_blocks(data, self.block_size)):
            if self._changed_since(watch):  # checked right before each store: no await between
                return cached
            ref = self._ref(mount, okey, info, index)
            stored = self.blocks.memory.put(ref.block, block)
            if self.blocks.disk is not None:
                stored = await self.blocks.disk.put(ref.block, block) or stored
            if stored:
                cached += len(block)
                self.metrics.write_through_bytes.inc(len(block))
        if self._changed_since(watch):
            return cached  # the blocks stay: named by this ETag, they are right for it
        scope = _scope(mount)
        self.metadata.put_head(scope, okey, info, _policy(mount))
        if self.store is not None:
            self.store.save(scope, okey, info, learned)
        return cached

    def _changed_since(self, watch: Watch) -> bool:
        """Whether ``watch``'s key was invalidated by any worker of the node since it began."""
        self.catch_up()
        return watch.changed

    def _changed(self, scope: tuple[str, str], okey: str, *, prefix: bool = False) -> None:
        """Tell every watch on ``okey`` (or, with ``prefix``, under it) that it changed."""
        if prefix:
            found = [w for k, ws in self._watches.items() if k[:2] == scope and
                     k[2].startswith(okey) for w in ws]  # fmt: skip
        else:
            found = list(self._watches.get((*scope, okey), ()))
        for watch in found:
            watch.changed = True

    def mount_label(self, bucket: str) -> str:
        return self.namespace.label(bucket)

    def stats(self) -> dict[str, object]:
        memory = self.blocks.memory
        disk = self.blocks.disk.stats() if self.blocks.disk else None
        return {
            "memory": {
                "used_bytes": memory.used,
                "capacity": memory.capacity,
                "blocks": len(memory),
                "evictions": memory.evictions,
            },
            "disk": dataclasses.asdict(disk) if disk is not None else None,
            "metadata": self.metadata.stats(),
            "fills": {"started": self.blocks.fills.started, "coalesced": self.blocks.fills.joined},
        }

    # -- metadata ----------------------------------------------------------------------

    async def answer_peer(self, query: MetadataQuery) -> dict[str, object]:
        """Another node's metadata miss, answered as the owner: this node's metadata
        cache, else one coalesced origin call (never another node). JSON-ready.

        A stale entry is revalidated before it is answered (no stale-while-revalidate
        here): the asking node would otherwise store it as fresh for a whole TTL.
        """
        self.catch_up()
        origin = next((o for o in self.namespace.origins() if o.name == query.origin), None)
        if origin is None:
            raise errors.OriginUnavailable(f"no origin named {query.origin!r} here")
        scope = (query.origin, query.bucket)
        policy = Policy(ttl=query.ttl, negative_ttl=query.negative_ttl, stale_while_revalidate=0)
        if query.kind == "head":

            async def head() -> ObjectInfo:
                with self.metrics.origin_call(origin.name, "HeadObject"):
                    return await origin.head_object(query.bucket, query.key)

            return encode((await self.metadata.head(scope, query.key, policy, head)).value)
        lookup = await self.metadata.listing(
            scope, query.key, query.delimiter, query.start_after, query.max_keys, policy,
            self._origin_pages(origin, query.bucket),
        )  # fmt: skip
        return encode(lookup.value)

    def _page_fetcher(self, mount: Mount) -> FetchPage:
        """Origin pages of ``mount``'s bucket; in a cluster, asked of the prefix's owner."""
        from_origin = self._origin_pages(mount.origin, mount.origin_bucket)
        if self.router is None:
            return from_origin
        router = self.router

        async def fetch_page(prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
            query = MetadataQuery("list", mount.origin.name, mount.origin_bucket, prefix,
                                  mount.metadata_ttl, mount.negative_ttl, delimiter, after, limit)  # fmt: skip
            return await router.page(query, lambda: from_origin(prefix, delimiter, after, limit))

        return fetch_page

    def _origin_pages(self, origin: Origin, origin_bucket: str) -> FetchPage:
        async def fetch_page(prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
            with self.metrics.origin_call(origin.name, "ListObjectsV2"):
                return await origin.list_objects(origin_bucket, prefix, delimiter, after, limit)

        return fetch_page

    async def _origin_head(self, mount: Mount, okey: str) -> ObjectInfo:
        with self.metrics.origin_call(mount.origin.name, "HeadObject"):
            return await mount.origin.head_object(mount.origin_bucket, okey)

    async def _owner_head(self, mount: Mount, okey: str) -> ObjectInfo:
        """A HEAD miss: in a cluster, the key's metadata owner answers (one origin
        HEAD per cluster, see ``cluster/directory.py``); else the origin."""
        if self.router is None:
            return await self._origin_head(mount, okey)
        query = MetadataQuery("head", mount.origin.name, mount.origin_bucket, okey,
                              mount.metadata_ttl, mount.negative_ttl)  # fmt: skip
        return await self.router.head(query, lambda: self._origin_head(mount, okey))

    async def _metadata_for_read(
        self, mount: Mount, okey: str, byte_range: RangeSpec | None, admit: bool | None = None
    ) -> ObjectInfo:
        scope = _scope(mount)
        if byte_range is not None and byte_range.suffix is not None:
            fetch = lambda: self._owner_head(mount, okey)  # noqa: E731 - the size is unknown
        elif self.metadata.has_entry(scope, okey) or self.blocks.clustered:
            # A refresh needs no bytes (and is bulk, see _known_or); in a cluster the
            # first block may be owned elsewhere.
            fetch = lambda: self._owner_head(mount, okey)  # noqa: E731
        else:
            index = (byte_range.first or 0) // self.block_size if byte_range else 0
            fetch = lambda: self._first_block(mount, okey, index, admit)  # noqa: E731
        lookup = await self.metadata.head(
            scope, okey, _policy(mount), lambda: self._stored_or(mount, okey, fetch)
        )
        return lookup.value

    async def _stored_or(self, mount: Mount, okey: str, fetch: FetchHead) -> ObjectInfo | Aged:
        """A memory miss or expiry: the node's store, else what is known revalidated,
        else ``fetch`` from the origin.

        A stored answer within the TTL is used as it is, as old as it is (so a
        restart costs no origin request, and no tier restarts the TTL). An
        object known here or in the store, past its TTL, is revalidated in bulk
        (``metadata/revalidate.py``). A stored answer some write made stale
        since it was learned is not believed (``_believable``).
        """
        if self.store is None:
            return await self._known_or(mount, okey, None, fetch)
        scope = _scope(mount)
        stored = await self._believable(scope, okey)
        if stored is not None and stored.age < mount.metadata_ttl:
            return Aged(stored.info, stored.age)
        async with self.store.fetch_lock(scope, okey):
            if self.store.shared:  # a sibling worker may have fetched it meanwhile
                stored = await self._believable(scope, okey)
                if stored is not None and stored.age < mount.metadata_ttl:
                    return Aged(stored.info, stored.age)
            learned = self.journal.seq()  # before asking: a write after it makes this suspect
            answer = await self._known_or(mount, okey, stored, fetch)
            if not isinstance(answer, Aged):  # a confirmed row was refreshed in the store
                self.store.save(scope, okey, answer, learned)
                if self.store.shared:
                    await self.store.flush()  # visible to siblings before the lock opens
        return answer

    async def _known_or(
        self, mount: Mount, okey: str, stored: Stored | None, fetch: FetchHead
    ) -> ObjectInfo | Aged:
        """What is known of ``okey`` (in memory, else ``stored``) revalidated, else ``fetch``."""
        scope = _scope(mount)
        known = self.metadata.known(scope, okey)
        if known is None and stored is not None:
            known = (stored.info, self.metadata.now() - stored.age)
        if known is None:
            return await fetch()
        return await self._revalidator.known(
            scope, okey, *known, _policy(mount), self._page_fetcher(mount),
            lambda: self._owner_head(mount, okey),
        )  # fmt: skip

    async def _believable(self, scope: tuple[str, str], okey: str) -> Stored | None:
        """The store's answer for ``okey``, unless a write since it was learned made it stale."""
        assert self.store is not None
        stored = await self.store.load(scope, okey)
        if stored is None or not self.journal.current(*scope, okey, stored.learned):
            return None
        return stored

    async def _first_block(
        self, mount: Mount, okey: str, index: int, admit: bool | None = None
    ) -> ObjectInfo:
        """A metadata miss answered by the block the client needs: one round trip, not two."""
        first = index * self.block_size
        try:
            with self.metrics.origin_call(mount.origin.name, "GetObject"):
                stream = await mount.origin.get_object(
                    mount.origin_bucket, okey, (first, first + self.block_size - 1)
                )
        except errors.RangeNotSatisfiable:
            return await self._origin_head(mount, okey)  # empty, or a range past the end
        ref = self._ref(mount, okey, stream.info, index)
        if (stream.start, stream.end) != (ref.first, ref.last):
            await stream.aclose()  # the origin ignored the range; fetch blocks normally
        else:
            await self.blocks.adopt(ref, stream, admit)
        return stream.info

    # -- bytes -------------------------------------------------------------------------

    def _ref(self, mount: Mount, okey: str, info: ObjectInfo, index: int) -> BlockRef:
        block = BlockId(mount.origin.name, mount.origin_bucket, okey, info.etag, index)
        first, last = block_bounds(index, self.block_size, info.size)
        return BlockRef(block, mount.origin, first, last)

    async def _pieces(
        self, mount: Mount, okey: str, info: ObjectInfo, start: int, end: int, sources: Counter[str]
    ) -> AsyncIterator[Piece]:
        spans = block_plan(start, end, self.block_size)
        last_block = (info.size - 1) // self.block_size
        if last_block == 0:  # one block: nothing to read ahead, no stream to follow
            window, sequential = Window(0, 0.0), False
        else:
            window, sequential = self._stream_window(mount, okey, info, start, end)
        # Read-ahead stays within the range, unless the range continues the previous
        # one: then it runs past the end, where the stream is heading.
        limit = end // self.block_size + (window.blocks if sequential else 0)
        limit = min(limit, last_block)
        try:
            for i, span in enumerate(spans):
                ahead = range(span.index + 1, min(span.index + window.blocks, limit) + 1)
                if ahead:
                    self.blocks.read_ahead([self._ref(mount, okey, info, j) for j in ahead])
                ref = self._ref(mount, okey, info, span.index)
                block_sources: Counter[str] = Counter()
                async for piece in self.blocks.pieces(ref, span.offset, span.length, block_sources):
                    yield piece
                sources.update(block_sources)
                # A fill this reader had to wait for, past the stream's first block:
                # it consumes faster than read-ahead lands blocks.
                if (i > 0 or sequential) and block_sources.keys() & {"origin", "peer"}:
                    self.metrics.read_ahead_window.observe(self.read_ahead.caught_up(window))
        except errors.OriginChanged:
            # Every tier at once: the next read (or this one's retry) sees the new version.
            await self._invalidate(Invalidation(*_scope(mount), key=okey))
            raise

    def _stream_window(
        self, mount: Mount, okey: str, info: ObjectInfo, start: int, end: int
    ) -> tuple[Window, bool]:
        """The read-ahead window of this object's stream, and whether this range continues it."""
        marker = BlockId(mount.origin.name, mount.origin_bucket, okey, info.etag, -1)
        previous = self._read_ends.pop(marker, None)
        window = previous[1] if previous is not None else self.read_ahead.new()
        self._read_ends[marker] = (end, window)
        if len(self._read_ends) > _SEQUENTIAL_MEMORY:
            self._read_ends.popitem(last=False)
        sequential = previous is not None and previous[0] < start <= previous[0] + self.block_size
        self.metrics.read_ahead_window.observe(self.read_ahead.resume(window, sequential))
        return window, sequential

    async def block_refs(self, bucket: str, key: str, admit: bool | None = None) -> list[BlockRef]:
        """Every block of ``key`` (its metadata looked up as a read would; none if empty).

        A cold lookup starts the fill of block 0 with the same origin request,
        admitted to disk as ``admit`` says (see ``BlockSource.fill``).
        """
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        okey = mount.origin_key(key)
        info = await self._metadata_for_read(mount, okey, None, admit)
        count = (info.size + self.block_size - 1) // self.block_size
        return [self._ref(mount, okey, info, index) for index in range(count)]


async def _as_bytes(piece: Piece) -> bytes:
    """A piece's bytes; a file segment is read in a thread (and released)."""
    if not isinstance(piece, FileSegment):
        return bytes(piece)
    try:
        return await asyncio.to_thread(os.pread, piece.fd, piece.count, piece.offset)
    finally:
        piece.release()


def _scope(mount: Mount) -> tuple[str, str]:
    return (mount.origin.name, mount.origin_bucket)


def _policy(mount: Mount) -> Policy:
    # A TTL of 0 asks the origin every time (a local directory): never a stale answer.
    stale = math.inf if mount.metadata_ttl > 0 else 0.0
    return Policy(ttl=mount.metadata_ttl, negative_ttl=mount.negative_ttl,
                  stale_while_revalidate=stale, label=mount.label)  # fmt: skip


def _bare(etag: str) -> str:
    return etag.strip().strip('"').lower()


def _blocks(pieces: Iterable[bytes], block_size: int) -> Iterator[bytes]:
    """The bytes of ``pieces`` cut into blocks of ``block_size`` (the last may be shorter)."""
    held: list[memoryview] = []
    have = 0
    for piece in pieces:
        view = memoryview(piece)
        while view:
            part = view[: block_size - have]
            held.append(part)
            have += len(part)
            view = view[len(part) :]
            if have == block_size:
                yield b"".join(held)
                held, have = [], 0
    if held:
        yield b"".join(held)


def _strip_prefix(page: ListPage, mount: Mount) -> ListPage:
    return ListPage(
        entries=[dataclasses.replace(e, key=mount.client_key(e.key)) for e in page.entries],
        common_prefixes=[mount.client_key(p) for p in page.common_prefixes],
        is_truncated=page.is_truncated,
        next_marker=mount.client_key(page.next_marker) if page.next_marker else None,
    )
