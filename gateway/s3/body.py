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
import contextlib
import os
import select
import socket
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from gateway.pieces import FileSegment, Piece

_COPY_PIECE = 1024 * 1024  # bytes read per step when sendfile cannot be used (HTTPS)


class BodySender:
    """Sends pieces of an object to one aiohttp response."""

    def __init__(self, threads: int = 32, send_timeout: float = 60.0) -> None:
        self._native: bool | None = None  # learned on first use: does the loop sendfile?
        # A client that takes no byte for this long is gone (settings.send_timeout).
        self._send_timeout_ms = round(send_timeout * 1000)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sendfile")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def send(self, request: web.Request, writer: AbstractStreamWriter, piece: Piece) -> None:
        if not isinstance(piece, FileSegment):
            await writer.write(piece)
            return
        release = _Release(piece.release)
        try:
            await self._send_segment(request, writer, piece, release)
        finally:
            release.unless_handed()

    async def send_chunk(
        self, request: web.Request, writer: AbstractStreamWriter, piece: Piece
    ) -> None:
        """``send`` into an answer in chunked transfer coding (RFC 9112 §7.1), as a bundle's is.

        The writer frames bytes as chunks itself; a segment sent with sendfile goes
        around it, so that chunk's size line and closing CRLF are written here, on the
        transport, around the segment (``_send_segment`` flushes the transport before
        its sendfile, so the size line leaves first). Over TLS a segment is copied
        through the writer, which frames it. An empty piece is not sent: a chunk of
        size 0 ends the answer.
        """
        transport = request.transport
        if not isinstance(piece, FileSegment):
            if len(piece):
                await writer.write(piece)
            return
        if piece.count == 0:
            piece.release()
            return
        if _tls(transport):
            await self.send(request, writer, piece)
            return
        send_headers = getattr(writer, "send_headers", None)
        if send_headers is not None:
            send_headers()  # headers aiohttp holds for the first write must precede this
        if transport is not None and not transport.is_closing():
            transport.write(b"%x\r\n" % piece.count)
        await self.send(request, writer, piece)
        transport.write(b"\r\n")  # type: ignore[union-attr]  # send raised if it is gone

    async def _send_segment(
        self,
        request: web.Request,
        writer: AbstractStreamWriter,
        segment: FileSegment,
        release: _Release,
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
        await self._direct(loop, sock.fileno(), segment, release)

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
        self,
        loop: asyncio.AbstractEventLoop,
        sockfd: int,
        segment: FileSegment,
        release: _Release,
    ) -> None:
        """Send what the socket takes now; the rest from a thread that owns its descriptors.

        The thread gets duplicates of the socket and the block file: this
        coroutine may be cancelled, and its caller then closes both, while the
        thread still writes — a raw descriptor number could by then name
        another file or connection. ``release`` (the block's lease) runs when
        the thread is done, not when this coroutine is.
        """
        sent = sendfile_now(sockfd, segment.fd, segment.offset, segment.count)
        if sent >= segment.count:
            return
        sock_copy, file_copy = os.dup(sockfd), os.dup(segment.fd)
        try:
            done = self._pool.submit(_sendfile_waiting, sock_copy, file_copy, segment.offset + sent,
                                     segment.count - sent, self._send_timeout_ms)  # fmt: skip
        except BaseException:
            os.close(sock_copy)
            os.close(file_copy)
            raise
        release.hand_to(done, loop)
        try:
            await asyncio.wrap_future(done, loop=loop)
        except asyncio.CancelledError:
            _shut_down(sockfd)  # the thread's next send fails now, not after the poll timeout
            raise


class _Release:
    """A segment's release, run once: by the sender, or by the thread it was handed to."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action = action
        self._handed = False

    def hand_to(self, work: Future[None], loop: asyncio.AbstractEventLoop) -> None:
        self._handed = True
        work.add_done_callback(lambda _: _on_loop(loop, self._action))

    def unless_handed(self) -> None:
        if not self._handed:
            self._action()


def _tls(transport: asyncio.BaseTransport | None) -> bool:
    return transport is not None and transport.get_extra_info("sslcontext") is not None


def _on_loop(loop: asyncio.AbstractEventLoop, action: Callable[[], None]) -> None:
    """Run ``action`` on ``loop`` (from a thread); directly if the loop is gone."""
    try:
        loop.call_soon_threadsafe(action)
    except RuntimeError:  # closed: nothing else runs there any more
        action()


def _shut_down(sockfd: int) -> None:
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(sockfd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


async def _flushed(transport: asyncio.Transport) -> None:
    for _ in range(10_000):
        if transport.get_write_buffer_size() == 0:
            return
        await asyncio.sleep(0.001)
    raise ConnectionResetError("client is not reading")


def socket_for_sendfile(transport: asyncio.BaseTransport | None) -> int | None:
    """The descriptor ``sendfile`` may write to under ``transport``; None over TLS (the
    bytes must pass through the encrypting transport) or without a socket."""
    if transport is None or _tls(transport):
        return None
    sock = transport.get_extra_info("socket")
    return None if sock is None else sock.fileno()


def write_segment_now(
    transport: asyncio.Transport, sockfd: int | None, segment: FileSegment
) -> None:
    """``segment`` on the connection without an await, in order after what is queued.

    With ``sendfile`` as far as the socket takes it now, when nothing waits in the
    transport's buffer before it; what the socket does not take (or all of it, over
    TLS or behind queued bytes) is read with ``pread`` and queued on the transport,
    which sends it as the client drains (the caller waits with ``drain`` when the
    transport says so). For segments small enough to hold in memory for a moment: a
    large one goes through ``BodySender.send``, which never reads it whole. The
    segment's lease is the caller's to release.
    """
    sent = 0
    if sockfd is not None and transport.get_write_buffer_size() == 0:
        sent = sendfile_now(sockfd, segment.fd, segment.offset, segment.count)
    if sent < segment.count:
        rest = os.pread(segment.fd, segment.count - sent, segment.offset + sent)
        if len(rest) != segment.count - sent:
            raise OSError(f"block file ended {segment.count - sent - len(rest)} bytes early")
        transport.write(rest)


def sendfile_now(sockfd: int, fd: int, offset: int, count: int) -> int:
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


def _sendfile_waiting(sockfd: int, fd: int, offset: int, count: int, timeout_ms: int) -> None:
    """In a thread: send the rest, waiting for the socket to drain between calls.

    Owns ``sockfd`` and ``fd`` (duplicates) and closes them when done.
    """
    try:
        poller = select.poll()
        poller.register(sockfd, select.POLLOUT)
        sent = 0
        while sent < count:
            sent += sendfile_now(sockfd, fd, offset + sent, count - sent)
            if sent < count:
                events = poller.poll(timeout_ms)
                if not events:
                    raise TimeoutError("client stopped reading")
                if any(flag & (select.POLLERR | select.POLLHUP) for _, flag in events):
                    raise ConnectionResetError("client went away")
    finally:
        os.close(sockfd)
        os.close(fd)
