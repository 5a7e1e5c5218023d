"""The listening socket and the server loop around the application.

``web.run_app`` binds only after the application's start-up hooks ran, so a
banner printed from one announced an endpoint that might never serve (a busy
port), with the credential to use it, followed by a traceback. Binding first,
here, makes the order right: bind, then announce, then serve; a port that
cannot be had is one line on stderr and exit status 1.

``run`` is ``web.run_app`` for one bound socket with one difference: what
aiohttp's HTTP parser refuses (a malformed request line or header, a header
too long) never reaches the application, and aiohttp answers it itself in
plain text with its own ``Server`` header, logging a traceback per request.
aiohttp has no hook for that answer (aio-libs/aiohttp#3287), so the
connection handler is a subclass whose ``handle_error`` asks the application
for the answer (``server.rejected``: S3 XML, a request id, accounted) and logs
one line.

A client that takes no byte of an answer for ``send_timeout`` (the transport's
buffer full all that time) has its connection dropped, as nginx's
``send_timeout`` does: otherwise it holds the answer, and what the answer holds
open, for as long as it likes.

The parser also takes a request line without an ``HTTP/1.x`` version as an
HTTP/0.9 request, headers and body included, and aiohttp would answer it with
an ``HTTP/0.9`` status line no client reads. S3 speaks HTTP/1.x only, so such
a request is refused as the parser's own refusals are (a 400 in S3 XML, the
connection closed): the handler puts the parser's error in its place in the
queue before aiohttp's loop takes it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion10
from aiohttp.http_exceptions import BadStatusLine
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import _ErrInfo

from gateway.app.hotwire import HitConnection, Wire
from gateway.config.settings import split_listen

EXIT_BIND = 1
log = logging.getLogger("hoard")

Rejected = Callable[[int, str], web.StreamResponse]
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# Answers what it can before the application; None: the application answers.
First = Callable[[web.BaseRequest], Awaitable[web.StreamResponse | None]]


def bind(listen: str, reuse_port: bool) -> socket.socket:
    """The listening socket (``reuse_port``: shared by worker processes).

    Raises ``SystemExit(1)`` after one line on stderr when the port cannot be had.
    """
    host, port = split_listen(listen)
    sock: socket.socket | None = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(1024)
        return sock
    except OSError as exc:
        if sock is not None:
            sock.close()
        print(f"hoard: cannot listen on {listen}: {exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(EXIT_BIND) from None


def run(
    app: web.Application,
    sock: socket.socket,
    rejected: Rejected,
    loop: asyncio.AbstractEventLoop,
    ssl_context: ssl.SSLContext | None = None,
    first: First | None = None,
    wire: Wire | None = None,
    **server: Any,
) -> None:
    """Serve ``app`` on ``sock`` (over TLS with ``ssl_context``) until SIGTERM/SIGINT,
    as ``web.run_app`` does; ``first`` sees each request before the application, and
    ``wire`` before aiohttp builds a request of it (``hotwire.py``)."""
    asyncio.set_event_loop(loop)
    main = loop.create_task(_serve(app, sock, rejected, ssl_context, (first, wire), server))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main.done():
            main.cancel()
            with suppress(asyncio.CancelledError):
                loop.run_until_complete(main)
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(
    app: web.Application,
    sock: socket.socket,
    rejected: Rejected,
    ssl_context: ssl.SSLContext | None,
    ahead: tuple[First | None, Wire | None],
    server: dict[str, Any],
) -> None:
    runner = await start(app, sock, rejected, ssl_context, ahead, handle_signals=True, **server)
    try:
        await asyncio.Event().wait()  # until a signal raises GracefulExit
    finally:
        await runner.cleanup()


async def start(
    app: web.Application,
    sock: socket.socket,
    rejected: Rejected,
    ssl_context: ssl.SSLContext | None,
    ahead: tuple[First | None, Wire | None],
    **server: Any,
) -> web.AppRunner:
    """``app`` serving on ``sock`` until the returned runner's ``cleanup`` (tests serve so)."""
    runner = _Runner(app, rejected, *ahead, **server)
    await runner.setup()
    try:
        await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


class _Runner(web.AppRunner):
    def __init__(
        self, app: web.Application, rejected: Rejected, first: First | None,
        wire: Wire | None, send_timeout: float = 60.0, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(app, **kwargs)
        self._rejected = rejected
        self._first = first
        self._wire = wire
        self._send_timeout = send_timeout

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same object, handing out Hoard's connection handler
        server.rejected = self._rejected  # type: ignore[attr-defined]
        server.wire = self._wire  # type: ignore[attr-defined]
        server.send_timeout = self._send_timeout  # type: ignore[attr-defined]
        if self._first is not None:
            server.request_handler = _first_then(self._first, server.request_handler)
        return server


def _first_then(first: First, handler: Handler) -> Handler:
    """``first``'s answer, else the application's: no router or middleware runs for it."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        return await first(request) or await handler(request)

    return handle


class _Server(web.Server):
    rejected: Rejected
    wire: Wire | None
    send_timeout: float

    def __call__(self) -> HitConnection:
        return _Handler(self, loop=self._loop, **self._kwargs)


class _Handler(HitConnection):
    _stall: asyncio.TimerHandle | None = None  # armed while the transport's buffer is full

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            timeout = self._manager.send_timeout  # type: ignore[union-attr]
            self._stall = self._loop.call_later(timeout, self._stalled)

    def resume_writing(self) -> None:
        self._disarm()
        super().resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _disarm(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        """The client took no byte for ``send_timeout``: it is gone, or holds the answer
        (and what it holds open) on purpose. The connection is dropped; the answer's
        writer sees it closed, and records the body as cut."""
        self._stall = None
        log.info("client %s took no byte for %gs: connection dropped",
                 self.peername, self._manager.send_timeout)  # type: ignore[union-attr]  # fmt: skip
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        messages = self._messages
        if not messages:  # hits answered on the wire leave none
            return
        for at, (message, _) in enumerate(messages):
            if isinstance(message, RawRequestMessage) and message.version < HttpVersion10:
                refusal = BadStatusLine("a request line without HTTP/1.x")
                messages[at] = (_ErrInfo(400, refusal, refusal.message), EMPTY_PAYLOAD)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already started; cannot send an error")
        reason = type(exc).__name__ if exc is not None else HTTPStatus(status).phrase
        log.warning("request from %s refused before routing: %s %s", request.remote, status,
                    reason, exc_info=status >= 500)  # fmt: skip
        response = self._manager.rejected(status, reason)  # type: ignore[attr-defined]
        response.force_close()
        return response
