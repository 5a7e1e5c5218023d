"""Where the bytes of one block come from: memory tier → disk tier → a fill from the origin.

``BlockSource.pieces`` yields what a client needs of one block, as ``bytes``
(memory, or a fill in progress) or as a ``FileSegment`` of a verified block
file (the S3 front sends those with sendfile). A miss starts a *fill*: one
origin request per block, owned by the ``FlightGroup`` rather than by the
client that caused it, streamed to every waiter as it arrives and written to
the disk tier at the same time. What runs inside a fill's flight (the disk
re-checked, the claim taken or a sibling worker's part file tailed, handoff,
the origin, the commit), and why, is ``fill.py``'s; fills are bounded
by ``fill_slots``. Read-ahead and preloads run at background priority
(``priority.py``).

With an admission policy (``cache/admission.py``) a demand fill writes its
block to disk only if the policy admits it; otherwise the block is served
from the origin and *staged* in the memory tier, and promoted to disk when
read again (``cache/staging.py``). ``preload`` (epoch-order prefetch) is
admitted always: the client said it will read the block.

In a cluster (``placement`` given) a block this node does not own is read from
memory or disk if it happens to be there, else through a *peer fill*: one per
block on this node (``remote``, a group apart from origin fills so that two
nodes asking each other never wait on each other's flights), streamed from the
owner and kept in the memory tier only, never on disk. ``local=True`` (a peer
asking this node) always takes the owner's path: tiers, then the origin;
``cached_only=True`` (a new owner asking) stops after the tiers. An owner's
fill asks the nodes ranked after it before the origin (handoff, in
``fill.py``), so growing the cluster does not re-download the dataset.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Protocol

from gateway.blocks.fill import Filler
from gateway.cache.admission import Doorkeeper
from gateway.cache.block import BlockId
from gateway.cache.disk import BlockFile, DiskTier
from gateway.cache.memory import Loan, MemoryTier
from gateway.cache.segment_leases import Lease
from gateway.cache.singleflight import Flight, FlightGroup
from gateway.cache.staging import Staging
from gateway.cluster.peers import PeerNotCached
from gateway.cluster.placement import Placement
from gateway.core import priority
from gateway.core.tasks import TaskSet
from gateway.origins.base import ObjectStream
from gateway.pieces import BlockRef, FileSegment, Piece


class BlockEvents(Protocol):
    """What the block source reports (``metric_events.BlockMetrics``)."""

    def coalesced(self) -> None: ...
    def admission_rejected(self) -> None: ...
    def from_origin(self, origin: str, size: int) -> None: ...


class BlockSource:
    def __init__(
        self,
        memory: MemoryTier,
        disk: DiskTier | None,
        events: BlockEvents,
        fill_slots: int = 16,
        placement: Placement | None = None,
        admission: Doorkeeper | None = None,
    ) -> None:
        self.memory = memory
        self.disk = disk
        self.events = events
        self.placement = placement
        self.fills: FlightGroup[BlockId] = FlightGroup()
        self.remote: FlightGroup[BlockId] = FlightGroup()  # peer fills (not owned here)
        # Peer fills have slots of their own: sharing them with origin fills would let
        # two nodes wait on each other, each with its slots held by requests to the other.
        self._peer_slots = asyncio.Semaphore(fill_slots)
        self._background = TaskSet()
        self._staging = Staging(memory, disk, admission, events, self._background.spawn)
        self._filler = Filler(memory, disk, events, self._staging, placement, fill_slots)

    @property
    def clustered(self) -> bool:
        """Whether blocks may be owned by another live node."""
        return self.placement is not None and self.placement.clustered

    def owns(self, ref: BlockRef) -> bool:
        return self.placement is None or self.placement.owns(ref.block.digest)

    async def pieces(
        self,
        ref: BlockRef,
        offset: int,
        length: int,
        sources: Counter[str] | None = None,
        local: bool = False,
        cached_only: bool = False,
    ) -> AsyncIterator[Piece]:
        """The bytes [offset, offset+length) of the block, from the fastest tier that has them.

        ``sources`` tallies the bytes yielded by tier (for the request's log
        line and metrics); ``local`` serves as an owner whatever the ranking
        says (a peer's request); ``cached_only`` raises ``PeerNotCached``
        instead of filling.
        """
        seen = sources if sources is not None else Counter()
        found = await self.cached(ref, offset, length)
        if found is not None:
            piece, tier = found
            seen[tier] += length
            yield piece
            return
        if cached_only:
            raise PeerNotCached(f"block {ref.block.digest} is not cached here")
        if not local and self.fills.get(ref.block) is None and not self.owns(ref):
            async for piece in self._peer_fill(ref).read(offset, length):
                seen["peer"] += len(piece)
                yield piece
            return
        flight = self.fill(ref)
        async for piece in flight.read(offset, length):
            seen["origin"] += len(piece)
            yield piece

    async def cached(self, ref: BlockRef, offset: int, length: int) -> tuple[Piece, str] | None:
        """The bytes [offset, offset+length) of the block if this node holds it, and the tier
        ("memory" or "disk"); None for a miss. Nothing is fetched.

        The disk is not asked while a fill of the block runs: its file is not
        complete yet, and the fill's waiters get the bytes as they arrive.
        """
        held = self.cached_held(ref, offset, length)
        if held is not None or self.fills.get(ref.block) is not None or self.disk is None:
            return held
        return _on_disk(await self.disk.get(ref.block), offset, length)

    def cached_held(self, ref: BlockRef, offset: int, length: int) -> tuple[Piece, str] | None:
        """``cached`` when no await is needed (memory, or a disk block ``Disk.get_held``
        finds); None otherwise, and then ``cached`` tells."""
        cached = self.memory.get(ref.block)
        if cached is not None:
            staged = self._staging.digests
            if staged and ref.block.digest in staged:  # a digest is a hash to compute
                self._staging.hit(ref.block, cached)
            return memoryview(cached)[offset : offset + length], "memory"
        if self.fills.get(ref.block) is None and self.disk is not None:
            return _on_disk(self.disk.get_held(ref.block), offset, length)
        return None

    def lend(self, ref: BlockRef, size: int) -> Loan | None:
        """The memory tier's loan of ``ref``'s block (``MemoryTier.lend``) if it holds all
        ``size`` bytes of it, and the block is not staged (a staged block's hits are
        counted, one by one, toward its promotion); None otherwise."""
        staged = self._staging.digests
        if staged and ref.block.digest in staged:
            return None
        return self.memory.lend(ref.block, size)

    def lease(self, ref: BlockRef) -> Lease | None:
        """The disk tier's lease of ``ref``'s packed record (``segment_leases.py``), just
        found by ``cached_held``; None: not such a record, or no disk tier."""
        return None if self.disk is None else self.disk.lease(ref.block)

    def fill(self, ref: BlockRef, admit: bool | None = None) -> Flight:
        """The fill of ``ref``'s block, started unless one is running (coalesced).

        ``admit`` True writes the block to disk whatever the admission policy
        says (an explicit prefetch: the block is known to be read soon); None
        asks the policy when the fill starts.
        """
        flight = self.fills.get(ref.block)
        if flight is not None and flight.adopter_to_come:
            flight.adopter_to_come = False  # the reader whose metadata miss opened it
            return flight
        flight, started = self.fills.join_or_start(
            ref.block, ref.length, lambda f: self._filler.fill(ref, f, admit)
        )
        if not started:
            self.events.coalesced()
        return flight

    async def adopt(self, ref: BlockRef, stream: ObjectStream, admit: bool | None = None) -> None:
        """Fill ``ref``'s block from ``stream``, an origin GET already open for it.

        The block is claimed on disk before this returns: a sibling worker that
        learns of the object from the shared metadata store right after then
        finds the claim and tails this fill (a packed block's: waits for its group
        commit, ``cache/packed_claims.py``) instead of asking the origin again.
        No fill slot is taken: the stream already holds an origin concurrency
        slot, and waiting for a fill slot with it while fills holding fill slots
        wait for origin slots would deadlock (these are bounded by the origin's cap).
        """
        if self.fills.get(ref.block) is not None:
            self.events.coalesced()
            await stream.aclose()
            return
        try:
            admitted = bool(admit or self._staging.admits(ref.block))
            writer = await self._filler.begin(ref) if admitted else None
        except BaseException:
            await stream.aclose()
            raise
        flight, started = self.fills.join_or_start(
            ref.block, ref.length,
            lambda f: self._filler.copy(ref, stream, f, writer, stage=not admitted),
        )  # fmt: skip
        if started:
            flight.adopter_to_come = True
        else:  # a local fill began while the claim was taken
            self.events.coalesced()
            if writer is not None:
                await writer.abort()
            await stream.aclose()

    def read_ahead(self, refs: list[BlockRef]) -> None:
        """Start fills of the next blocks in the background unless they are cached.

        They run at background priority: at a busy origin, a client's miss goes first.
        """
        with priority.background():  # copied into the tasks started below
            for ref in refs:
                self._read_ahead_one(ref)

    def _read_ahead_one(self, ref: BlockRef) -> None:
        if self.memory.get(ref.block) is not None or self.fills.get(ref.block) is not None:
            return
        if not self.owns(ref):
            if self.remote.get(ref.block) is None and self.memory.admits(ref.length):
                self._peer_fill(ref)  # into the memory tier only
            return
        self._background.spawn(self._prefetch(ref))

    async def preload(self, ref: BlockRef) -> int:
        """Get ``ref``'s block cached where it belongs; the bytes fetched for it (0: cached).

        An owned block is filled to disk, past the admission policy (whoever
        preloads knows it will be read). A block owned by another node goes
        through a peer fill, which makes its owner fill it; this node keeps a
        copy only if its memory tier takes it. Returns when the bytes are in
        and, for an owned block, its fill has returned (the block committed to
        disk, which a group commit may hold back a little: what a stream reports
        fetched outlives its worker); raises what the fill raised.
        """
        if self.memory.get(ref.block) is not None:
            return 0
        if self.owns(ref):
            flight = self.fills.get(ref.block)
            if flight is None and self.disk is not None:
                found = await self.disk.get(ref.block)
                if found is not None:
                    found.close()
                    return 0
            flight = self.fill(ref, admit=True)
        else:
            flight = self.remote.get(ref.block) or self._peer_fill(ref)
        async for _ in flight.read():  # views of bytes already held: nothing is copied
            pass
        if self.owns(ref):
            await self.fills.settled(ref.block)
        return ref.length

    async def warm(self, ref: BlockRef) -> bool:
        """Make the disk tier hold ``ref``'s block (an owner's job); True if it was fetched.

        The same fill path as a client miss (coalesced with one in flight), and
        it returns once the fill has returned, so the block is committed to disk
        (or could not be: a disk error is logged by the fill). Raises what the
        fill raised (``NoSuchKey``, ``OriginChanged``, ``OriginUnavailable``).
        """
        if self.disk is not None:
            found = await self.disk.get(ref.block)
            if found is not None:
                found.close()
                return False
        flight = self.fill(ref)
        await self.fills.settled(ref.block)
        async for _ in flight.read(0, ref.length):  # raises the fill's error, if any
            pass
        return True

    def _peer_fill(self, ref: BlockRef) -> Flight:
        """The peer fill of a block owned elsewhere, started unless one is running."""
        flight, started = self.remote.join_or_start(
            ref.block, ref.length, lambda f: self._fill_from_peers(ref, f)
        )
        if not started:
            self.events.coalesced()
        return flight

    async def _fill_from_peers(self, ref: BlockRef, flight: Flight) -> None:
        assert self.placement is not None
        async with self._peer_slots:
            await self.placement.fetch(ref, flight)
            if flight.received < ref.length:  # every owner failed: the rest from the origin
                async with await self._filler.open_rest(ref, flight) as stream:
                    await self._filler.pour(ref, stream.chunks(), flight, None, origin=True)
            flight.finish()
            if flight.received == ref.length and self.memory.admits(ref.length):
                self.memory.put(ref.block, flight.data())

    async def _prefetch(self, ref: BlockRef) -> None:
        if self.disk is not None:
            found = await self.disk.get(ref.block)
            if found is not None:
                found.close()
                return
        if self.fills.get(ref.block) is None:
            self.fill(ref)

    async def drop_object(self, origin: str, bucket: str, key: str) -> None:
        """Forget every cached block of ``key`` (every version), in memory and on disk."""
        self.memory.discard_where(
            lambda b: b.key == key and b.bucket == bucket and b.origin == origin
        )
        if self.disk is not None:
            await self.disk.drop_object(origin, bucket, key)

    async def drop_prefix(self, origin: str, bucket: str, prefix: str) -> dict[str, int]:
        """Forget every cached block under ``prefix``; the blocks dropped, by tier."""
        memory = self.memory.discard_where(
            lambda b: b.origin == origin and b.bucket == bucket and b.key.startswith(prefix)
        )
        disk = await self.disk.drop_prefix(origin, bucket, prefix) if self.disk else 0
        return {"memory_blocks": memory, "disk_blocks": disk}

    async def close(self) -> None:
        await self.fills.close()
        await self.remote.close()
        await self._background.cancel()


def _on_disk(found: BlockFile | None, offset: int, length: int) -> tuple[Piece, str] | None:
    if found is None:
        return None
    return FileSegment(found.fd, found.data_offset + offset, length, found.close), "disk"
