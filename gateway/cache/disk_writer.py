"""A claimed fill of one block: bytes appended as they arrive, then committed or aborted.

The writer is the fill's half of the disk tier (``disk.py``): it owns the part
file's descriptor (and so the claim, its ``flock``), appends data in order,
hashes it as it goes by, and hands the sealed block to the tier at ``commit``.
A block small enough to be packed (``disk_packed.py``) also keeps its chunks,
so the commit appends them to a segment without reading the part file back;
claimed without one (``packed_claims.py``), it has no part file at all (``fd`` -1,
``path`` None), and ``on_release`` ends its claim.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar

import xxhash

from gateway.cache import disk_files as files
from gateway.cache.block import HEADER_SIZE, BlockId
from gateway.cache.disk_space import FullDisk

T = TypeVar("T")


class WriterTier(Protocol):
    """What a writer asks of the disk tier that made it (``disk.DiskTier``): named here,
    so this module does not import the tier that imports it."""

    def packs(self, length: int) -> bool: ...

    async def _publish(self, writer: BlockWriter, checksum: int) -> bool: ...

    @property
    def space(self) -> FullDisk: ...

    async def _keep(self, work: Awaitable[T]) -> T: ...


_THREAD_WRITE = 256 << 10  # writes at least this large run in a thread


class BlockWriter:
    """One claimed fill: append ``length`` data bytes, then ``commit`` or ``abort``.

    Calls must not overlap (a fill streams in order, one write at a time).
    """

    def __init__(
        self, tier: WriterTier, block: BlockId, fd: int, path: Path | None, length: int,
        on_release: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        # A block small enough to be packed keeps its chunks to append them at commit.
        self.chunks: list[bytes] | None = [] if tier.packs(length) else None
        self.fd = fd
        self.path = path
        self.data_offset = HEADER_SIZE
        self.written = 0
        self.length = length
        self.block = block
        self._tier = tier
        self._hasher = xxhash.xxh3_64()  # the checksum, computed as the data goes by
        self._finished = False  # committed or aborting: no more writes
        self._pending: asyncio.Future[None] | None = None  # a write still running in a thread
        self._on_release = on_release  # ends a claim held in memory, once
        # Counted as the tier's own until it lands or is given up, so a full disk makes
        # room for it rather than lowering the limit under it (disk_space.FullDisk).
        self._writing = HEADER_SIZE + length
        tier.space.begin_write(self._writing)
        self._landed = False  # its bytes in place, its row on its way (``land``)

    async def write(self, data: bytes) -> None:
        """Append ``data``. Raises OSError (ENOSPC...) after removing the part file."""
        if self._finished:
            raise ValueError("write to a finished BlockWriter")
        if self.written + len(data) > self.length:
            raise ValueError(f"{self.written} + {len(data)} bytes exceed length {self.length}")
        offset = self.data_offset + self.written
        try:
            if self.path is None:  # no part file: the chunks are the block until commit
                self._hasher.update(data)
            elif len(data) < _THREAD_WRITE:  # a page-cache copy of this size is quicker than a hop
                files.append(self.fd, self._hasher, data, offset)
            else:
                loop = asyncio.get_running_loop()
                self._pending = loop.run_in_executor(
                    None, files.append, self.fd, self._hasher, data, offset
                )
                # shielded: if the caller is cancelled the write still ends, and
                # abort() waits for it before closing the descriptor it uses
                await asyncio.shield(self._pending)
            if self.chunks is not None:
                self.chunks.append(data)
        except OSError as exc:
            await self.abort()
            await self._tier.space.failed("write", exc, self.block)
            raise
        self.written += len(data)

    async def commit(self) -> bool:
        """Seal, index and publish the block, evicting to capacity; False if not stored.

        Raises ValueError if fewer than ``length`` bytes were written (after
        aborting). Runs to the end even if the caller is cancelled.
        """
        if self._finished:
            raise ValueError("commit of a finished BlockWriter")
        if self.written != self.length:
            await self.abort()
            raise ValueError(f"commit after {self.written} of {self.length} bytes")
        self._finished = True
        checksum = self._hasher.intdigest()
        return await self._tier._keep(self._tier._publish(self, checksum))

    async def abort(self) -> None:
        """Remove the part file and release the claim. Idempotent."""
        self._end_claim()
        if self.fd < 0:
            self._finished = True
            return
        fd, self.fd = self.fd, -1  # taken now, so an overlapping abort cannot unlink twice
        self._finished = True
        await self._tier._keep(self._remove(fd))  # a cancelled abort must not leak the lock

    async def _remove(self, fd: int) -> None:
        try:
            if self._pending is not None:
                await asyncio.gather(self._pending, return_exceptions=True)
            # unlink while still holding the lock: until then the name is ours
            assert self.path is not None  # a descriptor is a part file's
            await asyncio.to_thread(files.unlink, self.path)
        finally:
            os.close(fd)

    def land(self) -> None:
        """The block is in place (renamed, or appended to a segment) and its row on its
        way: until ``release`` its bytes are the tier's own, which the index does not
        count yet (``disk_space.FullDisk.held``)."""
        self._landed = True
        self._tier.space.land(self._writing)

    def release(self) -> None:
        """Close the descriptor (releasing the lock) without touching the part's name."""
        self._end_claim()
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def _end_claim(self) -> None:
        writing, self._writing = self._writing, 0
        landed, self._landed = self._landed, False
        self._tier.space.end_write(writing, landed)
        release, self._on_release = self._on_release, None
        if release is not None:
            release()
