"""Peer fills: a node streams a block it owns to another node, over ``/_hoard/peer/``.

``GET /_hoard/peer/block/{digest}?origin=&bucket=&key=&etag=&index=&first=&last=&offset=&length=``
answers bytes [offset, offset+length) of the block (``first``..``last``: its range in
the object) with 200 and ``Content-Length: length``, streamed as the owner gets them
from its tiers or its own coalesced origin fill. Errors before the first byte are
JSON with an ``X-Hoard-Error`` code: 404 ``NoSuchKey``, 412 ``OriginChanged`` (the ETag
moved), 503 ``Unavailable``, 400 for a bad query. The client trusts the code, not
the status: a 404 from a node without this endpoint is "unavailable", not "no key".
``cached_only=1`` asks only for what the peer holds in its tiers: it answers 404
``NotCached`` rather than fill from its origin (a new owner asking a previous one).
``GET /_hoard/peer/meta?kind=head|list&origin=&bucket=&key=&…`` asks the owner of
a key (HEAD) or a prefix (LIST) for its metadata answer (see ``MetadataQuery``):
200 with JSON, 404 ``NoSuchKey``, 503 ``Unavailable``.
``POST /_hoard/peer/invalidate?sha256={hex of body}`` with a JSON list of ``{origin,
bucket, key}`` or ``{origin, bucket, prefix}`` drops them → 204; with ``all=1``
first, the node drops its whole metadata cache (a replay that overflowed).
``POST /_hoard/peer/message/{name}?sha256={hex of body}`` hands the body to the
server's ``on_message(name, body)`` → 204 (e.g. prefetch registrations).
Other features add their own routes under ``/_hoard/peer/<name>/`` with ``mount``
(warm jobs: ``gateway/warm/http.py``); they get the same signature check, and a
request body must come with ``sha256={hex of body}`` in the query, as above.

Each request carries ``X-Hoard-Date`` (epoch seconds or RFC 3339) and
``X-Hoard-Signature: hex(HMAC-SHA256(secret, METHOD "\\n" path?query "\\n" date))``
over the target as sent, checked in constant time with 5 minutes of skew; missing,
wrong or expired is 403 before anything is read. ``sha256`` binds an invalidation's
body to the signature. A server without a secret refuses everything.

Not guaranteed: secrecy (bytes travel in clear: keep peers on a private network or
give them https URLs); freshness (a captured request replays within the skew window,
which can only re-read a block or re-drop entries); completeness (after the first
byte a failure cuts the connection, the client raises ``PeerUnavailable`` after
yielding what arrived, and the caller resumes elsewhere at that byte); cleanup of
an abandoned ``read_block`` that is not closed (``contextlib.aclosing``): its
connection then stays open until the garbage collector finalizes the generator.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import ssl as ssl_
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlsplit

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from yarl import URL

from gateway import errors
from gateway.cache.block import BlockId
from gateway.invalidation import Invalidation
from gateway.pieces import Piece

Pieces = AsyncIterator[Piece]

log = logging.getLogger(__name__)

PREFIX = "/_hoard/peer/"
DATE_HEADER = "X-Hoard-Date"
SIGNATURE_HEADER = "X-Hoard-Signature"
ERROR_HEADER = "X-Hoard-Error"
MAX_SKEW = 300.0  # seconds of clock difference tolerated between nodes
_READ_BUFFER = 256 * 1024  # client-side buffer per connection: bounds memory per stream
_MAX_MESSAGE = 64 * 1024**2  # a message body (a prefetch order of many keys) held at once
_EPOCH = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
_INT = re.compile(r"[0-9]{1,19}")
_FIELDS = ("origin", "bucket", "key", "prefix")  # of an Invalidation; others are ignored


class PeerError(Exception):
    """A peer did not serve a block. Not a ``HoardError``: never shown to S3 clients as is."""


class PeerUnavailable(PeerError):
    """Unreachable, timed out, refused or failed, after yielding ``received`` bytes."""

    def __init__(self, message: str, received: int = 0, answered: bool = False) -> None:
        super().__init__(message)
        self.received = received
        self.answered = answered  # the peer answered (with an error): it is alive


class PeerNotFound(PeerError):
    """The owner's origin says the object does not exist; ``headers``: what its 404 said."""

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}


class PeerChanged(PeerError):
    """The owner's origin has another ETag for the object."""


class PeerNotCached(PeerError):
    """A ``cached_only`` request: the peer does not hold the block."""


@dataclass(frozen=True, slots=True)
class BlockRequest:
    origin: str
    bucket: str
    key: str
    etag: str
    index: int
    first: int  # inclusive byte range of the block within the object
    last: int
    offset: int  # the part wanted, relative to the block
    length: int
    cached_only: bool = False  # from the peer's tiers only, never from its origin

    def __post_init__(self) -> None:
        if not (0 <= self.first <= self.last and self.index >= 0 and self.offset >= 0):
            raise ValueError(f"bad block bounds in {self}")
        if not (self.length >= 1 and self.offset + self.length <= self.last - self.first + 1):
            raise ValueError(f"range outside the block in {self}")

    @property
    def block_id(self) -> BlockId:
        return BlockId(self.origin, self.bucket, self.key, self.etag, self.index)

    def target(self) -> str:
        """The path and query that ask a peer for this; keys may hold any character."""
        query = "&".join(f"{f.name}={_quote(str(getattr(self, f.name)))}"
                         for f in fields(self) if f.name != "cached_only")  # fmt: skip
        flag = "&cached_only=1" if self.cached_only else ""
        return f"{PREFIX}block/{self.block_id.digest}?{query}{flag}"

    @classmethod
    def from_query(cls, query: str) -> BlockRequest:
        """Parse a raw query; ``ValueError`` or ``KeyError`` if it is not one of ours."""
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True,
                          encoding="utf-8", errors="surrogatepass")  # fmt: skip
        values = dict(pairs)  # a repeated name keeps its last value; all were signed
        texts = {f.name: values[f.name] for f in fields(cls) if f.name != "cached_only"}
        ints = {n: _int(texts.pop(n)) for n in ("index", "first", "last", "offset", "length")}
        return cls(**texts, **ints, cached_only=values.get("cached_only") == "1")


@dataclass(frozen=True, slots=True)
class MetadataQuery:
    """A HEAD (``key``) or a LIST page (``key`` is the prefix) asked of its owner.

    ``ttl`` and ``negative_ttl`` are the asking node's mount policy, so the owner
    caches the answer as the asker would (``inf``: forever).
    """

    kind: str  # "head" | "list"
    origin: str
    bucket: str
    key: str
    ttl: float
    negative_ttl: float
    delimiter: str = ""
    start_after: str = ""
    max_keys: int = 1000

    def __post_init__(self) -> None:
        if self.kind not in ("head", "list") or self.max_keys < 1:
            raise ValueError(f"bad metadata query {self}")
        if not (self.ttl >= 0 and self.negative_ttl >= 0):  # also refuses NaN
            raise ValueError(f"bad metadata query {self}")

    def target(self) -> str:
        query = "&".join(f"{f.name}={_quote(str(getattr(self, f.name)))}" for f in fields(self))
        return f"{PREFIX}meta?{query}"

    @classmethod
    def from_query(cls, query: str) -> MetadataQuery:
        """Parse a raw query; ``ValueError`` or ``KeyError`` if it is not one of ours."""
        values = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=True,
                                encoding="utf-8", errors="surrogatepass"))  # fmt: skip
        texts = {f.name: values[f.name] for f in fields(cls)}
        floats = {n: float(texts.pop(n)) for n in ("ttl", "negative_ttl")}
        max_keys = _int(texts.pop("max_keys"))
        return cls(**texts, **floats, max_keys=max_keys)


MountedHandler = Callable[[web.Request, str, bytes], Awaitable[web.StreamResponse]]


class PieceSender(Protocol):  # gateway.s3.body.BodySender is one
    async def send(self, request: web.Request, writer: AbstractStreamWriter, piece: Piece) -> None:
        """Send ``piece``; release a FileSegment whether or not it was sent."""


def sign(secret: str, method: str, target: str, date: str) -> str:
    """The hex signature of one request; ``target`` is the path and query as sent."""
    message = f"{method}\n{target}\n{date}".encode("utf-8", "surrogateescape")
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _same(expected: str, given: str) -> bool:
    # Constant time, on bytes: compare_digest refuses str that is not ASCII.
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))


def _quote(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _int(text: str) -> int:
    if not _INT.fullmatch(text):  # int() would take " 1", "+1" and "1_0"
        raise ValueError(f"not a non-negative integer: {text!r}")
    return int(text)


def _parse_date(text: str) -> float | None:
    if _EPOCH.fullmatch(text):
        return float(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


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


class PeerServer:
    """Answers this node's peer endpoints from injected callables."""

    def __init__(
        self,
        secret: str,
        read_block: Callable[[BlockRequest], AsyncIterator[Piece]],
        invalidate: Callable[[list[Invalidation]], Awaitable[None]],
        body_sender: PieceSender | None = None,
        clock: Callable[[], float] = time.time,
        *,
        metadata: Callable[[MetadataQuery], Awaitable[Any]] | None = None,
        drop_all: Callable[[], Awaitable[None]] | None = None,
        on_message: Callable[[str, bytes], Awaitable[None]] | None = None,
    ) -> None:
        self._secret = secret
        self._on_message = on_message
        self._read_block = read_block
        self._invalidate = invalidate
        self._metadata = metadata  # the owner's answer, JSON-ready
        self._drop_all = drop_all
        self._sender = body_sender  # None: FileSegments are read in a thread and written
        self._clock = clock
        self._mounted: dict[str, MountedHandler] = {}

    def mount(self, name: str, handler: MountedHandler) -> None:
        """Serve ``/_hoard/peer/<name>/...`` with ``handler(request, rest of path, body)``."""
        self._mounted[name] = handler

    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        """Answer one request whose path is under ``/_hoard/peer/``."""
        if not self._authentic(request):
            return _error(403, "AccessDenied", "missing, wrong or expired cluster signature")
        if path.startswith(f"{PREFIX}block/") and request.method == "GET":
            return await self._serve_block(request, path.removeprefix(f"{PREFIX}block/"))
        if path == f"{PREFIX}invalidate" and request.method == "POST":
            return await self._serve_invalidate(request)
        if path == f"{PREFIX}meta" and request.method == "GET" and self._metadata is not None:
            return await self._serve_metadata(request)
        if path.startswith(f"{PREFIX}message/") and request.method == "POST":
            return await self._serve_message(request, path.removeprefix(f"{PREFIX}message/"))
        name, _, rest = path.removeprefix(PREFIX).partition("/")
        if name in self._mounted:
            body = await request.read()
            if body and not _same(
                hashlib.sha256(body).hexdigest(), request.query.get("sha256", "")
            ):
                return _error(403, "AccessDenied", "the body does not match the signed digest")
            return await self._mounted[name](request, rest, body)
        return _error(404, "NoSuchEndpoint", f"no peer endpoint {request.method} {path}")

    def _authentic(self, request: web.Request) -> bool:
        date = request.headers.get(DATE_HEADER, "")
        moment = _parse_date(date)
        if not self._secret or moment is None or abs(self._clock() - moment) > MAX_SKEW:
            return False
        expected = sign(self._secret, request.method, request.raw_path, date)
        return _same(expected, request.headers.get(SIGNATURE_HEADER, ""))

    async def _serve_block(self, request: web.Request, digest: str) -> web.StreamResponse:
        try:
            block = BlockRequest.from_query(request.raw_path.partition("?")[2])
        except (ValueError, KeyError) as exc:
            return _error(400, "InvalidRequest", f"bad block request: {exc!r}")
        if block.block_id.digest != digest:
            return _error(400, "InvalidRequest", "the digest does not name the queried block")
        async with aclosing(aiter(self._read_block(block))) as pieces:
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
        except (ConnectionResetError, TimeoutError):
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
        async for chunk in request.content.iter_chunked(_READ_BUFFER):
            size += len(chunk)
            if size > _MAX_MESSAGE:
                return None
            parts.append(chunk)
        body = b"".join(parts)
        signed = request.query.get("sha256", "")
        return body if _same(hashlib.sha256(body).hexdigest(), signed) else None

    async def _serve_message(self, request: web.Request, name: str) -> web.StreamResponse:
        body = await self._signed_body(request)
        if body is None:
            return _error(403, "AccessDenied", "the body is too large or not the signed one")
        if self._on_message is None:
            return _error(404, "NoSuchEndpoint", "this node takes no peer messages")
        try:
            await self._on_message(name, body)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, "InvalidRequest", f"bad {name} message: {exc!r}")
        return web.Response(status=204)

    async def _serve_invalidate(self, request: web.Request) -> web.StreamResponse:
        body = await self._signed_body(request)
        if body is None:
            return _error(403, "AccessDenied", "the body does not match the signed digest")
        try:
            # Unknown fields are ignored: a newer node may send more in a rolling upgrade.
            items = [Invalidation(**{n: i[n] for n in _FIELDS if n in i}) for i in json.loads(body)]
        except (ValueError, TypeError) as exc:
            return _error(400, "InvalidRequest", f"bad invalidation: {exc!r}")
        try:
            if request.query.get("all") == "1" and self._drop_all is not None:
                await self._drop_all()
            await self._invalidate(items)
        except Exception as exc:
            log.exception("peer invalidation failed")
            return _error(503, "Unavailable", str(exc) or type(exc).__name__)
        return web.Response(status=204)

    async def _serve_metadata(self, request: web.Request) -> web.StreamResponse:
        assert self._metadata is not None
        try:
            query = MetadataQuery.from_query(request.raw_path.partition("?")[2])
        except (ValueError, KeyError) as exc:
            return _error(400, "InvalidRequest", f"bad metadata query: {exc!r}")
        try:
            answer = await self._metadata(query)
        except Exception as exc:
            return _status_of(exc)
        return web.json_response(answer)


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


class PeerClient:
    """Asks other nodes for blocks and invalidations, over one pooled session."""

    def __init__(
        self,
        secret: str,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 10.0,
        max_connections: int = 64,
        ssl: ssl_.SSLContext | None = None,
    ) -> None:
        """``ssl``: how https:// peers are verified (default: the system's trust store)."""
        if not secret:
            raise ValueError("peer requests need cluster.secret")
        self._secret = secret
        # "connect" includes the wait for a pooled connection: an overloaded pool
        # falls back along the ranking instead of queueing; sock_read bounds a stall.
        self._timeout = aiohttp.ClientTimeout(connect=connect_timeout, sock_read=read_timeout)
        self._max_connections = max_connections
        self._ssl: ssl_.SSLContext | bool = ssl if ssl is not None else True
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # built on first use: a session needs the running loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                read_bufsize=_READ_BUFFER,
            )
        return self._session

    def _signed(self, method: str, peer_url: str, target: str) -> tuple[URL, dict[str, str]]:
        base, date = peer_url.rstrip("/"), str(int(time.time()))
        signature = sign(self._secret, method, urlsplit(base).path + target, date)
        # encoded=True: yarl must send the target byte for byte as it was signed.
        return URL(base + target, encoded=True), {DATE_HEADER: date, SIGNATURE_HEADER: signature}

    async def read_block(self, peer_url: str, request: BlockRequest) -> AsyncIterator[bytes]:
        """The requested bytes from ``peer_url``, each chunk yielded as it arrives.

        Raises ``PeerNotFound`` (404) or ``PeerChanged`` (412) before any byte, and
        ``PeerUnavailable`` (connection error, timeout, any other answer, a short
        body) before or after some. Nothing is sent before the first iteration.
        """
        url, headers = self._signed("GET", peer_url, request.target())
        received = 0
        try:
            async with self._client().get(url, headers=headers) as response:
                await _check(response, request.length)
                try:
                    while chunk := await response.content.readany():
                        received += len(chunk)
                        yield chunk
                finally:
                    if received != request.length:  # abandoned or short: not reusable
                        response.close()
            if received != request.length:
                raise PeerUnavailable(f"{peer_url} sent {received} of {request.length} bytes")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            message = f"{peer_url}: {type(exc).__name__}: {exc}"
            raise PeerUnavailable(message, received) from exc

    async def metadata(self, peer_url: str, query: MetadataQuery, timeout: float) -> Any:
        """The owner's JSON answer to ``query``.

        Raises ``PeerNotFound`` (the owner's origin said NoSuchKey) or
        ``PeerUnavailable`` (``answered`` when the peer answered with an error).
        """
        url, headers = self._signed("GET", peer_url, query.target())
        try:
            async with self._client().get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                if response.status != 200:
                    await _check(response, 0)
                return await response.json()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            message = f"{peer_url}: {type(exc).__name__}: {exc}"
            raise PeerUnavailable(message) from exc

    async def invalidate(
        self, peer_url: str, items: list[Invalidation], timeout: float = 2.0, drop_all: bool = False
    ) -> bool:
        """Ask ``peer_url`` to drop ``items`` (and, with ``drop_all``, its whole metadata
        cache first): True once it has, False on any failure."""
        body = json.dumps([asdict(item) for item in items]).encode()
        flag = "all=1&" if drop_all else ""
        return await self._post(peer_url, f"invalidate?{flag}", body, timeout, "an invalidation")

    async def message(self, peer_url: str, name: str, body: bytes, timeout: float = 2.0) -> bool:
        """Hand ``body`` to ``peer_url``'s ``on_message(name, body)``: True once it took it."""
        return await self._post(peer_url, f"message/{name}?", body, timeout, f"a {name} message")

    async def _post(self, peer_url: str, path: str, body: bytes, timeout: float, what: str) -> bool:
        """POST ``body`` to ``path`` (ending in ``?`` or ``&``, the digest is appended)."""
        target = f"{PREFIX}{path}sha256={hashlib.sha256(body).hexdigest()}"
        url, headers = self._signed("POST", peer_url, target)
        headers["Content-Type"] = "application/json"
        try:
            async with self._client().post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                if response.status == 204:
                    return True
                log.warning("peer %s refused %s: %s", peer_url, what, response.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("peer %s unreachable for %s: %r", peer_url, what, exc)
        return False

    async def call_json(
        self, method: str, peer_url: str, target: str, body: Any = None, timeout: float = 5.0
    ) -> tuple[int, Any]:
        """A signed JSON request to a mounted route: (status, parsed answer).

        Raises ``PeerUnavailable`` when the peer cannot be reached or its answer
        is not JSON.
        """
        data = b"" if body is None else json.dumps(body).encode()
        if data:
            sep = "&" if "?" in target else "?"
            target = f"{target}{sep}sha256={hashlib.sha256(data).hexdigest()}"
        url, headers = self._signed(method, peer_url, target)
        if data:
            headers["Content-Type"] = "application/json"
        try:
            async with self._client().request(
                method, url, data=data or None, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:  # fmt: skip
                return response.status, json.loads(await response.read() or b"null")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise PeerUnavailable(f"{peer_url}: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _check(response: aiohttp.ClientResponse, length: int) -> None:
    """Raise what an answer other than 200 with ``length`` bytes means to the caller."""
    if response.status == 200:
        if response.content_length != length:
            raise PeerUnavailable(f"peer answers {response.content_length} bytes, not {length}")
        return
    code = response.headers.get(ERROR_HEADER, "")
    message = (await response.content.read(1024)).decode("utf-8", "replace")
    if response.status == 404 and code == "NoSuchKey":
        raise PeerNotFound(message, _said(message))
    if response.status == 412 and code == "OriginChanged":
        raise PeerChanged(message)
    if response.status == 404 and code == "NotCached":
        raise PeerNotCached(message)
    raise PeerUnavailable(f"peer answered {response.status} {code}: {message}", answered=True)


def _said(body: str) -> dict[str, str]:
    """The origin's headers a NoSuchKey answer carries, if it is whole JSON naming them."""
    try:
        said = json.loads(body).get("headers", {})
    except (ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in said.items()} if isinstance(said, dict) else {}
