"""A cold object's metadata learned from the block the client needs: one round trip, not two.

When nothing at all is known of a key, a read asks the origin for the block
it needs (a ranged GET) rather than a HEAD and then that GET: the answer's
headers (Content-Range, ETag) are the metadata, and its body fills the block
(``BlockSource.adopt``). ``FirstBlock`` is that miss, named: the metadata
source calls it only when its tiers (memory, the node's store, a known entry
to revalidate) have nothing (``MetadataSource.for_read``).

An origin that ignores the range answers the whole object: its stream is
closed and the blocks are fetched as usual. A range past the end (an empty
object, or a read past it) falls back to a HEAD.

``block_ref`` is how the read path names a block of an object of a mount.
"""

from __future__ import annotations

from gateway.blocks.source import BlockSource
from gateway.cache.block import BlockId, block_bounds
from gateway.core import errors
from gateway.metadata.source import MetadataSource
from gateway.origins.base import ObjectInfo
from gateway.origins.namespace import Mount
from gateway.pieces import BlockRef


def block_ref(mount: Mount, okey: str, info: ObjectInfo, index: int, block_size: int) -> BlockRef:
    """Block ``index`` of ``okey``'s version ``info`` at ``mount``'s origin."""
    block = BlockId(mount.origin.name, mount.origin_bucket, okey, info.etag, index)
    first, last = block_bounds(index, block_size, info.size)
    return BlockRef(block, mount.origin, first, last)


class FirstBlock:
    """The metadata miss of one read, answered by a GET of block ``index``."""

    __slots__ = ("_admit", "_block_size", "_blocks", "_index", "_mount", "_okey", "_source")

    def __init__(self, blocks: BlockSource, source: MetadataSource, block_size: int,
                 mount: Mount, okey: str, index: int, admit: bool | None) -> None:  # fmt: skip
        """``admit``: whether the block goes to disk (``BlockSource.adopt``; None: the
        admission policy decides)."""
        self._blocks = blocks
        self._source = source
        self._block_size = block_size
        self._mount = mount
        self._okey = okey
        self._index = index
        self._admit = admit

    async def __call__(self) -> ObjectInfo:
        mount, okey = self._mount, self._okey
        first = self._index * self._block_size
        try:
            stream = await mount.origin.get_object(
                mount.origin_bucket, okey, (first, first + self._block_size - 1)
            )
        except errors.RangeNotSatisfiable:
            return await self._source.origin_head(mount, okey)  # empty, or a range past the end
        ref = block_ref(mount, okey, stream.info, self._index, self._block_size)
        if (stream.start, stream.end) != (ref.first, ref.last):
            await stream.aclose()  # the origin ignored the range; fetch blocks normally
        else:
            await self._blocks.adopt(ref, stream, self._admit)
        return stream.info
