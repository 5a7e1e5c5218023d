"""Where the bytes of one block come from: memory tier → disk tier → a fill from the origin.

``BlockSource.pieces`` yields what a client needs of one block, as ``bytes``
(memory, or a fill in progress) or as a ``FileSegment`` of a verified block
file (the S3 front sends those with sendfile). A miss starts a *fill*: one
origin request per block, owned by the ``FlightGroup`` rather than by the
client that caused it, streamed to every waiter as it arrives and written to
the disk tier at the same time.

Two interleaved readers show why a fill re-checks the disk before going to the
origin: A misses on disk, B misses on disk, A's fill completes and leaves the
group, then B starts its fill — without the re-check, B would fetch the block
a second time. Workers of one node coordinate through the disk tier's fill
claims: the worker that loses the claim tails the winner's part file.

Concurrent fills are bounded (``fill_slots``) because each holds its block in
memory while it runs.

In a cluster (``placement`` given) a block this node does not own is read from
memory or disk if it happens to be there, else through a *peer fill*: one per
block on this node (``remote``, a group apart from origin fills so that two
nodes asking each other never wait on each other's flights), streamed from the
owner and kept in the memory tier only, never on disk. ``local=True`` (a peer
asking this node) always takes the owner's path: tiers, then the origin.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from gateway import errors
from gateway.cache.block import BlockId
from gateway.cache.disk import BlockWriter, DiskTier, FillAbandoned
from gateway.cache.memory import MemoryTier
from gateway.cache.singleflight import Flight, FlightGroup
from gateway.cluster.placement import Placement
from gateway.metrics import Metrics
from gateway.origins.base import ObjectStream, Origin

log = logging.getLogger(__name__)

_TAIL_CHUNK = 1024 * 1024


@dataclass(slots=True)
class FileSegment:
    """``count`` bytes at ``offset`` of an open file; ``release()`` when sent."""

    fd: int
    offset: int
    count: int
    release: Callable[[], None]


Piece = bytes | memoryview | FileSegment


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One block of one object version, with where to fetch it from."""

    block: BlockId
    origin: Origin
    first: int  # inclusive byte range of the block within the object
    last: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1


class BlockSource:
    def __init__(
        self,
        memory: MemoryTier,
        disk: DiskTier | None,
        metrics: Metrics,
        fill_slots: int = 16,
        placement: Placement | None = None,
    ) -> None:
        self.memory = memory
        self.disk = disk
        self.metrics = metrics
        self.placement = placement
        self.fills: FlightGroup[BlockId] = FlightGroup()
        self.remote: FlightGroup[BlockId] = FlightGroup()  # peer fills (not owned here)
        self._slots = asyncio.Semaphore(fill_slots)
        # Peer fills have slots of their own: sharing them with origin fills would let
        # two nodes wait on each other, each with its slots held by requests to the other.
        self._peer_slots = asyncio.Semaphore(fill_slots)
        self._background: set[asyncio.Task[None]] = set()

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
        sources: set[str] | None = None,
        local: bool = False,
    ) -> AsyncIterator[Piece]:
        """The bytes [offset, offset+length) of the block, from the fastest tier that has them.

        ``sources`` collects the tiers used (for the request's log line);
        ``local`` serves as an owner whatever the ranking says (a peer's request).
        """
        seen = sources if sources is not None else set()
        cached = self.memory.get(ref.block)
        if cached is not None:
            seen.add("memory")
            self.metrics.served(memory=length)
            yield memoryview(cached)[offset : offset + length]
            return
        if self.fills.get(ref.block) is None and self.disk is not None:
            found = await self.disk.get(ref.block)
            if found is not None:
                seen.add("disk")
                self.metrics.served(disk=length)
                yield FileSegment(found.fd, found.data_offset + offset, length, found.close)
                return
        if not local and self.fills.get(ref.block) is None and not self.owns(ref):
            seen.add("peer")
            async for piece in self._peer_fill(ref).read(offset, length):
                self.metrics.served(peer=len(piece))
                yield piece
            return
        flight = self.fill(ref)
        seen.add("origin")
        async for piece in flight.read(offset, length):
            self.metrics.served(origin=len(piece))
            yield piece

    def fill(self, ref: BlockRef, stream: ObjectStream | None = None) -> Flight:
        """The fill of ``ref``'s block, started unless one is running (coalesced)."""
        flight, started = self.fills.join_or_start(
            ref.block, ref.length, lambda f: self._fill(ref, f, stream)
        )
        if not started:
            self.metrics.coalesced_waiters.inc()
            if stream is not None:
                self._spawn(stream.aclose())
        return flight

    def read_ahead(self, refs: list[BlockRef]) -> None:
        """Start fills of the next blocks in the background unless they are cached."""
        for ref in refs:
            if self.memory.get(ref.block) is not None or self.fills.get(ref.block) is not None:
                continue
            if not self.owns(ref):
                if self.remote.get(ref.block) is None and self.memory.admits(ref.length):
                    self._peer_fill(ref)  # into the memory tier only
                continue
            self._spawn(self._prefetch(ref))

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
            self.metrics.coalesced_waiters.inc()
        return flight

    async def _fill_from_peers(self, ref: BlockRef, flight: Flight) -> None:
        assert self.placement is not None
        async with self._peer_slots:
            await self.placement.fetch(ref, flight)
            if flight.received < ref.length:  # every owner failed: the rest from the origin
                start = ref.first + flight.received
                async with await self._open(ref, start) as stream:
                    if (stream.start, stream.end) != (start, ref.last):
                        raise errors.OriginUnavailable("the origin ignored a block's range")
                    async for chunk in stream.chunks():
                        flight.append(chunk)
                        self.metrics.origin_bytes.labels(ref.block.origin).inc(len(chunk))
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

    def _spawn(self, work: object) -> None:
        task = asyncio.ensure_future(work)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _fill(self, ref: BlockRef, flight: Flight, stream: ObjectStream | None) -> None:
        async with self._slots:
            if stream is None and await self._from_disk(ref, flight):
                return
            writer = await self._begin(ref)
            if writer is None and self.disk is not None and stream is None:
                if await self._follow(ref, flight):
                    return
                writer = await self._begin(ref)
            if stream is None:
                stream = await self._open(ref)
            await self._copy(ref, stream, flight, writer)

    async def _begin(self, ref: BlockRef) -> BlockWriter | None:
        if self.disk is None:
            return None
        try:
            return await self.disk.begin(ref.block, ref.length)
        except OSError as exc:
            # Disk full or failing: serve from the origin without caching this block.
            log.error("disk tier cannot take block %s: %s", ref.block.digest, exc)
            return None

    async def _from_disk(self, ref: BlockRef, flight: Flight) -> bool:
        """The re-check inside the flight: another fill may have landed the block meanwhile."""
        if self.disk is None:
            return False
        found = await self.disk.get(ref.block)
        if found is None:
            return False
        try:
            data = await asyncio.to_thread(os.pread, found.fd, found.length, found.data_offset)
        finally:
            found.close()
        flight.append(data)
        return True

    async def _open(self, ref: BlockRef, start: int | None = None) -> ObjectStream:
        block = ref.block
        first = ref.first if start is None else start
        with self.metrics.origin_call(block.origin, "GetObject"):
            return await ref.origin.get_object(
                block.bucket, block.key, (first, ref.last), if_match=block.etag
            )

    async def _copy(
        self, ref: BlockRef, stream: ObjectStream, flight: Flight, writer: BlockWriter | None
    ) -> None:
        committed = False
        try:
            async with stream:
                async for chunk in stream.chunks():
                    flight.append(chunk)
                    self.metrics.origin_bytes.labels(ref.block.origin).inc(len(chunk))
                    if writer is not None:
                        writer = await self._write(writer, chunk)
            flight.finish()
            if writer is not None:
                committed = await writer.commit()
            if self.memory.admits(ref.length):
                self.memory.put(ref.block, flight.data())
        finally:
            if writer is not None and not committed:
                await writer.abort()

    async def _write(self, writer: BlockWriter, chunk: bytes) -> BlockWriter | None:
        try:
            await writer.write(chunk)
            return writer
        except OSError as exc:
            # Disk full or failing: keep serving from the origin, cache nothing torn.
            log.error("disk tier write failed, serving without caching: %s", exc)
            await writer.abort()
            return None

    async def _follow(self, ref: BlockRef, flight: Flight) -> bool:
        """Another worker of this node is filling the block: tail its part file."""
        assert self.disk is not None
        follower = await self.disk.follow(ref.block)
        if follower is None:
            return await self._from_disk(ref, flight)
        try:
            have = 0
            while have < ref.length:
                available = await follower.wait_for(min(have + _TAIL_CHUNK, ref.length))
                data = await asyncio.to_thread(
                    os.pread, follower.fd, available - have, follower.data_offset + have
                )
                flight.append(data)
                have += len(data)
            return True
        except FillAbandoned:
            if flight.received:
                raise errors.OriginUnavailable("a worker's fill was abandoned mid-block") from None
            return False
        finally:
            follower.close()

    async def close(self) -> None:
        await self.fills.close()
        await self.remote.close()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
