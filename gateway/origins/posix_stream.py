"""Reading one posix file: a descriptor opened once, read in 1 MiB ``pread`` chunks.

A GET opens the file once (``posix.py``) and hands its descriptor here: the
stream reads ``start..end`` with ``pread`` in worker threads, so memory stays
flat, the loop never blocks, and a rename during the read does not mix two
files (the descriptor keeps the old inode). A file that shrinks under the
reader is an ``OriginChanged``, never a short body passed off as whole.

The descriptor is closed exactly once: by ``aclose``, or by a finalizer when
a stream (or an open whose caller was cancelled) is dropped unclosed; a lock
makes the close wait for a ``pread`` in flight, so the number is never reused
under a reader.

NOT guaranteed: a file rewritten in place while it is read may deliver mixed
bytes; only replacement by rename is safe.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator

from gateway.core import errors
from gateway.origins.base import ObjectInfo

CHUNK_SIZE = 1 << 20


def span(byte_range: tuple[int, int] | None, size: int) -> tuple[int, int]:
    if byte_range is None:
        return 0, size - 1
    start, end = byte_range
    if start < 0 or start > end or start >= size:
        raise errors.RangeNotSatisfiable(size)
    return start, min(end, size - 1)


class Fd:
    """A descriptor read by worker threads and closed once.

    The lock makes close wait for a ``pread`` in flight: closing under it would
    free the number for another open, and the pread would read that file.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        # Also closes it when dropped unclosed: a stream never aclose()d, or an
        # open whose caller was cancelled while the worker thread finished it.
        self._close = weakref.finalize(self, os.close, fd)

    @property
    def closed(self) -> bool:
        return not self._close.alive

    def pread(self, size: int, offset: int) -> bytes:
        with self._lock:
            if self.closed:
                raise ValueError("read from a closed stream")
            return os.pread(self.fd, size, offset)

    def close(self) -> None:
        with self._lock:
            self._close()


class PosixObjectStream:
    """An open file delivering ``start..end`` (inclusive) in chunks of at most 1 MiB."""

    def __init__(self, fd: Fd, info: ObjectInfo, start: int, end: int) -> None:
        self.info, self.start, self.end = info, start, end
        self._fd = fd

    async def chunks(self) -> AsyncIterator[bytes]:
        pos = self.start
        while pos <= self.end:
            want = min(CHUNK_SIZE, self.end + 1 - pos)
            data = await asyncio.to_thread(self._fd.pread, want, pos)
            if not data:
                raise errors.OriginChanged(f"{self.info.key} shrank while being read")
            pos += len(data)
            yield data

    async def aclose(self) -> None:
        if not self._fd.closed:
            await asyncio.to_thread(self._fd.close)

    async def __aenter__(self) -> PosixObjectStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
