"""One object (or a range of it) being read: its metadata, then its pieces of bytes.

The reader hands the S3 front an ``ObjectRead`` once the metadata is known
and the range resolved; the bytes follow as pieces (bytes from memory, or
file segments to send with sendfile). ``prime()`` pulls the first piece
before the response headers go out, so a read that cannot get a single
byte still ends in an S3 error rather than a cut body; an object found
changed at the origin at that point is opened once more with fresh
metadata (``reopen``), since nothing has been sent yet.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.core import errors
from gateway.origins.base import ObjectInfo
from gateway.pieces import FileSegment, Piece

Precondition = Callable[[ObjectInfo], None]


class ObjectRead:
    """An object (or a range of it) being read: metadata first, then pieces of bytes.

    The caller must ``aclose()`` it, also when it stops early.
    """

    def __init__(self, info: ObjectInfo, start: int, end: int, partial: bool,
                 pieces: AsyncIterator[Piece] | None, sources: Counter[str] | None = None,
                 reopen: Callable[[], Awaitable[ObjectRead]] | None = None) -> None:  # fmt: skip
        """``reopen``: the same read afresh, tried once if the object changed before
        the first byte (its metadata is dropped by then)."""
        self._reopen = reopen
        self.info = info
        self.start = start
        self.end = end
        self.partial = partial
        self._pieces = pieces
        self._first: Piece | None = None
        # Bytes by the tier they came from (memory, disk, peer, origin), tallied as read.
        self.sources = sources if sources is not None else Counter()

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    async def prime(self) -> None:
        if self._pieces is None or self._first is not None:
            return
        try:
            self._first = await anext(self._pieces, None)
        except errors.OriginChanged:
            if self._reopen is None:
                raise
            fresh = await self._reopen()
            await self.aclose()
            self.info, self.start, self.end, self.partial = (
                fresh.info, fresh.start, fresh.end, fresh.partial
            )  # fmt: skip
            self._pieces, self.sources, self._reopen = fresh._pieces, fresh.sources, None
            await self.prime()

    async def chunks(self) -> AsyncIterator[Piece]:
        if self._pieces is None:
            return
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for piece in self._pieces:
            yield piece

    async def read_all(self) -> bytes:
        """Every byte of the read, joined (for small objects read whole)."""
        return b"".join([await _as_bytes(piece) async for piece in self.chunks()])

    async def aclose(self) -> None:
        if isinstance(self._first, FileSegment):
            self._first.release()
        self._first = None
        if self._pieces is not None:
            pieces, self._pieces = self._pieces, None
            await pieces.aclose()  # type: ignore[attr-defined]


async def _as_bytes(piece: Piece) -> bytes:
    """A piece's bytes; a file segment is read in a thread (and released)."""
    if not isinstance(piece, FileSegment):
        return bytes(piece)
    try:
        return await asyncio.to_thread(os.pread, piece.fd, piece.count, piece.offset)
    finally:
        piece.release()
