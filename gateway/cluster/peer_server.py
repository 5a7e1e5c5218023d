"""The peer server: answers other nodes' signed requests from this node's tiers.

It serves the routes of the peer wire (``peers.py``): a block from the node's
tiers or its own coalesced origin fill (``read_block``), a metadata answer as
the key's owner (``metadata``), invalidations (``invalidate``, ``drop_all``),
named messages (``on_message``, e.g. prefetch registrations), and routes other
features mount under ``/_hoard/peer/<name>/`` (warm jobs). What it answers
with is a ``NodeAnswers`` the wiring hands to ``serve`` once the reader exists
(the node's cluster part is built before the tiers, which place blocks
through it), so it imports no tier and no reader; a request before that is a
503, as from a node still starting.

Every request is checked before anything is read: the signature over method,
this node's URL (``audience``), target, date within ``MAX_SKEW`` and nonce; the
nonce against every one the node accepted (``replays.py``, shared by its
workers), and a body against the signed ``sha256``. Every answer to an
accepted request is signed in turn (``X-Hoard-Answer``, ``peers.py``): a
response held whole over its body, a block over its status and length.
A block's first piece is awaited before the headers go out, so a block that
cannot be had is still a status (404, 412, 503 with ``X-Hoard-Error``) the
asking node acts on; after the first byte a failure can only cut the
connection, which the client reads as ``PeerUnavailable`` at that byte.

Not guaranteed: a message body is held whole (up to 64 MiB) before its
digest is checked; a block that fails after its first byte can only be a cut
connection, never a status.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from gateway.cluster.peers import (
    ANSWER_HEADER,
    DATE_HEADER,
    ERROR_HEADER,
    MAX_SKEW,
    NONCE_HEADER,
    PREFIX,
    READ_BUFFER,
    SIGNATURE_HEADER,
    STREAMED,
    BlockRequest,
    PeerNotCached,
    audience_of,
    parse_date,
    parse_metadata_query,
    parse_nonce,
    same_digest,
    sign,
    sign_answer,
)
from gateway.cluster.replays import SeenCounters
from gateway.core import errors
from gateway.core.invalidation import Invalidation
from gateway.metadata.query import MetadataQuery
from gateway.pieces import CLIENT_GONE, Piece

Pieces = AsyncIterator[Piece]

log = logging.getLogger(__name__)

_MAX_MESSAGE = 64 * 1024**2  # a message body (a prefetch order of many keys) held at once
_FIELDS = ("origin", "bucket", "key", "prefix")  # of an Invalidation; others are ignored

MountedHandler = Callable[[web.Request, str, bytes], Awaitable[web.StreamResponse]]


class PieceSender(Protocol):  # gateway.s3.body.BodySender is one
    async def send(self, request: web.Request, writer: AbstractStreamWriter, piece: Piece) -> None:
        """Send ``piece``; release a FileSegment whether or not it was sent."""


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body: dict[str, Any] = {"error": code, "message": message}
    if headers:
        body["headers"] = headers  # a delete marker's 404 names itself
    return web.json_response(body, status=status, headers={ERROR_HEADER: code})


def _status_of(exc: Exception) -> web.Response:
    """A failure before the first byte, as the status the requesting node acts on."""
    if isinstance(exc, PeerNotCached):
        return _error(404, "NotCached", str(exc))
    if isinstance(exc, errors.NoSuchBucket):  # not "no such key": the asker asks the origin
        return _error(404, "NoSuchBucket", str(exc))
    if isinstance(exc, errors.NoSuchKey):
        return _error(404, "NoSuchKey", str(exc), exc.headers)
    if isinstance(exc, errors.NotFound):
        return _error(404, "NoSuchKey", str(exc))
    if isinstance(exc, errors.OriginChanged | errors.PreconditionFailed):
        return _error(412, "OriginChanged", str(exc))
    if not isinstance(exc, errors.HoardError | OSError):
        log.error("peer block read failed", exc_info=exc)
    # AccessDenied lands here too: a 403 would read as a bad signature, and the
    # requesting node learns the real answer when it falls back to the origin.
    return _error(503, "Unavailable", str(exc) or type(exc).__name__)


class NodeAnswers(Protocol):
    """What this node answers other nodes with (``wiring.PeerAnswers`` is the real one)."""

    def read_block(self, request: BlockRequest) -> AsyncIterator[Piece]:
        """A block from this node's tiers or its own coalesced origin fill."""
        ...

    async def invalidate(self, items: list[Invalidation]) -> None: ...

    async def metadata(self, query: MetadataQuery) -> dict[str, object]:
        """The key's metadata as its owner knows it, JSON-ready."""
        ...

    async def drop_all(self) -> None:
        """Forget every metadata entry (a peer missed too many invalidations)."""
        ...

    async def on_message(self, name: str, body: bytes) -> None:
        """A named message another node ``announce``d (e.g. a prefetch registration)."""
        ...


class PeerServer:
    """Answers this node's peer endpoints with the ``NodeAnswers`` it serves."""

    def __init__(
        self,
        secret: str,
        body_sender: PieceSender | None = None,
        clock: Callable[[], float] = time.time,
        *,
        audience: str = "",
        seen: SeenCounters | None = None,
    ) -> None:
        """``audience``: this node's URL (``cluster.self``), which requests must be signed
        for ("": none is accepted); ``seen``: the node's accepted nonces (None: this
        process's own table)."""
        self._secret = secret
        self.audience = audience_of(audience)
        self._seen = seen if seen is not None else SeenCounters(None, 2 * MAX_SKEW + 1)
        self._answers: NodeAnswers | None = None  # until ``serve``
        self._sender = body_sender  # None: FileSegments are read in a thread and written
        self._clock = clock
        self._mounted: dict[str, MountedHandler] = {}

    def serve(self, answers: NodeAnswers) -> None:
        self._answers = answers

    def close(self) -> None:
        """Unmap the node's nonce table (the file stays for the other workers)."""
        self._seen.close()

    def mount(self, name: str, handler: MountedHandler) -> None:
        """Serve ``/_hoard/peer/<name>/...`` with ``handler(request, rest of path, body)``."""
        self._mounted[name] = handler

    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        """Answer one request whose path is under ``/_hoard/peer/``."""
        signature = self._authentic(request)
        if signature is None:
            return _error(403, "AccessDenied", "missing, wrong, expired or replayed signature")
        response = await self._route(request, path, signature)
        if isinstance(response, web.Response):  # held whole: signed over its body
            # Anything but bytes (none of ours) is signed as empty: the client refuses it.
            body = response.body if isinstance(response.body, bytes | bytearray) else b""
            self._sign_answer(response, signature, len(body), hashlib.sha256(body).hexdigest())
        return response

    def _sign_answer(
        self, response: web.StreamResponse, signature: str, length: int, digest: str
    ) -> None:
        """Sign ``response`` (before its headers go out) as the answer to ``signature``."""
        code = response.headers.get(ERROR_HEADER, "")
        response.headers[ANSWER_HEADER] = sign_answer(
            self._secret, signature, response.status, code, length, digest
        )

    async def _route(self, request: web.Request, path: str, signature: str) -> web.StreamResponse:
        answers = self._answers
        if answers is None:
            return _error(503, "Unavailable", "this node is starting")
        if path.startswith(f"{PREFIX}block/") and request.method == "GET":
            block = path.removeprefix(f"{PREFIX}block/")
            return await self._serve_block(request, block, answers, signature)
        if path == f"{PREFIX}invalidate" and request.method == "POST":
            return await self._serve_invalidate(request, answers)
        if path == f"{PREFIX}meta" and request.method == "GET":
            return await self._serve_metadata(request, answers)
        if path.startswith(f"{PREFIX}message/") and request.method == "POST":
            name = path.removeprefix(f"{PREFIX}message/")
            return await self._serve_message(request, name, answers)
        name, _, rest = path.removeprefix(PREFIX).partition("/")
        if name in self._mounted:
            body = await request.read()
            if body and not same_digest(
                hashlib.sha256(body).hexdigest(), request.query.get("sha256", "")
            ):
                return _error(403, "AccessDenied", "the body does not match the signed digest")
            return await self._mounted[name](request, rest, body)
        return _error(404, "NoSuchEndpoint", f"no peer endpoint {request.method} {path}")

    def _authentic(self, request: web.Request) -> str | None:
        """The request's signature if it is right, for this node, in time and new; else None.

        The nonce is remembered only once the signature holds: a forger cannot fill
        the table."""
        date = request.headers.get(DATE_HEADER, "")
        nonce = request.headers.get(NONCE_HEADER, "")
        moment, parsed, now = parse_date(date), parse_nonce(nonce), self._clock()
        if not (self._secret and self.audience) or moment is None or parsed is None:
            return None
        if abs(now - moment) > MAX_SKEW:
            return None
        expected = sign(self._secret, request.method, self.audience, request.raw_path, date, nonce)
        given = request.headers.get(SIGNATURE_HEADER, "")
        if not same_digest(expected, given) or not self._seen.accept(*parsed, now):
            return None
        return expected

    async def _serve_block(
        self, request: web.Request, digest: str, answers: NodeAnswers, signature: str
    ) -> web.StreamResponse:
        try:
            block = BlockRequest.from_query(request.raw_path.partition("?")[2])
        except (ValueError, KeyError) as exc:
            return _error(400, "InvalidRequest", f"bad block request: {exc!r}")
        if block.block_id.digest != digest:
            return _error(400, "InvalidRequest", "the digest does not name the queried block")
        async with aclosing(aiter(answers.read_block(block))) as pieces:
            # The first piece is awaited before the headers go out, so a block that
            # cannot be had is still a status the requesting node can act on.
            try:
                first = await anext(pieces)
            except StopAsyncIteration:
                return _error(503, "Unavailable", "the owner produced no bytes")
            except Exception as exc:
                return _status_of(exc)
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = block.length
            self._sign_answer(response, signature, block.length, STREAMED)
            await self._stream(request, response, first, pieces)
        return response

    async def _stream(
        self, request: web.Request, response: web.StreamResponse, first: Piece, pieces: Pieces
    ) -> None:
        try:
            try:
                writer = await response.prepare(request)
            except BaseException:
                if not isinstance(first, bytes | memoryview):
                    first.release()  # it never reached a sender, which releases segments
                raise
            sent = await self._send(request, writer, first)
            async for piece in pieces:
                sent += await self._send(request, writer, piece)
            if sent != response.content_length:
                raise errors.OriginUnavailable(f"the block read gave {sent} bytes")
            await response.write_eof()
        except CLIENT_GONE:
            log.debug("peer went away mid-block")
            _drop(request)
        except Exception:
            # The headers are out: a cut connection is the only honest signal left.
            log.exception("peer block read failed mid-body")
            _drop(request)

    async def _send(self, request: web.Request, writer: AbstractStreamWriter, piece: Piece) -> int:
        if isinstance(piece, bytes | memoryview):
            await writer.write(piece)
            return piece.nbytes if isinstance(piece, memoryview) else len(piece)
        if self._sender is not None:
            await self._sender.send(request, writer, piece)
            return piece.count
        try:  # no sendfile: one read of at most a block, in a thread
            data = await asyncio.to_thread(os.pread, piece.fd, piece.count, piece.offset)
        finally:
            piece.release()
        await writer.write(data)
        return len(data)

    async def _signed_body(self, request: web.Request) -> bytes | None:
        """The body (up to ``_MAX_MESSAGE`` bytes), if it is the one the signed ``sha256`` names."""
        parts, size = [], 0
        async for chunk in request.content.iter_chunked(READ_BUFFER):
            size += len(chunk)
            if size > _MAX_MESSAGE:
                return None
            parts.append(chunk)
        body = b"".join(parts)
        signed = request.query.get("sha256", "")
        return body if same_digest(hashlib.sha256(body).hexdigest(), signed) else None

    async def _serve_message(
        self, request: web.Request, name: str, answers: NodeAnswers
    ) -> web.StreamResponse:
        body = await self._signed_body(request)
        if body is None:
            return _error(403, "AccessDenied", "the body is too large or not the signed one")
        try:
            await answers.on_message(name, body)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, "InvalidRequest", f"bad {name} message: {exc!r}")
        return web.Response(status=204)

    async def _serve_invalidate(
        self, request: web.Request, answers: NodeAnswers
    ) -> web.StreamResponse:
        body = await self._signed_body(request)
        if body is None:
            return _error(403, "AccessDenied", "the body does not match the signed digest")
        try:
            # Unknown fields are ignored: a newer node may send more in a rolling upgrade.
            items = [Invalidation(**{n: i[n] for n in _FIELDS if n in i}) for i in json.loads(body)]
        except (ValueError, TypeError) as exc:
            return _error(400, "InvalidRequest", f"bad invalidation: {exc!r}")
        try:
            if request.query.get("all") == "1":
                await answers.drop_all()
            await answers.invalidate(items)
        except Exception as exc:
            log.exception("peer invalidation failed")
            return _error(503, "Unavailable", str(exc) or type(exc).__name__)
        return web.Response(status=204)

    async def _serve_metadata(
        self, request: web.Request, answers: NodeAnswers
    ) -> web.StreamResponse:
        try:
            query = parse_metadata_query(request.raw_path.partition("?")[2])
        except (ValueError, KeyError) as exc:
            return _error(400, "InvalidRequest", f"bad metadata query: {exc!r}")
        try:
            answer = await answers.metadata(query)
        except Exception as exc:
            return _status_of(exc)
        return web.json_response(answer)


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
