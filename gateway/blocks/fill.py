"""A fill of a block this node owns: disk re-checked, claimed or followed, then poured.

``BlockSource`` decides which tier answers a read and starts one fill per
missing block in its flight group; this module is what runs inside that
flight, with the data it needs (the tiers, the admission policy's staging,
the cluster's ranking for handoff, and the fill slots).

Two interleaved readers show why a fill re-checks the disk before going to the
origin: A misses on disk, B misses on disk, A's fill completes and leaves the
group, then B starts its fill — without the re-check, B would fetch the block
a second time. Workers of one node coordinate through the disk tier's fill
claims: the worker that loses the claim tails the winner's part file, or, for a
packed block (which has none), waits for the winner's group commit.

Concurrent fills are bounded (``fill_slots``) because each holds its block in
memory while it runs; fills fed by a metadata miss's GET (``BlockSource.adopt``,
which calls ``copy`` directly) are bounded by the origin's concurrency cap
instead.

An owner's fill asks the nodes ranked after it before the origin (``handoff``):
after a node joins, the blocks it now owns are still on their previous owners,
which rank right after it, so growing the cluster does not re-download the
dataset. What they send is written to this node's disk as an origin fill is;
a block none of them holds, or the rest of one whose sender failed, comes from
the origin: one ranged GET with ``If-Match`` set to the block's ETag, so
versions are never mixed (``open_rest``).

A disk that fails mid-fill costs only the copy on disk: the bytes still reach
every waiter, and nothing torn is committed. A write that met a full disk is
stored once more if a room-making pass ran meanwhile (``_store_after_room``).

Not guaranteed: that a fill's block lands on disk (a full or failing disk, a
claim held elsewhere, the admission policy); its waiters get the bytes anyway.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Protocol

from gateway.cache.disk import BlockWriter, DiskTier, FillAbandoned
from gateway.cache.memory import MemoryTier
from gateway.cache.singleflight import Flight
from gateway.cache.staging import Staging
from gateway.cluster.placement import Placement
from gateway.core import errors
from gateway.origins.base import ObjectStream
from gateway.pieces import BlockRef


class OriginBytes(Protocol):
    """What a fill reports (one of ``blocks.BlockEvents``): bytes that came from an origin."""

    def from_origin(self, origin: str, size: int) -> None: ...


class Filler:
    """What runs inside the flight of a block this node fills (``BlockSource.fill``,
    ``adopt``, and a peer fill's rest from the origin)."""

    def __init__(
        self,
        memory: MemoryTier,
        disk: DiskTier | None,
        events: OriginBytes,
        staging: Staging,
        placement: Placement | None,
        fill_slots: int,
    ) -> None:
        self.memory = memory
        self.disk = disk
        self.events = events
        self.placement = placement
        self._staging = staging
        self._slots = asyncio.Semaphore(fill_slots)

    async def fill(self, ref: BlockRef, flight: Flight, admit: bool | None) -> None:
        """Fill ``flight`` with ``ref``'s block, within a fill slot: from the disk if a
        fill landed it meanwhile, else claimed (or a sibling's fill tailed) and copied;
        ``admit`` as ``BlockSource.fill`` takes it."""
        async with self._slots:
            if await self._from_disk(ref, flight):
                return
            if not (admit or self._staging.admits(ref.block)):
                # Kept off the disk: served from the origin, and kept in memory if it fits.
                await self.copy(ref, None, flight, None, stage=True)
                return
            writer = await self.begin(ref)
            if writer is None and self.disk is not None:
                if await self._follow(ref, flight):
                    return
                writer = await self.begin(ref)
            await self.copy(ref, None, flight, writer)

    async def begin(self, ref: BlockRef) -> BlockWriter | None:
        """Claim ``ref``'s block on disk; None without a disk, with the claim held
        elsewhere, or with the disk failing (then the block is served, not stored)."""
        if self.disk is None:
            return None
        try:
            return await self.disk.begin(ref.block, ref.length)
        except OSError:
            # Disk full or failing (the tier logs it, and makes room if full):
            # serve from the origin without caching this block.
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

    async def open_rest(self, ref: BlockRef, flight: Flight) -> ObjectStream:
        """The origin stream of the block's bytes ``flight`` does not have yet."""
        if not flight.received:
            return await self._open(ref)
        start = ref.first + flight.received
        stream = await self._open(ref, start)
        if (stream.start, stream.end) != (start, ref.last):
            await stream.aclose()
            raise errors.OriginUnavailable("the origin ignored a block's range")
        return stream

    async def _open(self, ref: BlockRef, start: int | None = None) -> ObjectStream:
        block = ref.block
        first = ref.first if start is None else start
        return await ref.origin.get_object(
            block.bucket, block.key, (first, ref.last), if_match=block.etag
        )

    async def copy(
        self,
        ref: BlockRef,
        stream: ObjectStream | None,
        flight: Flight,
        writer: BlockWriter | None,
        stage: bool = False,
    ) -> None:
        """Fill ``flight`` (and ``writer``) from ``stream``, else from the nodes ranked
        after this one and then the origin; land the block in the tiers.

        ``stage``: the block was kept off the disk, so the memory tier takes it even
        above ``max_item``: a reader that joins just after the fill (the first-block
        metadata fill, read-ahead) must still find it, or it would fetch it again.
        """
        committed = False
        began = writer is not None
        rooms = self.disk.rooms_made if self.disk is not None else 0
        try:
            if stream is None and self.placement is not None:
                async with aclosing(self.placement.handoff(ref)) as handoff:
                    writer = await self.pour(ref, handoff, flight, writer, origin=False)
            if flight.received < ref.length:
                async with stream or await self.open_rest(ref, flight) as origin:
                    writer = await self.pour(ref, origin.chunks(), flight, writer, origin=True)
            flight.finish()
            if writer is not None:
                committed = await writer.commit()
            if began and not committed and self.disk is not None:
                committed = await self._store_after_room(ref, flight, rooms)
            if stage:
                self._staging.stage(ref.block, flight.data())
            elif self.memory.admits(ref.length):
                self.memory.put(ref.block, flight.data(), on_disk=committed)
        finally:
            if writer is not None and not committed:
                await writer.abort()

    async def _store_after_room(self, ref: BlockRef, flight: Flight, rooms: int) -> bool:
        """The block's write met a full disk that has since made room: store the flight's
        bytes, once, rather than leave a hole among the most recent blocks."""
        assert self.disk is not None
        if self.disk.rooms_made == rooms:
            return False  # not a full disk (a failing one, a claim elsewhere): no retry
        return await self.disk.put(ref.block, flight.data())

    async def pour(
        self,
        ref: BlockRef,
        chunks: AsyncIterator[bytes],
        flight: Flight,
        writer: BlockWriter | None,
        origin: bool,
    ) -> BlockWriter | None:
        """Append ``chunks`` to ``flight`` and ``writer``; returns the writer, None
        once the disk failed. ``origin``: count them as origin bytes."""
        async for chunk in chunks:
            if origin:
                self.events.from_origin(ref.block.origin, len(chunk))
            flight.append(chunk)
            if writer is not None:
                writer = await self._write(writer, chunk)
        return writer

    async def _write(self, writer: BlockWriter, chunk: bytes) -> BlockWriter | None:
        try:
            await writer.write(chunk)
            return writer
        except OSError:
            # Disk full or failing (logged by the tier): keep serving, cache nothing torn.
            await writer.abort()
            return None

    async def _follow(self, ref: BlockRef, flight: Flight) -> bool:
        """Another worker of this node is filling the block: tail its part file."""
        assert self.disk is not None
        follower = await self.disk.follow(ref.block)
        if follower is None:
            return await self._from_disk(ref, flight)
        try:
            await follower.copy_to(flight.append)
            return True
        except FillAbandoned:
            if flight.received:
                raise errors.OriginUnavailable("a worker's fill was abandoned mid-block") from None
            return False
        finally:
            follower.close()
