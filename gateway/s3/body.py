"""Writing an object body to the client: bytes as they are, file segments with sendfile.

A disk-tier hit arrives as a ``FileSegment`` (an open block file, an offset, a
count) and goes to the socket with ``sendfile(2)``: no byte of it passes
through Python. The stdlib event loop does that natively
(``loop.sendfile``, as aiohttp's ``web_fileresponse.py``); uvloop does not
implement it, so under uvloop the segment is sent with a non-blocking
``os.sendfile`` on the socket, and only when the socket buffer is full does
the rest move to a thread that waits for the socket with ``poll``. Small
blocks therefore never leave the event loop thread, and large ones never block
it.

Before any sendfile the transport's own buffer is flushed, so the headers
aiohttp queued go out first. Over HTTPS there is no sendfile: the bytes must
be encrypted by the TLS transport, so a segment is read off the loop in 1 MiB
pieces and written through it (as aiohttp's file response falls back too).
"""

from __future__ import annotations

import asyncio
import os
import select
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from gateway.blocks import FileSegment, Piece

_COPY_PIECE = 1024 * 1024  # bytes read per step when sendfile cannot be used (HTTPS)
_POLL_TIMEOUT_MS = 60_000  # a client that takes no byte for a minute is gone


class BodySender:
    """Sends pieces of an object to one aiohttp response."""

    def __init__(self, threads: int = 32) -> None:
        self._native: bool | None = None  # learned on first use: does the loop sendfile?
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sendfile")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def send(self, request: web.Request, writer: AbstractStreamWriter, piece: Piece) -> None:
        if not isinstance(piece, FileSegment):
            await writer.write(piece)
            return
        try:
            await self._send_segment(request, writer, piece)
        finally:
            piece.release()

    async def _send_segment(
        self, request: web.Request, writer: AbstractStreamWriter, segment: FileSegment
    ) -> None:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        if transport.get_extra_info("sslcontext") is not None:
            # TLS: the bytes must pass through the encrypting transport, never around it.
            await self._copy(writer, segment)
            return
        await writer.drain()
        await _flushed(transport)
        loop = asyncio.get_running_loop()
        if self._native is not False:
            try:
                with open(segment.fd, "rb", closefd=False) as file:
                    await loop.sendfile(
                        transport, file, segment.offset, segment.count, fallback=False
                    )
                self._native = True
                return
            except (NotImplementedError, RuntimeError):
                if self._native:
                    raise
                self._native = False  # uvloop: no loop.sendfile
        sock = transport.get_extra_info("socket")
        await self._direct(loop, sock.fileno(), segment)

    async def _copy(self, writer: AbstractStreamWriter, segment: FileSegment) -> None:
        """The segment read in pieces off the loop and written as bytes (HTTPS)."""
        loop = asyncio.get_running_loop()
        done = 0
        while done < segment.count:
            size = min(_COPY_PIECE, segment.count - done)
            piece = await loop.run_in_executor(
                self._pool, os.pread, segment.fd, size, segment.offset + done
            )
            if not piece:
                raise OSError(f"block file ended {segment.count - done} bytes early")
            await writer.write(piece)
            done += len(piece)

    async def _direct(
        self, loop: asyncio.AbstractEventLoop, sockfd: int, segment: FileSegment
    ) -> None:
        sent = _sendfile_nonblocking(sockfd, segment.fd, segment.offset, segment.count)
        if sent < segment.count:
            rest = FileSegment(
                segment.fd, segment.offset + sent, segment.count - sent, segment.release
            )
            await loop.run_in_executor(self._pool, _sendfile_waiting, sockfd, rest)


async def _flushed(transport: asyncio.Transport) -> None:
    for _ in range(10_000):
        if transport.get_write_buffer_size() == 0:
            return
        await asyncio.sleep(0.001)
    raise ConnectionResetError("client is not reading")


def _sendfile_nonblocking(sockfd: int, fd: int, offset: int, count: int) -> int:
    """Send what the socket takes right now; return how much that was."""
    sent = 0
    while sent < count:
        try:
            done = os.sendfile(sockfd, fd, offset + sent, count - sent)
        except BlockingIOError:
            return sent
        if done == 0:
            raise ConnectionResetError("sendfile sent nothing: peer closed")
        sent += done
    return sent


def _sendfile_waiting(sockfd: int, segment: FileSegment) -> None:
    """In a thread: send the rest, waiting for the socket to drain between calls."""
    poller = select.poll()
    poller.register(sockfd, select.POLLOUT)
    sent = 0
    while sent < segment.count:
        sent += _sendfile_nonblocking(
            sockfd, segment.fd, segment.offset + sent, segment.count - sent
        )
        if sent < segment.count:
            events = poller.poll(_POLL_TIMEOUT_MS)
            if not events:
                raise TimeoutError("client stopped reading")
            if any(flag & (select.POLLERR | select.POLLHUP) for _, flag in events):
                raise ConnectionResetError("client went away")
