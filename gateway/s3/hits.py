"""The hit path: a plain GET of a small object this node holds, answered lean.

Small-object hits are the hot path of image training, and most of what a hit
cost in the general path was machinery, not work: aiohttp's router, the
middleware and the prepare signal, a ``StreamResponse`` whose header dict is
built, validated and serialised on every request, the range and conditional
parsers, an ``ObjectRead`` with its async generators and tallies. A hit needs
less: the request admitted (route, signature, per-key limits: ``S3Front.admit``,
the very code the general path runs), one lookup of the object's metadata and
its one block (``Reader.held``: the node's invalidation journal is caught up
first, so a write acknowledged by any worker is seen), a header block rendered
once per object version, and the body (memory bytes in one ``writelines``, or
a disk segment with sendfile through the ``BodySender``).

A single byte range is a hit too: training loaders read small objects with a
ranged GET (s3torchconnector and DLIO ask ``bytes=0-8388607`` of every object),
so a range the hit path left to the general path made every warm epoch of
theirs pay the general path. The range is read as the general path reads it
(``ranges.parse_range``; a header S3 ignores is the whole object, 200), and
answered with the same 206, ``Content-Range`` and length; the header block
kept per object holds the object's own headers once, for both answers.

What the hit path takes is decided before anything is answered, and whatever
it does not take goes to the general path untouched, which then answers as if
the hit path did not exist: anything but a GET over HTTP/1.1 with
keep-alive (HEAD too: it reads no block, and the general path answers it
from metadata alone); a range past the end (the general path's 416),
conditionals (``If-*``), ``Expect``, ``response-*``
overrides; a browser's request (``Origin``: its answer carries the bucket's CORS
headers, which the general path finds, ``cors.py``; a request without it pays
nothing for this, the header is one more name in the set each is looked up in);
anything the
front refuses (a bad signature, a denied key: the general path answers the
S3 error); objects larger than one
block, empty ones, ones not held in memory or on disk (a miss fills through
the general path), and mounts with a TTL of 0. The answer is the general
path's byte for byte but for the order of header lines: the same headers from
``objects.object_headers``, ``Server`` and the request id; metrics and the
access log get the same record through ``server.account``.

Two ways in. ``answer_now`` runs inside the connection's protocol as the
request's bytes arrive (``app/hotwire.py``): everything it needs is held
(``Reader.held_now``: memory, or a disk record, looked up in the node's
metadata store and disk index with point reads on the loop and checked there
if it is small, the first time this worker reads it), so it answers without a
task, a coroutine or an aiohttp request, and writes a disk record with a
non-blocking ``sendfile`` (the rest, if the socket is full, as bytes read with
``pread``). ``answer`` is the same decision for a request that reached aiohttp
(the connection was busy, or a lookup must wait: a busy database, a large
record to check); a request the wire found nothing held for goes from there
straight to the general path (a cold key is looked up once, not twice).
A hit ``answer_now`` sent is kept by its bytes (a header-signed one by its
signed form), and ``answer_again`` answers their repeats from them, checking
only what can change (``express.py``).

NOTE: the answer is written to the transport directly; the connection's next
request runs only once the transport is below its high-water mark (``answer``
waits for the drain, as aiohttp's own writer does; the protocol holds the next
request until ``resume_writing``): a client that stops reading holds one answer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.http_parser import RawRequestMessage

from gateway.core import errors
from gateway.core.heads import Head, parse_head
from gateway.core.hot_sets import Doorkeeper
from gateway.obs import request_keys as keys
from gateway.obs.metrics import Metrics
from gateway.origins.base import ObjectInfo
from gateway.pieces import FileSegment, Piece
from gateway.read.reader import Reader
from gateway.s3.auth import Principal
from gateway.s3.body import BodySender
from gateway.s3.call import Call
from gateway.s3.errors import S3Error
from gateway.s3.express import ExpressLane, Lane
from gateway.s3.front import S3Front
from gateway.s3.hit_bytes import Span, part, status, tail, write_now
from gateway.s3.objects import OVERRIDES, cut_reason, object_headers
from gateway.s3.ranges import parse_range

log = logging.getLogger(__name__)

# A request carrying any of these is answered by the general path.
_GENERAL_HEADERS = (
    "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since",
    "x-amz-copy-source", "Expect", "Origin",
)  # fmt: skip
_GENERAL_LOWER = frozenset(name.lower() for name in (*_GENERAL_HEADERS, "Content-Length"))
_HANDED = 1024  # wire requests handed on whose verified caller is kept (a closed connection's
# is never asked for: the oldest go)
# Set per request, never from the object (the general path's prepare hook sets them too).
_PER_REQUEST = ("Server", "x-amz-request-id", "x-amz-id-2")
_OWN_LOWER = frozenset(name.lower() for name in (*_PER_REQUEST, "Content-Length"))
_OK, _PARTIAL = b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 206 Partial Content\r\n"

# The metrics and access-log line of a hit: request, status, body bytes, seconds, tier.
Account = Callable[[web.BaseRequest, int, int, float, str], None]
# ``Account`` of a whole hit answered again from its bytes (``express.py``), no request
# made: request id, decoded path, bucket, mount, status, body bytes, seconds, tier.
CountHit = Callable[[str, str, str, str, int, int, float, str], None]


class WireRequest(dict[str, Any]):
    """A request parsed on the wire, as ``S3Front.admit`` and ``server.account`` read it:
    method, host, raw path and headers, and a dict for what they note, as aiohttp's
    request is. No ``BaseRequest`` is built for a hit answered on the wire."""

    __slots__ = ("_url", "headers", "host", "method", "raw_path")

    def __init__(self, message: RawRequestMessage | Head, host: str) -> None:
        super().__init__()
        self.method: str = message.method
        self.host = host
        self.raw_path: str = message.path
        self.headers = message.headers
        self._url = message.url

    @property
    def path(self) -> str:
        """The decoded path, as aiohttp's request has it (the access log's)."""
        return str(self._url.path)


class _Prepared(NamedTuple):
    """An answer decided, not yet sent: its header block up to the per-request lines
    (whether they hold the origin's ``Date``), the range, the body, what it is of."""

    block: bytes
    dated: bool
    span: Span
    piece: Piece
    info: ObjectInfo
    tier: str


class HitPath:
    """Answers hits of small objects in front of the aiohttp application (see the module)."""

    def __init__(
        self, front: S3Front, reader: Reader, body: BodySender, metrics: Metrics,
        new_id: Callable[[], str], account: Account, count: CountHit,
    ) -> None:  # fmt: skip
        self._front = front
        self._metrics = metrics
        self._reader = reader
        self._body = body
        self._new_id = new_id
        self._account = account
        # (bucket, key, with checksums) -> the metadata it was rendered from, its whole
        # answer's status line and headers, its own headers alone (for a range), whether
        # they hold a Date
        self._blocks: OrderedDict[tuple[str, str, bool], tuple[ObjectInfo, bytes, bytes, bool]] = (
            OrderedDict()
        )
        self._door = Doorkeeper(front.hot.keys)  # what a full set of blocks takes in
        # Presigned hits answered again from their bytes alone (``express.py``).
        self._lane = ExpressLane(front, reader)
        self._count = count
        # The request (its target and headers, as sent) -> (principal, credentials
        # generation, settled) of wire requests admitted but not answered there. Keyed by
        # content, not by object: a head the wire parsed itself (``core/heads.py``) reaches
        # aiohttp as another object, parsed anew from the same bytes; and by every header,
        # so only the very request verified is spared its verification.
        self._handed: OrderedDict[
            tuple[str, tuple[tuple[str, str], ...]], tuple[Principal, int, bool]
        ] = OrderedDict()

    def answer_again(self, head: bytes, transport: asyncio.Transport, sockfd: int | None) -> bool:
        """Answer ``head`` (one whole request head, as sent) if it repeats a presigned hit
        answered before and nothing it depends on changed (``express.py``); False:
        nothing was sent, ``answer_now`` decides."""
        repeat = self._lane.repeat(head, transport)
        if repeat is None:
            return False
        started = time.perf_counter()
        lane, piece, tier = repeat
        request_id = self._new_id()
        try:
            write_now(transport, sockfd, lane.block + tail(lane.dated, int(time.time()),
                                                           request_id), piece)  # fmt: skip
        except Exception as exc:  # the headers may be gone: cut, and accounted as one
            request = self._repeated(head, lane, request_id)
            _cut(request, transport, exc, 0)
            self._account(request, lane.status, lane.length, time.perf_counter() - started,
                          tier)  # fmt: skip
            return True
        finally:
            if isinstance(piece, FileSegment):
                piece.release()
        self._count(request_id, lane.path, lane.bucket, lane.mount, lane.status, lane.length,
                    time.perf_counter() - started, tier)  # fmt: skip
        return True

    @property
    def front(self) -> S3Front:
        """The front whose admission this path shares (its memo of routes, for one)."""
        return self._front

    def answer_now(
        self, message: RawRequestMessage | Head, transport: asyncio.Transport, sockfd: int | None
    ) -> bool:
        """Answer ``message`` if it is a hit held now, without awaiting anything; False:
        nothing was sent. ``sockfd``: the connection's socket for sendfile (None: TLS)."""
        if not isinstance(message, (RawRequestMessage, Head)):
            return False  # what the parser refused: aiohttp's error handler answers it
        host = _plain_message(message)
        if host is None:
            return False
        request = WireRequest(message, host)
        started = time.perf_counter()
        call = self._admitted(request)
        if call is None:
            return False
        try:
            held = self._reader.held_now(call.bucket, call.key)
        except (S3Error, errors.HoardError):
            held = True
        except Exception:  # nothing is sent yet: the general path answers, as S3 XML
            log.exception("hit path failed before answering, request %s", request[keys.REQUEST_ID])
            held = True
        prepared = (
            None if isinstance(held, bool) else self._prepared(request, call, held, transport)
        )
        if prepared is None:
            self._hand_on(message, call, settled=held is False)
            return False
        code, length = status(prepared.span, prepared.info.size)
        try:
            write_now(transport, sockfd, self._head(request, prepared), prepared.piece)
        except Exception as exc:  # the headers may be gone: cut, as objects._stream does
            _cut(request, transport, exc, 0)
        finally:
            if isinstance(prepared.piece, FileSegment):
                prepared.piece.release()
        elapsed = time.perf_counter() - started
        self._account(request, code, length, elapsed, prepared.tier)  # type: ignore[arg-type]
        if isinstance(message, Head) and keys.CUT not in request:
            self._lane.keep(message, call.principal, host, request[keys.MOUNT], request.path,
                            call.bucket, call.key, prepared.info, prepared.span, prepared.block,
                            prepared.dated)  # fmt: skip
        return True

    async def answer(self, request: web.Request) -> web.StreamResponse | None:
        """The answer to a hit, already sent; None: the general path answers ``request``."""
        if not _plain(request):
            return None
        started = time.perf_counter()
        handed = self._handed.pop(_sent_as(request.raw_path, request.headers), None)
        if handed is not None:
            principal, generation, settled = handed
            if generation == self._front.credentials_generation:  # no SIGHUP since
                request[keys.PRINCIPAL] = principal  # verified on the wire a moment ago
                if settled:  # nothing held there a moment ago: a cold key's way
                    return None
        call = self._admitted(request)
        if call is None:
            return None
        try:
            held = await self._reader.held(call.bucket, call.key)
        except (S3Error, errors.HoardError):
            return None  # the general path answers the error, as it would have
        except Exception:  # nothing is sent yet: the general path answers, as S3 XML
            log.exception("hit path failed before answering, request %s", request[keys.REQUEST_ID])
            return None
        transport = request.transport
        prepared = None if held is None else self._prepared(request, call, held, transport)
        if prepared is None or transport is None:
            return None
        code, length = status(prepared.span, prepared.info.size)
        piece = prepared.piece
        try:
            if isinstance(piece, FileSegment):
                transport.write(self._head(request, prepared))  # the body follows with sendfile
                await self._body.send(request, request.writer, piece)
            else:
                transport.writelines((self._head(request, prepared), piece))
            await request.writer.drain()
        except Exception as exc:  # the headers are gone: cut, as objects._stream does
            _cut(request, transport, exc, 0)
        self._account(request, code, length, time.perf_counter() - started, prepared.tier)
        return _Sent()

    @staticmethod
    def _repeated(head: bytes, lane: Lane, request_id: str) -> WireRequest:
        """The request a repeat was, as ``admit`` notes one (for the rare answer that needs
        it: a cut one)."""
        message = parse_head(head)
        assert message is not None  # it was parsed before it was kept
        request = WireRequest(message, lane.host)
        request[keys.REQUEST_ID], request[keys.OPERATION] = request_id, "GetObject"
        request[keys.BUCKET], request[keys.MOUNT] = lane.bucket, lane.mount
        return request

    def _hand_on(self, message: RawRequestMessage | Head, call: Call, settled: bool) -> None:
        """Keep who ``message`` was verified as, for aiohttp's request of the same message
        (``answer``, then the general path): a miss is not verified two more times.
        ``settled``: nothing is held of the key (``Reader.held_now`` False), so ``answer``
        leaves it to the general path at once rather than look again."""
        generation = self._front.credentials_generation
        self._handed[_sent_as(message.path, message.headers)] = (call.principal, generation,
                                                                 settled)  # fmt: skip
        if len(self._handed) > _HANDED:
            self._handed.popitem(last=False)

    def _admitted(self, request: web.BaseRequest | WireRequest) -> Call | None:
        """The call of a GET of an object the front admits as it is (no ``response-*``
        overrides); None: the general path answers (a refusal too, as it would have)."""
        request_id = self._new_id()
        request[keys.REQUEST_ID] = request_id
        try:
            call, served = self._front.admit(request, request_id)  # type: ignore[arg-type]
        except (S3Error, errors.HoardError):
            return None
        except Exception:  # nothing is sent yet: the general path answers, as S3 XML
            log.exception("hit path failed before answering, request %s", request_id)
            return None
        if not served or call.route.operation != "GetObject":
            return None
        if call.query and not OVERRIDES.keys().isdisjoint(call.query):
            return None  # response-* overrides: the general path checks and applies them
        return call

    def _prepared(
        self, request: web.BaseRequest | WireRequest, call: Call,
        held: tuple[ObjectInfo, Piece, str], transport: asyncio.Transport | None,
    ) -> _Prepared | None:  # fmt: skip
        """The answer to ``request`` from ``held`` (its ``Range`` read as the general path
        reads it). None, with a file's piece released, where the general path answers
        instead: a range past the end (its 416), headers it would refuse, a client gone."""
        info, whole, tier = held
        try:
            span = _span(request.headers.get("Range"), info.size)
        except errors.RangeNotSatisfiable:
            block, piece = None, whole
        else:
            piece = part(whole, span)
            block = None if transport is None else self._block(request, call.bucket, call.key,
                                                               info, span, transport)  # fmt: skip
        if block is None:
            if isinstance(piece, FileSegment):
                piece.release()
            return None
        return _Prepared(*block, span, piece, info, tier)

    def _block(
        self, request: web.BaseRequest | WireRequest, bucket: str, key: str, info: ObjectInfo,
        span: Span, transport: asyncio.Transport,
    ) -> tuple[bytes, bool] | None:  # fmt: skip
        """The status line and headers of the answer (of ``span`` of the object; None: all
        of it) up to the per-request ones, and whether they hold a ``Date``; None if they
        cannot be sent as they are (the general path refuses them as it always did) or the
        client is gone. The caller still holds the body."""
        # S3 sends the whole object's checksums when asked, never on a range (objects.py).
        checksums = span is None and _asks_checksums(request.headers)
        rendered = self._rendered(bucket, key, info, checksums)
        if rendered is None or transport.is_closing():
            return None
        whole, own, dated = rendered
        if span is None:
            return whole, dated
        start, end = span
        ranged = (f"Content-Range: bytes {start}-{end}/{info.size}\r\n"
                  f"Content-Length: {end - start + 1}\r\n").encode()  # fmt: skip
        return b"".join((_PARTIAL, own, ranged)), dated

    @staticmethod
    def _head(request: web.BaseRequest | WireRequest, prepared: _Prepared) -> bytes:
        """The answer's whole head: its block, and the lines set per request."""
        return prepared.block + tail(prepared.dated, int(time.time()), request[keys.REQUEST_ID])

    def _rendered(
        self, bucket: str, key: str, info: ObjectInfo, checksums: bool = False
    ) -> tuple[bytes, bytes, bool] | None:
        """``info``'s whole answer's status line and headers up to the per-request ones
        (with its checksums if ``checksums``), its own headers alone, and whether they
        hold a ``Date`` of the origin's (then kept, as aiohttp keeps a handler's)."""
        name = (bucket, key, checksums)
        kept = self._blocks.get(name)
        # Metadata held packed is unpacked anew when read again: equal is as good as same.
        if kept is not None and (kept[0] is info or kept[0] == info):
            self._blocks.move_to_end(name)
            return kept[1], kept[2], kept[3]
        rendered = _render(info, checksums)
        if rendered is None:
            return None
        own, dated = rendered
        whole = b"".join((_OK, own, f"Content-Length: {info.size}\r\n".encode()))
        blocks = self._blocks
        if self._door.refuses(name, blocks, self._front.hot.keys):
            return whole, own, dated
        blocks[name] = (info, whole, own, dated)
        if len(blocks) > self._front.hot.keys:
            blocks.popitem(last=False)
        return whole, own, dated


def _asks_checksums(headers: Any) -> bool:
    """``x-amz-checksum-mode: ENABLED`` (boto3 >= 1.36 sends it on every GetObject)."""
    mode = headers.get("x-amz-checksum-mode")
    return mode is not None and mode.upper() == "ENABLED"


def _render(info: ObjectInfo, checksums: bool = False) -> tuple[bytes, bool] | None:
    """The object's headers (``object_headers``), without the status line, the length
    and the per-request ones; and whether the origin's ``Date`` is among them. None: a
    value aiohttp would refuse to send (a line break), for the general path to refuse."""
    lines = []
    dated = False
    for name, value in object_headers(info, checksums).items():
        lower = name.lower()
        if lower in _OWN_LOWER:
            continue
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            return None
        dated = dated or lower == "date"
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode(), dated


@functools.lru_cache(maxsize=4096)  # pure: loaders ask the same range of every object
def _span(header: str | None, size: int) -> Span:
    """The bytes a ``Range`` header selects, as the general path reads it (None: the whole
    object, also for a header S3 ignores); ``RangeNotSatisfiable`` past the end (raised,
    so never kept)."""
    spec = parse_range(header) if header is not None else None
    if spec is None or not spec.applies(size):
        return None
    return spec.resolve(size)


def _sent_as(target: str, headers: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A request as its client sent it: its target, and its headers in order."""
    return target, tuple(headers.items())


def _plain(request: web.Request) -> bool:
    """Whether ``request`` is of the kind the hit path may answer (see the module)."""
    if request.method != "GET" or request.version != HttpVersion11:
        return False
    if not request.keep_alive or request.raw_path.startswith(("/_hoard/", "/metrics")):
        return False
    headers = request.headers
    return not any(name in headers for name in _GENERAL_HEADERS)


def _plain_message(message: RawRequestMessage | Head) -> str | None:
    """The Host of a request parsed on the wire of the kind the hit path may answer
    (``_plain``'s rules; no body, no upgrade); None: not such a request."""
    if message.method != "GET" or message.version != HttpVersion11 or message.should_close:
        return None
    if message.upgrade or message.chunked or message.path.startswith(("/_hoard/", "/metrics")):
        return None
    headers = message.headers
    # A hit carries a few headers: each is looked up, not each of those that refuse one
    # (a head the wire parsed has their names in lower case already).
    names = message.names if isinstance(message, Head) else map(str.lower, headers)
    if not _GENERAL_LOWER.isdisjoint(names):
        return None
    return headers.get("Host")


def _cut(
    request: web.BaseRequest | WireRequest, transport: asyncio.Transport, exc: Exception,
    sent: int,
) -> None:  # fmt: skip
    """A body that could not be finished: recorded as cut, the connection dropped."""
    reason = cut_reason(exc)
    if reason != "client_gone":
        log.warning("hit cut, request %s: %s (%s)", request[keys.REQUEST_ID], reason, exc)
    request[keys.CUT], request[keys.SENT] = reason, sent
    transport.abort()


class _Sent(web.StreamResponse):
    """An answer the hit path already wrote: aiohttp has nothing left to send."""

    async def prepare(self, request: web.BaseRequest) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None

    @property
    def keep_alive(self) -> bool:
        return True
