"""What a cached block is: its identity, its place in an object, its on-disk header.

A block is named by (origin, origin bucket, key, ETag, index), so it never
changes meaning: a new version of an object has a new ETag and therefore new
block names, and old blocks simply age out. ``BlockId.digest`` is the stable
file name.

On disk a block is a fixed-size header followed by the data. The header
carries a magic number, the data length, an xxh3-64 checksum of the data and a
digest of the identity, so a file that is torn, truncated, bit-rotted or
misplaced is recognised and treated as a miss, never served. The header has a
fixed size so the data always starts at ``HEADER_SIZE`` and can be sent with
``sendfile`` straight from the file.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import xxhash

MAGIC = b"HOARDBLK"
VERSION = 1
HEADER_SIZE = 64
# magic, version, data length, xxh3-64 of data, first 32 bytes of the identity digest
_HEADER = struct.Struct("<8sIQQ32s")


@dataclass(frozen=True, slots=True)
class BlockId:
    origin: str
    bucket: str
    key: str
    etag: str
    index: int
    # The digest, once computed: a disk hit names its block four times (open file, place,
    # checked record, touch), each a BLAKE2b of the identity if not kept.
    _digest: str | None = field(default=None, init=False, repr=False, compare=False)
    # The hash, once computed: a memory hit hashes its block twice (lookup, recency), and
    # the dataclass's own hash built and hashed a tuple of the fields each time.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        kept = self._hash
        if not kept:
            kept = hash((self.origin, self.bucket, self.key, self.etag, self.index)) or 1
            object.__setattr__(self, "_hash", kept)  # frozen: set once, on first use
        return kept

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not BlockId:
            return NotImplemented
        return (
            self.key == other.key  # type: ignore[attr-defined]
            and self.etag == other.etag  # type: ignore[attr-defined]
            and self.index == other.index  # type: ignore[attr-defined]
            and self.bucket == other.bucket  # type: ignore[attr-defined]
            and self.origin == other.origin  # type: ignore[attr-defined]
        )

    @property
    def digest(self) -> str:
        """40 hex characters naming this block (file name, index key, peer path)."""
        digest = self._digest
        if digest is None:
            identity = "\0".join((self.origin, self.bucket, self.key, self.etag, str(self.index)))
            digest = hashlib.blake2b(
                identity.encode("utf-8", "surrogatepass"), digest_size=20
            ).hexdigest()
            object.__setattr__(self, "_digest", digest)  # frozen: set once, on first use
        return digest


def checksum(data: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def encode_header(block: BlockId, length: int, data_checksum: int) -> bytes:
    packed = _HEADER.pack(MAGIC, VERSION, length, data_checksum, block.digest.encode()[:32])
    return packed.ljust(HEADER_SIZE, b"\0")


@dataclass(frozen=True, slots=True)
class Header:
    length: int
    checksum: int
    identity: bytes


def decode_header(raw: bytes, block: BlockId) -> Header | None:
    """The header if ``raw`` is a valid header for ``block``, else None."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, version, length, data_checksum, identity = _HEADER.unpack_from(raw)
    if magic != MAGIC or version != VERSION or identity != block.digest.encode()[:32]:
        return None
    return Header(length, data_checksum, identity)


@dataclass(frozen=True, slots=True)
class BlockSpan:
    """The part of one block a byte range needs: block index, offset in it, length."""

    index: int
    offset: int
    length: int


def block_plan(start: int, end: int, block_size: int) -> list[BlockSpan]:
    """The blocks covering the inclusive byte range [start, end], in order."""
    spans = []
    position = start
    while position <= end:
        index, offset = divmod(position, block_size)
        length = min(block_size - offset, end - position + 1)
        spans.append(BlockSpan(index, offset, length))
        position += length
    return spans


def block_bounds(index: int, block_size: int, object_size: int) -> tuple[int, int]:
    """The inclusive byte range of block ``index`` within an object of ``object_size``."""
    first = index * block_size
    return first, min(first + block_size, object_size) - 1
