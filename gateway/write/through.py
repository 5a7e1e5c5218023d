"""Write-through: the bytes a write just stored at the origin, cached as they were sent.

A client that writes a shard and reads it back (a checkpoint, a shuffled
copy) should not pay an origin GET for bytes that passed through Hoard a
moment ago. A PutObject's body (up to the mount's ``write_through_max``) is
teed as it streams to the origin into a ``Capture`` (``capture.py``), within
one ``Budget`` per process that refuses rather than waits. After the origin's
2xx and the write's invalidation, and after the client has its answer, a
background task (``WriteThroughs.later``) hands the bytes to
``WriteThrough.store``.

An S3 PUT answer carries no Last-Modified or Content-Type, so one origin
HEAD learns the metadata. Nothing is cached when that HEAD shows another
version (a write landed in between) or the key's ``Watch``
(``gateway/coherence/watch.py``) saw it invalidated meanwhile (a later write
through Hoard, in this worker or a sibling: the node's journal is caught up
before each check). The watch starts before the task's HEAD, so a later
write of the key through this process is noticed (one between the two shows
in the HEAD's ETag). Blocks go first and metadata last, so a reader that
finds the metadata finds the blocks; a reader that comes earlier fills from
the origin as usual.

A write-through is an optimisation: a failure is logged and costs a cold
read later, never the write.

Not guaranteed: bytes held by write-throughs under way count against the
budget until they end; a process stopped meanwhile drops them (``close``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from gateway.blocks.source import BlockSource
from gateway.cache.block import BlockId
from gateway.coherence.invalidator import Invalidator
from gateway.coherence.watch import Watch, Watches
from gateway.core import errors
from gateway.core.tasks import TaskSet
from gateway.metadata.source import MetadataSource, scope_of
from gateway.origins.base import same_etag
from gateway.origins.namespace import Mount, Namespace
from gateway.write.capture import Budget, Capture

log = logging.getLogger(__name__)


class WriteThrough:
    """Caches acknowledged writes' bytes, unless a later change overtook them."""

    def __init__(self, source: MetadataSource, blocks: BlockSource, block_size: int,
                 coherence: Invalidator, watches: Watches,
                 on_cached: Callable[[int], None]) -> None:  # fmt: skip
        """``coherence``: catches up with what sibling workers invalidated (it reaches
        ``watches``); ``on_cached(bytes)``: bytes a write-through stored."""
        self._source = source
        self._blocks = blocks
        self._block_size = block_size
        self._coherence = coherence
        self._watches = watches
        self._on_cached = on_cached

    def watch(self, mount: Mount, okey: str) -> Watch:
        """Start noticing invalidations of ``okey`` (see ``store``)."""
        return self._watches.watch(scope_of(mount), okey)

    async def store(
        self, mount: Mount, okey: str, etag: str, data: Iterable[bytes], size: int, watch: Watch
    ) -> int:
        """Cache the object ``data`` (as it was sent, in pieces) that the origin answered
        with ``etag``; returns the bytes cached."""
        learned = self._source.journal.seq()
        info = await self._source.origin_head(mount, okey)
        if self._changed_since(watch) or not same_etag(info.etag, etag) or info.size != size:
            return 0
        cached = 0
        for index, block in enumerate(_blocks(data, self._block_size)):
            # Checked right before the block's first store (no await between); the memory
            # copy after the disk's is named by this ETag too, so right for it whatever changed.
            if self._changed_since(watch):
                return cached
            block_id = BlockId(mount.origin.name, mount.origin_bucket, okey, info.etag, index)
            on_disk = self._blocks.disk is not None and await self._blocks.disk.put(block_id, block)
            stored = self._blocks.memory.put(block_id, block, on_disk=on_disk) or on_disk
            if stored:
                cached += len(block)
                self._on_cached(len(block))
        if self._changed_since(watch):
            return cached  # the blocks stay: named by this ETag, they are right for it
        self._source.remember(mount, okey, info, learned)
        return cached

    def _changed_since(self, watch: Watch) -> bool:
        """Whether ``watch``'s key was invalidated by any worker of the node since it began."""
        self._coherence.catch_up()
        return watch.changed


class WriteThroughs:
    """The write-throughs of one process: captures within one budget, tasks under way."""

    def __init__(self, namespace: Namespace, through: WriteThrough, buffer: int) -> None:
        self._namespace = namespace
        self._through = through
        self.budget = Budget(buffer)
        self._tasks = TaskSet()

    def capture(self, mount: Mount, length: int | None) -> Capture | None:
        """A capture of an upload to ``mount`` if it may be written through and has room."""
        if mount.write_through_max <= 0 or length == 0:
            return None
        capture = Capture(self.budget, mount.write_through_max, length)
        return capture if capture.keeping else None

    def later(self, bucket: str, key: str, etag: str, capture: Capture) -> None:
        """Cache the captured upload in the background; the task now owns ``capture``.

        Called after the write's own invalidation (see the module docstring).
        """
        pieces = capture.pieces()
        if pieces is None or capture.size == 0:
            capture.release()
            return
        mount = self._namespace.resolve(bucket)
        okey = mount.origin_key(key)
        watch = self._through.watch(mount, okey)

        async def run() -> None:
            try:
                await self._through.store(mount, okey, etag, pieces, capture.size, watch)
            except errors.HoardError as exc:
                log.info("write-through of a %d-byte object skipped: %s", capture.size, exc)
            except Exception:
                log.exception("write-through of a %d-byte object failed", capture.size)
            finally:
                watch.close()
                capture.release()

        self._tasks.spawn(run())

    async def settle(self) -> None:
        """Wait until the write-throughs under way have ended."""
        await self._tasks.settle()

    async def close(self) -> None:
        """Stop the write-throughs under way (at shutdown)."""
        await self._tasks.cancel()


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
