"""The values a read is made of: block references, and pieces of bytes to send.

Value types with nothing above them to import, so that the block source
(``blocks/source.py``), the cluster's placement and peer wire (``cluster/``), the
S3 front's body sender and the reader all name them without importing one
another: what was an import circle (blocks → placement → peers → blocks) is a
shared leaf.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.cache.block import BlockId
from gateway.origins.base import Origin


@dataclass(slots=True)
class FileSegment:
    """``count`` bytes at ``offset`` of an open file; ``release()`` when sent."""

    fd: int
    offset: int
    count: int
    release: Callable[[], None]


Piece = bytes | memoryview | FileSegment

# What sending pieces to a client raises when the client is gone: reset, a broken pipe
# (EPIPE: it closed while the answer was under way), aborted, or no byte taken within
# the send timeout. Logged as the client's doing, never as a server error. A reset that
# comes while a write waits for the socket to drain reaches the writer as aiohttp's bare
# ``ConnectionError("Connection lost")`` (base_protocol.connection_lost), the parent of
# the first three: a large answer to a client that stops reading and hangs up.
CLIENT_GONE: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


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
