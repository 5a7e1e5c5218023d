"""Write-through: the bytes a write just stored at the origin, cached as they were sent.

A client that writes a shard and reads it back (a checkpoint, a shuffled
copy) should not pay an origin GET for bytes that passed through Hoard a
moment ago. The writer tees a write's body (``writer.py``, bounded by
``write_through_max`` and a node-wide buffer) and, once the origin has
acknowledged it, hands the pieces here.

An S3 PUT answer carries no Last-Modified or Content-Type, so one origin
HEAD learns the metadata. Nothing is cached when that HEAD shows another
version (a write landed in between) or a ``Watch`` saw the key invalidated
meanwhile (a later write through Hoard, in this worker or a sibling: the
node's journal is read before each check). Blocks go first and metadata
last, so a reader that finds the metadata finds the blocks; a reader that
comes earlier fills from the origin as usual.

A ``Watch`` is what a per-key generation counter would tell ("bumped since
I looked?"), kept only for keys someone watches: bounded by the
write-throughs in flight, not by every key ever written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from gateway.blocks.source import BlockSource
from gateway.cache.block import BlockId
from gateway.metadata.source import MetadataSource, scope_of
from gateway.origins.base import same_etag
from gateway.origins.namespace import Mount

WatchKey = tuple[str, str, str]  # (origin, origin bucket, origin key)


class Watch:
    """Whether a key was invalidated since watching began (``changed``); ``close()`` when done."""

    __slots__ = ("_registry", "changed", "key")

    def __init__(self, key: WatchKey, registry: dict[WatchKey, set[Watch]]) -> None:
        self.key = key
        self.changed = False
        self._registry = registry
        registry.setdefault(key, set()).add(self)

    def close(self) -> None:
        watching = self._registry.get(self.key)
        if watching is not None:
            watching.discard(self)
            if not watching:
                del self._registry[self.key]


class WriteThrough:
    """Caches acknowledged writes' bytes, unless a later change overtook them."""

    def __init__(self, source: MetadataSource, blocks: BlockSource, block_size: int,
                 catch_up: Callable[[], None], on_cached: Callable[[int], None]) -> None:  # fmt: skip
        """``catch_up``: apply what sibling workers invalidated (it reaches the watches);
        ``on_cached(bytes)``: bytes a write-through stored."""
        self._source = source
        self._blocks = blocks
        self._block_size = block_size
        self._catch_up = catch_up
        self._on_cached = on_cached
        self._watches: dict[WatchKey, set[Watch]] = {}

    def watch(self, mount: Mount, okey: str) -> Watch:
        """Start noticing invalidations of ``okey`` (see ``store``)."""
        return Watch((*scope_of(mount), okey), self._watches)

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

    def changed(self, scope: tuple[str, str], okey: str, *, prefix: bool = False) -> None:
        """Tell every watch on ``okey`` (or, with ``prefix``, under it) that it changed."""
        if prefix:
            found = [w for k, ws in self._watches.items() if k[:2] == scope and
                     k[2].startswith(okey) for w in ws]  # fmt: skip
        else:
            found = list(self._watches.get((*scope, okey), ()))
        for watch in found:
            watch.changed = True

    def all_changed(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.changed = True

    def _changed_since(self, watch: Watch) -> bool:
        """Whether ``watch``'s key was invalidated by any worker of the node since it began."""
        self._catch_up()
        return watch.changed


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
