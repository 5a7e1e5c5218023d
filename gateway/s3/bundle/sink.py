"""Where a bundle's bytes go: the chunked answer, as they are or through gzip, or an
answer with a Content-Length (``LengthSink``, below).

A warm bundle of small objects is many small writes (a 512-byte header, a
few KiB of object, the padding), and each write to aiohttp's chunked writer
is a chunk of its own and a ``transport.write``. So small bytes gather in one
buffer of up to ``_GATHER`` bytes and leave as one chunk; that buffer, and
the transport's own (the writer waits for the client to drain it), are all a
bundle holds of what it sends: a client that stops reading holds one buffer.
A file segment first sends what was gathered, then goes out with sendfile as
a chunk of its own (``BodySender.send_chunk``, the body sender GET uses).

With gzip every byte must pass through the compressor, so a segment is read
(``pread``, in a thread when large) and compressed like any bytes; large
pieces are compressed in a thread too, off the loop. The stream is one gzip
member for the whole archive, as Tigris's clients read it (``gzip.open`` on
the response, then ``tarfile`` mode ``r|``).

``sent`` counts what left for the client (compressed bytes under gzip): the
access log's and metrics' body bytes, sendfile's included.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import zlib

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from gateway.pieces import FileSegment, Piece
from gateway.s3.body import BodySender, socket_for_sendfile, write_segment_now

_GATHER = 64 * 1024  # small writes gathered into one chunk
_OFF_LOOP = 1024 * 1024  # pieces at least this large are read or compressed in a thread
# Segments up to this size go out without an await (``write_segment_now``): what the
# socket does not take is read and queued, so this is the most a segment adds to the
# transport's buffer at once. A packed block (256 KiB at most) is one.
_NOW_MAX = 256 * 1024
_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)  # Linux's; elsewhere not corked


class Sink:
    """The body of one chunked answer, written in order."""

    def __init__(
        self, request: web.Request, writer: AbstractStreamWriter, body: BodySender
    ) -> None:
        self._request = request
        self._writer = writer
        self._body = body
        self._gathered = bytearray()
        self.sent = 0

    async def write(self, data: bytes | memoryview) -> None:
        """Bytes of the archive (headers, padding, object bytes held in memory)."""
        if len(data) >= _GATHER:
            await self.flush()
            await self._out(data)
            return
        self._gathered += data
        if len(self._gathered) >= _GATHER:
            await self.flush()

    async def piece(self, piece: Piece) -> None:
        """An object's piece: bytes as ``write``, a file segment with sendfile."""
        if not isinstance(piece, FileSegment):
            await self.write(piece)
            return
        await self.flush()
        count = piece.count
        await self._body.send_chunk(self._request, self._writer, piece)
        self.sent += count

    async def flush(self) -> None:
        if self._gathered:
            data, self._gathered = bytes(self._gathered), bytearray()
            await self._out(data)

    async def finish(self) -> None:
        await self.flush()

    async def _out(self, data: bytes | memoryview) -> None:
        await self._writer.write(data)
        self.sent += len(data)


class LengthSink(Sink):
    """The body of an answer with a Content-Length: the archive's bytes as they are.

    No chunk framing, so nothing is added around a segment: small bytes (headers,
    padding, memory-tier objects, as views, not copies) are queued and leave in one
    ``writelines``, and a segment up to ``_NOW_MAX`` follows them on the socket with
    ``sendfile`` as far as the socket takes it, the rest read and queued
    (``write_segment_now``): no await, no task, no thread per object while the
    client keeps up. The transport's own flow control bounds what is held: once its
    buffer passes the high-water mark, the next write waits for the client to drain
    it (``drain``), so a client that stops reading holds a buffer, not the batch. A
    larger segment goes through ``BodySender.send`` as a GET's does.

    The socket is corked (``TCP_CORK``) while the body is written: a member's
    header and padding, written apart from its bytes, would otherwise leave as small
    packets of their own, each waking the client for half a kilobyte (two wakeups,
    and as many context switches, per object on a machine with few cores). Corked,
    the kernel sends full frames only; ``flush`` (before the stream waits for a key)
    and ``finish`` uncork it, so nothing waits in the socket while the stream does,
    and a keep-alive connection's next answer is not corked.
    """

    def __init__(
        self, request: web.Request, writer: AbstractStreamWriter, body: BodySender
    ) -> None:
        super().__init__(request, writer, body)
        self._transport = request.transport
        self._sockfd = socket_for_sendfile(self._transport)
        self._queued: list[bytes | memoryview] = []
        self._queued_size = 0
        # sendfile's socket (None over TLS, whose transport writes records of its own)
        corks = self._sockfd is not None and _TCP_CORK is not None
        self._socket = self._transport.get_extra_info("socket") if corks else None
        self._cork(True)

    async def write(self, data: bytes | memoryview) -> None:
        self._queued.append(data)
        self._queued_size += len(data)
        if self._queued_size >= _GATHER:
            self._out_now()
            await self._drained()

    async def piece(self, piece: Piece) -> None:
        if not isinstance(piece, FileSegment):
            await self.write(piece)
            return
        count = piece.count
        if count > _NOW_MAX:
            await self.flush()
            await self._body.send(self._request, self._writer, piece)  # releases it
        else:
            try:
                write_segment_now(self._out_now(), self._sockfd, piece)
            finally:
                piece.release()
            await self._drained()
        self.sent += count

    async def flush(self) -> None:
        self._out_now()
        self._cork(False)  # what is corked goes out now
        self._cork(True)
        await self._drained()

    async def finish(self) -> None:
        self._out_now()
        self._cork(False)
        await self._drained()

    def _cork(self, on: bool) -> None:
        if self._socket is not None:
            # A socket already closed has nothing to cork: the next write says it is gone.
            with contextlib.suppress(OSError):
                self._socket.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, int(on))

    def _out_now(self) -> asyncio.Transport:
        """What is queued, on the transport (the response's headers first); the transport."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client went away")
        send_headers = getattr(self._writer, "send_headers", None)
        if send_headers is not None:
            send_headers()  # held by aiohttp for its first write: a no-op once sent
        if self._queued:
            transport.writelines(self._queued)
            self.sent += self._queued_size
            self._queued, self._queued_size = [], 0
        return transport  # type: ignore[return-value]  # a connection's is a Transport

    async def _drained(self) -> None:
        if self._transport is not None and self._transport.get_write_buffer_size():
            await self._writer.drain()  # waits only while the transport is paused


class GzipSink(Sink):
    """A ``Sink`` whose bytes are one gzip stream (RFC 1952)."""

    def __init__(
        self, request: web.Request, writer: AbstractStreamWriter, body: BodySender
    ) -> None:
        super().__init__(request, writer, body)
        self._zip = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 16 + 15: a gzip wrapper

    async def piece(self, piece: Piece) -> None:
        if isinstance(piece, FileSegment):
            piece = await _read(piece)
        await self.write(piece)

    async def write(self, data: bytes | memoryview) -> None:
        if len(data) >= _OFF_LOOP:
            packed = await asyncio.to_thread(self._zip.compress, data)
        else:
            packed = self._zip.compress(data)
        if packed:
            await super().write(packed)

    async def finish(self) -> None:
        await super().write(self._zip.flush())
        await super().finish()


async def _read(segment: FileSegment) -> bytes:
    """A segment's bytes (released once read)."""
    try:
        if segment.count >= _OFF_LOOP:
            return await asyncio.to_thread(os.pread, segment.fd, segment.count, segment.offset)
        return os.pread(segment.fd, segment.count, segment.offset)
    finally:
        segment.release()
