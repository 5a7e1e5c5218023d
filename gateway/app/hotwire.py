"""Hits answered inside the connection's protocol, as their bytes arrive.

aiohttp's per-request machinery (the ``RequestHandler.start`` loop, a
``BaseRequest``, a task per request, a ``StreamResponse``) costs about as much
CPU as nginx spends on a whole small hit, so no hit path behind it can reach
nginx. ``HitConnection`` (aiohttp's connection handler, subclassed) answers
hits before aiohttp sees them, in ``data_received``, in one of two ways.

While every byte of the connection so far has been whole heads of bodiless
requests (``core/heads.py``: a loader's GETs, one at a time or pipelined), a
read that is again nothing but such heads is split and parsed here, and each
head goes to ``HitPath.answer_now`` in turn; aiohttp's parser never sees the
heads answered, so no ``RawRequestMessage``, URL or queue entry is made for
them. The first head that is not a hit, and every head after it in the read,
go to aiohttp's parser, and aiohttp's loop answers them. The first read that
is anything else (a body, part of a head) ends this for the connection: from
then on only aiohttp's parser knows where a message ends, and two parsers
must never disagree on it.

Otherwise aiohttp's C parser parses the read and queues the requests, and,
while aiohttp's loop for the connection is idle, each parsed request at the
head of the queue goes to ``HitPath.answer_now`` before aiohttp sees it: a
hit is answered there and then, synchronously; the first request that is not
one (or that needs an await: a miss, a disk lookup not yet done, an error)
wakes aiohttp's loop, which answers it and every request queued behind it, in
order. Either way a hit never overtakes an earlier request of its connection:
the protocol only answers while aiohttp has nothing of that connection queued
or running.

What aiohttp would do for the answer is done here too: the request counted on
the server, the keep-alive deadline moved (a connection serving only hits is
not idle), and back-pressure: when the transport's buffer passes its high-water
mark (``pause_writing``), the protocol stops answering and stops reading until
``resume_writing``, as aiohttp's writer waits for the drain, so a client that
stops reading holds one answer and the kernel's buffers, not a growing queue.

This reaches into aiohttp's internals (the message queue, the loop's waiter,
the parser's flow control; aiohttp 3.14, pinned in ``pyproject.toml``).
``missing_internals`` checks they are there at start; if any is not, the
connection handler stays aiohttp's own, the hit path runs behind aiohttp as
before (``HitPath.answer``), a warning is logged and
``hoard_hit_wire_enabled`` is 0.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from aiohttp.http_parser import HttpRequestParser, RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler

from gateway.core.heads import Head, bodiless_heads, parse_head
from gateway.s3.body import socket_for_sendfile

log = logging.getLogger(__name__)


class Wire(Protocol):
    """What answers hits on the wire (``s3/hits.py``'s ``HitPath``); each returns False
    when it sent nothing. ``sockfd``: the connection's socket for sendfile (None: TLS)."""

    def answer_now(
        self, message: RawRequestMessage | Head, transport: asyncio.Transport, sockfd: int | None
    ) -> bool:
        """Answer a parsed request if it is a hit held now."""

    def answer_again(self, head: bytes, transport: asyncio.Transport, sockfd: int | None) -> bool:
        """Answer a whole head, as sent, if it repeats a hit kept by its bytes."""


# What HitConnection reads or calls of aiohttp's connection handler and parser.
_HANDLER_INTERNALS = (
    "_messages", "_waiter", "_parser", "_paused", "_buffer_paused", "_reading_paused",
    "_close", "_force_close", "_manager", "_keepalive", "_keepalive_timeout",
    "_next_keepalive_close_time", "_msg_queue_resume_size", "_resume_reading_if_drained",
    "_pause_transport_reading", "_resume_transport_reading", "data_received", "resume_writing",
    "_request_count", "_request_in_progress", "_handle_request",
)  # fmt: skip
_PARSER_INTERNALS = ("message_consumed", "feed_data")


def missing_internals(
    handler: type = RequestHandler, parser: type = HttpRequestParser
) -> list[str]:
    """The aiohttp internals ``HitConnection`` needs that ``handler`` or ``parser`` lack."""
    missing = [name for name in _HANDLER_INTERNALS if not hasattr(handler, name)]
    missing += [f"parser.{name}" for name in _PARSER_INTERNALS if not hasattr(parser, name)]
    return missing


def wire_answer(wire: Wire, handler: type = RequestHandler) -> Wire | None:
    """``wire`` if aiohttp's internals are as ``HitConnection`` needs them, else None
    (logged: hits are then answered behind aiohttp's request machinery)."""
    missing = missing_internals(handler)
    if missing:
        log.warning("hits answered behind aiohttp (slower): aiohttp lacks %s", ", ".join(missing))
        return None
    return wire


class HitConnection(RequestHandler):
    """aiohttp's connection handler, answering hits as they are parsed (see the module).

    ``manager.wire`` (the server's) answers; None: aiohttp's handler as it is.
    """

    __slots__ = ("_again", "_answering", "_holding", "_kept_alive", "_plain", "_sockfd", "_wire")

    def __init__(self, manager: Any, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        wire: Wire | None = getattr(manager, "wire", None)
        self._wire = None if wire is None else wire.answer_now
        self._again = None if wire is None else wire.answer_again
        self._sockfd: int | None = None
        self._answering = False  # answering now: a nested data_received only parses
        self._holding = False  # reading paused by this class until the transport drains
        # Every byte aiohttp's parser was given so far was whole heads of bodiless
        # requests, so it holds no part of a message: a read of whole heads may be parsed
        # here instead (``core/heads.py``). Once not, aiohttp parses the connection's rest.
        self._plain = True
        self._kept_alive = True  # the last request aiohttp answered left the connection open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._sockfd = socket_for_sendfile(transport)  # None over TLS

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        # Idle: aiohttp's loop waits for a request, or it is between two.
        idle = not waiter.done() if waiter is not None else self._between_requests()
        if self._wire is None or self._close or self._force_close or not idle:
            if self._plain and bodiless_heads(data) is None:
                self._plain = False
            super().data_received(data)  # aiohttp's loop has (or is about to have) the queue
            return
        declined = False
        if self._plain and not self._messages and not self._paused and not self._answering:
            heads = bodiless_heads(data)
            if heads is None:
                self._plain = False  # from now on, where a message ends is aiohttp's to know
            else:
                answered = self._answer_heads(heads)
                if answered == len(heads):
                    return
                data = b"".join(heads[answered:]) if answered else data
                declined = not self._paused
        elif self._plain and bodiless_heads(data) is None:
            self._plain = False
        # aiohttp parses and queues; its loop stays asleep until a request is left for it.
        self._waiter = None
        try:
            super().data_received(data)
        finally:
            self._waiter = waiter
        if self._close or self._force_close:
            if waiter is not None:
                waiter.cancel()  # what close() or force_close() did to the loop's waiter
            return
        if waiter is None:  # aiohttp's loop takes what was queued as it comes back
            return
        if declined:  # the wire asked the hit path already: aiohttp's loop answers it
            if self._messages and not waiter.done():
                waiter.set_result(None)
        elif not self._answering:
            self._answer_queued(waiter)

    def _between_requests(self) -> bool:
        """Whether aiohttp's loop, not waiting on its future, has nothing of the connection
        queued or running, so a hit answered now is in order: not started yet, or back
        from a request that left the connection open."""
        return not self._request_in_progress and self._kept_alive and not self._messages

    async def _handle_request(self, request: Any, start_time: Any, handler: Any) -> Any:
        """aiohttp's, and then the hits queued behind the request answered on the wire:
        a connection whose requests came while aiohttp's loop was busy goes back to the
        wire as soon as it is done, not once its client pauses."""
        resp, reset = await super()._handle_request(request, start_time, handler)
        self._kept_alive = not reset and resp.keep_alive and not self._force_close
        if self._kept_alive and self._messages and not self._answering:
            self._answer_queue()
        return resp, reset

    def _answer_heads(self, heads: list[bytes]) -> int:
        """Hits answered from ``heads`` (whole, bodiless, in order: ``core/heads.py``),
        parsed here rather than by aiohttp, until one is not a hit or writing pauses."""
        answer, again, transport = self._wire, self._again, self.transport
        answered = 0
        self._answering = True
        try:
            for raw in heads:
                if self._paused or transport is None or answer is None or again is None:
                    break
                if not again(raw, transport, self._sockfd):
                    head = parse_head(raw)
                    if head is None or not answer(head, transport, self._sockfd):
                        break
                answered += 1
                transport = self.transport  # None once a cut answer closed it
        finally:
            self._answering = False
        if answered:
            self._answered(answered)
        return answered

    def _answered(self, count: int) -> None:
        """What aiohttp does for each request it answers: counted, the idle clock reset."""
        assert self._manager is not None
        self._manager.requests_count += count
        self._request_count += count
        self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self._holding:
            return
        self._holding = False
        if not self._buffer_paused and not self._reading_paused:
            self._resume_transport_reading()
        waiter = self._waiter
        if waiter is not None and not waiter.done() and not self._answering and self._messages:
            self._answer_queued(waiter)

    def _answer_queued(self, waiter: asyncio.Future[None]) -> None:
        """Answer the hits at the head of the queue; then hold the rest until the transport
        drains, or wake aiohttp's loop for the first request that is not a hit."""
        self._answer_queue()
        if not self._messages or waiter.done():
            return
        if self._paused:
            self._holding = True  # resume_writing answers the rest
            self._pause_transport_reading()
        else:
            waiter.set_result(None)

    def _answer_queue(self) -> None:
        """Answer the hits at the head of the queue, and what the parser held back at a
        full queue, parsed as aiohttp's loop parses it."""
        self._answering = True
        try:
            answered = self._answer_head()
            while self._buffer_paused and len(self._messages) <= self._msg_queue_resume_size:
                queued = len(self._messages)
                self._resume_reading_if_drained()
                if len(self._messages) == queued:
                    break
                answered += self._answer_head()
        finally:
            self._answering = False
        if answered:
            self._answered(answered)

    def _answer_head(self) -> int:
        """Hits answered from the head of the queue, until one is not or writing pauses."""
        answer, messages, transport = self._wire, self._messages, self.transport
        answered = 0
        while messages and not self._paused and transport is not None and answer is not None:
            message, payload = messages[0]
            if payload is not EMPTY_PAYLOAD or not answer(message, transport, self._sockfd):  # type: ignore[arg-type]
                break
            messages.popleft()
            self._parser.message_consumed()  # type: ignore[union-attr]
            answered += 1
            transport = self.transport  # None once a cut answer closed it
        return answered
