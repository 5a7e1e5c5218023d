"""The read path: namespace → metadata → block plan → tiers → origin.

This is the one module that combines the leaves, the way groupcache.go
combines singleflight, hashing and peers. The S3 front calls it with gateway
bucket names and client keys and gets back values (``ObjectInfo``,
``ListPage``) or an ``ObjectRead`` to stream; how the bytes are obtained stays
behind this seam. Metadata comes from ``metadata/source.py`` (its tiers),
bytes from ``blocks/source.py`` (its tiers), what other workers invalidated
from ``coherence/`` (caught up as every read starts); what is left here is the
order of things. The reader builds none of them: the wiring hands them in, and
the writer is a sibling over the same coherence, never reached from here.

A cold GET costs one origin round trip before bytes flow: the metadata miss is
answered by a ranged GET of the first block the client needs (``first_block.py``), whose response
carries the size and ETag (Content-Range, ETag); that same response then fills
the block. Later blocks are fetched with If-Match on that ETag, so an object
that changes mid-read fails the read (and drops its metadata) instead of
mixing versions. Blocks are named by ETag, so new metadata means new blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import TypeVar

from gateway.blocks.source import BlockSource
from gateway.cache.block import BlockId, block_plan
from gateway.coherence.invalidator import Invalidator
from gateway.core.errors import OriginChanged
from gateway.core.ranges import RangeSpec
from gateway.metadata.source import MetadataSource, scope_of
from gateway.obs.metrics import Metrics
from gateway.origins.base import BucketInfo, ListPage, ObjectInfo
from gateway.origins.namespace import Mount, Namespace
from gateway.pieces import BlockRef, FileSegment, Piece
from gateway.read.first_block import FirstBlock, block_ref
from gateway.read.object_read import ObjectRead, Precondition
from gateway.read.readahead import ReadAheadPolicy, Streams, Window
from gateway.read.tickets import Known, Ticket, Tickets

T = TypeVar("T")


class Reader:
    """Answers reads for gateway buckets from the cache, filling it from origins."""

    def __init__(self, namespace: Namespace, blocks: BlockSource, source: MetadataSource,
                 coherence: Invalidator, metrics: Metrics, block_size: int,
                 hot: tuple[int, int], read_ahead: ReadAheadPolicy | None = None) -> None:  # fmt: skip
        """``source``: the metadata tiers; ``coherence``: what this node's writes (any
        worker's) made stale, caught up as every read starts; ``hot``: how many keys'
        tickets and block 0 names are kept (``core/hot_sets.py``: keys, urls)."""
        self.namespace = namespace
        self.blocks = blocks
        self._source = source
        self.metadata = source.memory  # this worker's metadata, looked up without an await
        self._coherence = coherence
        self.metrics = metrics
        self.block_size = block_size
        self.streams = Streams(read_ahead or ReadAheadPolicy(4, 4, 10.0))
        # (bucket, key) -> the mount and block 0 of the version last held (``_first_ref``)
        # (~300 bytes each, a hot set of ``hot[1]``: every fresh key adds one; a miss ~4 us)
        self._first_refs: OrderedDict[tuple[str, str], tuple[Mount, BlockRef]] = OrderedDict()
        tickets_kept, self._first_refs_kept = hot
        # A hit's lookups, kept per key while they hold.
        self._tickets = Tickets(self.metadata, tickets_kept)
        # Reads answered from a ticket's loan this turn, their bookkeeping still to do.
        self._later: list[tuple[Ticket, str, str]] = []
        # Told ``(bucket, key)`` of every object GET: epoch-order prefetch subscribes
        # (it looks keys up through this reader, so it is built after it).
        self.observers: list[Callable[[str, str], None]] = []
        # Told ``(mount, origin key, may_warm)`` of every read whose first block came
        # from the origin (a cold object): auto-warm subscribes (``warm/auto.py``).
        # ``may_warm``: whether the caller may warm the bucket (the S3 front knows).
        self.cold_reads: list[Callable[[Mount, str, bool], None]] = []
        # Told ``(mount, origin prefix, may_warm)`` of every listing page served to a client.
        self.client_listings: list[Callable[[Mount, str, bool], None]] = []

    async def list_buckets(self) -> list[BucketInfo]:
        return await self.namespace.list_buckets()

    async def head_bucket(self, bucket: str) -> Mount:
        mount = self.namespace.resolve(bucket)
        await mount.origin.head_bucket(mount.origin_bucket)
        return mount

    async def bucket_region(self, bucket: str) -> str:
        mount = await self.head_bucket(bucket)
        return await mount.origin.bucket_region(mount.origin_bucket)

    async def bucket_config(self, bucket: str, kind: str, fetch: Callable[[], Awaitable[T]]) -> T:
        """``bucket``'s ``kind`` configuration at its origin (its CORS rules): held for the
        mount's metadata TTL, forgotten by a write of the bucket through Hoard (any
        worker's: caught up first); a miss costs one ``fetch`` for every caller."""
        self.catch_up()
        return await self._source.bucket_config(self.namespace.resolve(bucket), kind, fetch)

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        info = await self._source.head(mount, mount.origin_key(key))
        return dataclasses.replace(info, key=key)

    async def open_object(
        self,
        bucket: str,
        key: str,
        byte_range: RangeSpec | None = None,
        precondition: Precondition | None = None,
        retry: bool = True,
        may_warm: bool = False,
    ) -> ObjectRead:
        """Open ``key`` for reading; ``precondition`` runs on the metadata before any range.

        ``retry``: an object found changed at the origin before the first byte
        (``ObjectRead.prime``) is opened once more, with fresh metadata.
        ``may_warm``: told to ``cold_reads`` (whether the caller may warm the bucket).
        """
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        self._observed(bucket, key)
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
        pieces = self._pieces(mount, okey, info, start, end, sources, may_warm)

        async def again() -> ObjectRead:
            return await self.open_object(
                bucket, key, byte_range, precondition, retry=False, may_warm=may_warm
            )

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
        general read that follows counts its lookup once. A key this worker's
        memory holds nothing of is looked up in the node's store first (a
        sibling worker learned it; never the origin), and is then held here.
        """
        self.catch_up()
        known = self._held_entry(bucket, key) or await self._stored_entry(bucket, key)
        if known is None:
            return None
        mount, okey, info, _ = known
        found = await self.blocks.cached(self._first_ref(bucket, key, mount, okey, info), 0,
                                         info.size)  # fmt: skip
        if found is None:
            return None
        # An entry held is served (stale ones while one refresh runs): the same object.
        again = self._held_entry(bucket, key)
        same = again is not None and again[:3] == known[:3]  # the entry may be a new one
        read = await self._metadata_for_read(mount, okey, None) if same else None
        return self._held_answer(bucket, key, info, read, found)

    def held_now(self, bucket: str, key: str) -> tuple[ObjectInfo, Piece, str] | bool:
        """``held`` without an await (the hit path answering inside the connection's
        protocol). Not held: False when ``held`` would find nothing either (neither
        this worker's memory nor the node's store knows the key as a held answer),
        True when only an await could tell (a disk block not yet looked up, the store
        busy, metadata to fetch), and then ``held`` tells."""
        self._coherence.catch_up()  # (``catch_up``, one call fewer on a hit's path)
        ticket = self._tickets.valid(bucket, key)
        if ticket is not None:
            loan = ticket.loan
            data = None if loan is None else loan.data
            if data is not None:  # the memory tier holds it still: what it would find
                self._served_later(ticket, bucket, key)
                return ticket.info, memoryview(data), "memory"
            leased = self._leased(ticket)
            if leased is not None:
                self._served_later(ticket, bucket, key)
                return ticket.info, leased, "disk"
            found = self.blocks.cached_held(ticket.ref, 0, ticket.info.size)
            if found is None:
                return True
            if found[1] == "memory":
                ticket.loan = self.blocks.lend(ticket.ref, ticket.info.size)
            elif isinstance(found[0], FileSegment):
                ticket.lease = self.blocks.lease(ticket.ref)
            self._tickets.used(ticket)
            self._observed(bucket, key)
            return ticket.info, *found
        known = self._held_entry(bucket, key)
        if known is None:
            try:
                known = self._stored_entry_now(bucket, key)
            except sqlite3.OperationalError:
                return True
            if known is None:
                return False
        mount, okey, info, entry = known
        ref = self._first_ref(bucket, key, mount, okey, info)
        found = self.blocks.cached_held(ref, 0, info.size)
        if found is None:
            return True
        # The entry ``_held_entry`` peeked at, served and counted without a second lookup:
        # nothing was awaited since, so it is still the one held.
        read = self._source.held_for_read(mount, okey, entry)
        answer = self._held_answer(bucket, key, info, read, found)
        if answer is None:
            return True
        loan = self.blocks.lend(ref, info.size) if answer[2] == "memory" else None
        lease = self.blocks.lease(ref) if isinstance(answer[1], FileSegment) else None
        self._tickets.keep(bucket, key, known, ref, answer[0], loan, lease)
        return answer

    def ticket(self, bucket: str, key: str) -> Ticket | None:
        """``key``'s ticket, made by the ``held_now`` that just answered it (nothing awaited
        since), for a caller that will ask ``held_again`` for the same key."""
        return self._tickets.peek(bucket, key)

    def held_again(self, ticket: Ticket, bucket: str, key: str) -> bytes | FileSegment | None:
        """``held_now`` of ``key`` through its ``ticket``, kept by the caller, when the
        answer is the ticket's loan (its bytes) or lease (its packed record, to release
        when sent): the whole object, ``ticket.info``; None when ``held_now`` must tell
        (the ticket void, the loan ended, the lease run out: any change of the key or
        its block, by any worker, since)."""
        self._coherence.catch_up()
        # ``held_now``'s use of a loan, written again: a shared helper measured +650
        # instructions a repeat (a Python frame), for three lines.
        loan = ticket.loan
        held: bytes | FileSegment | None = None if loan is None else loan.data
        if held is None and ticket.lease is None:
            return None
        if not self.metadata.still_held(ticket.mark, ticket.fresh_until):
            return None
        if held is None:
            held = self._leased(ticket)
            if held is None:
                return None
        self._served_later(ticket, bucket, key)
        return held

    def _leased(self, ticket: Ticket) -> FileSegment | None:
        """The ticket's packed record lent again by its lease, if it still holds."""
        lease = ticket.lease
        packed = None if lease is None else lease.again()
        if packed is None:
            return None
        return FileSegment(packed.fd, packed.data_offset, packed.length, packed.close)

    def _served_later(self, ticket: Ticket, bucket: str, key: str) -> None:
        """What a read answered from a ticket's loan or lease does besides finding the
        bytes (a loan's block marked recently used, a lease marking its own; the
        metadata counted as a hit, the observers told),
        done at the end of the loop's turn for every such read of the turn, in order:
        the same work, done together, costs a hit less than done one by one."""
        later = self._later
        later.append((ticket, bucket, key))
        if len(later) > 1:
            return
        try:
            asyncio.get_running_loop().call_soon(self._serve_later)
        except RuntimeError:  # no loop (a script): now
            self._serve_later()

    def _serve_later(self) -> None:
        later, self._later = self._later, []
        renew, observers = self.blocks.memory.renew, self.observers
        uses: dict[str, tuple[Ticket, int]] = {}  # a mount's label -> a ticket, reads
        for ticket, bucket, key in later:
            loan = ticket.loan  # (another since, if re-lent: the same block; None: gone)
            if loan is not None:
                renew(loan)
            held = uses.get(ticket.label)
            uses[ticket.label] = (ticket, 1) if held is None else (ticket, held[1] + 1)
            for observe in observers:  # (``_observed``, one call fewer a read)
                observe(bucket, key)
        for ticket, times in uses.values():
            self._tickets.used(ticket, times)

    def size_now(self, bucket: str, key: str) -> int | None:
        """``key``'s size as a read would find it, without an await: its metadata held in
        this worker's memory and served as ``open_object`` serves it (fresh, or stale
        with one refresh started), the lookup counted as a read's; None when only an await
        can tell (nothing held, a negative entry, a TTL of 0), and ``block_refs`` tells.
        For a batch that must know every key is there before its first byte."""
        self.catch_up()
        mount = self.namespace.resolve(bucket)
        if mount.metadata_ttl <= 0:  # asks the origin on every read
            return None
        info = self._source.held_for_read(mount, mount.origin_key(key))
        return None if info is None else info.size

    async def _stored_entry(self, bucket: str, key: str) -> Known | None:
        """``_held_entry`` for a key this worker's memory holds nothing of but the node's
        store does (a sibling worker learned it): it is held in memory from now on."""
        mount = self.namespace.resolve(bucket)
        if await self._source.held_in_store(mount, mount.origin_key(key)) is None:
            return None
        return self._held_entry(bucket, key)

    def _stored_entry_now(self, bucket: str, key: str) -> Known | None:
        """``_stored_entry`` on the loop alone; raises ``sqlite3.OperationalError`` if
        the store is busy."""
        mount = self.namespace.resolve(bucket)
        if self._source.held_in_store_now(mount, mount.origin_key(key)) is None:
            return None
        return self._held_entry(bucket, key)

    def _held_entry(self, bucket: str, key: str) -> Known | None:
        """The mount, origin key and held metadata of an object of one block (not empty),
        and the metadata's entry (``held_now`` serves it without looking it up again)."""
        mount = self.namespace.resolve(bucket)
        okey = mount.origin_key(key)
        entry = self.metadata.known_entry(scope_of(mount), okey)
        # A TTL of 0 asks the origin on every read: nothing held is an answer by itself.
        if entry is None or mount.metadata_ttl <= 0 or not 0 < entry.value.size <= self.block_size:
            return None
        return mount, okey, entry.value, entry

    def _first_ref(
        self, bucket: str, key: str, mount: Mount, okey: str, info: ObjectInfo
    ) -> BlockRef:
        """Block 0 of ``info`` (an object of one block), kept per (bucket, key) while the
        mount and the version stay: a hit names the same block every time, and building
        it anew (a frozen ``BlockId``, its digest for a disk lookup) cost ~3-4 µs a hit."""
        kept = self._first_refs.get((bucket, key))
        if kept is not None and (kept[0] is mount or kept[0] == mount):
            ref = kept[1]
            if ref.block.etag == info.etag and ref.last == info.size - 1:
                return ref
        ref = self._ref(mount, okey, info, 0)
        self._first_refs[(bucket, key)] = (mount, ref)
        if len(self._first_refs) > self._first_refs_kept:
            self._first_refs.popitem(last=False)
        return ref

    def _held_answer(
        self, bucket: str, key: str, info: ObjectInfo, read: ObjectInfo | None,
        found: tuple[Piece, str],
    ) -> tuple[ObjectInfo, Piece, str] | None:  # fmt: skip
        """``found`` as the answer if the metadata read for it is the one it was found by."""
        if read is not info:
            if isinstance(found[0], FileSegment):
                found[0].release()
            return None
        self._observed(bucket, key)
        client_info = info if info.key == key else dataclasses.replace(info, key=key)
        return client_info, *found

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
        query = mount.origin_query(prefix, delimiter, start_after, max_keys)
        page = await self._source.listing(mount, *query)
        return mount.client_page(page) if mount.prefix else page

    async def list_objects_body(
        self,
        bucket: str,
        query: tuple[str, str, str, int],
        render: Callable[[ListPage], bytes],
        variant: Hashable,
        may_warm: bool = False,
    ) -> bytes:
        """``list_objects``' page of ``query`` (prefix, delimiter, start_after,
        max_keys) as ``render`` makes it, rendered once per cached listing and
        ``variant`` (all else the bytes depend on, the bucket's name aside);
        ``may_warm`` is told to ``client_listings``."""
        self.catch_up()
        mount = self.namespace.resolve(bucket)

        def render_page(page: ListPage) -> bytes:
            return render(mount.client_page(page) if mount.prefix else page)

        origin_query = mount.origin_query(*query)
        body = await self._source.listing_body(mount, origin_query, render_page, (bucket, variant))
        for listed in self.client_listings:
            listed(mount, origin_query[0], may_warm)
        return body

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

    def _observed(self, bucket: str, key: str) -> None:
        for observe in self.observers:
            observe(bucket, key)

    def mount_label(self, bucket: str) -> str:
        return self.namespace.label(bucket)

    def catch_up(self) -> None:
        """Apply what sibling workers invalidated (``coherence/``): every read starts so."""
        self._coherence.catch_up()

    # -- metadata and bytes --------------------------------------------------------------

    async def _metadata_for_read(
        self, mount: Mount, okey: str, byte_range: RangeSpec | None, admit: bool | None = None
    ) -> ObjectInfo:
        """The miss strategy of a read: the block the client needs answers the metadata
        too, unless the size must be known first (a suffix range) or, in a cluster, the
        block may be owned elsewhere: then a HEAD."""
        if (byte_range is not None and byte_range.suffix is not None) or self.blocks.clustered:
            return await self._source.for_read(mount, okey, None)
        index = (byte_range.first or 0) // self.block_size if byte_range else 0
        miss = FirstBlock(self.blocks, self._source, self.block_size, mount, okey, index, admit)
        return await self._source.for_read(mount, okey, miss)

    def _ref(self, mount: Mount, okey: str, info: ObjectInfo, index: int) -> BlockRef:
        return block_ref(mount, okey, info, index, self.block_size)

    async def _pieces(
        self, mount: Mount, okey: str, info: ObjectInfo, start: int, end: int,
        sources: Counter[str], may_warm: bool,
    ) -> AsyncIterator[Piece]:  # fmt: skip
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
                ahead = self.streams.policy.ahead(window, span.index, limit)
                if ahead:
                    self.blocks.read_ahead([self._ref(mount, okey, info, j) for j in ahead])
                ref = self._ref(mount, okey, info, span.index)
                block_sources: Counter[str] = Counter()
                async for piece in self.blocks.pieces(ref, span.offset, span.length, block_sources):
                    yield piece
                sources.update(block_sources)
                if span.index == 0 and "origin" in block_sources:
                    for cold in self.cold_reads:
                        cold(mount, okey, may_warm)
                # A fill this reader had to wait for, past the stream's first block:
                # it consumes faster than read-ahead lands blocks.
                if (i > 0 or sequential) and block_sources.keys() & {"origin", "peer"}:
                    self.metrics.read_ahead_window.observe(self.streams.policy.caught_up(window))
        except OriginChanged:
            # Every tier at once: the next read (or this one's retry) sees the new version.
            await self._coherence.heal(mount, okey)
            raise

    def _stream_window(
        self, mount: Mount, okey: str, info: ObjectInfo, start: int, end: int
    ) -> tuple[Window, bool]:
        """The read-ahead window of this object's stream, and whether this range continues it."""
        marker = BlockId(mount.origin.name, mount.origin_bucket, okey, info.etag, -1)
        window, sequential, size = self.streams.follow(marker, start, end, self.block_size)
        self.metrics.read_ahead_window.observe(size)
        return window, sequential
