"""The aiohttp application: one catch-all route, the admin endpoints, lifecycle.

S3 addressing (path- or virtual-hosted-style, sub-resources in the query)
does not fit a URL router, so every request lands in ``dispatch``, which
sends ``/_hoard/peer/...`` to the cluster's peer server (signed with the
cluster secret), the rest of ``/_hoard/...`` and an unsigned ``GET /metrics`` to the admin handlers
and everything else to the S3 front. ``_hoard`` can never be a bucket (S3
bucket names have no underscore); ``metrics`` can, so only an unsigned GET of
exactly ``/metrics`` with no query is the scrape endpoint, and a signed
request for it still lists the bucket.

Every request is answered by Hoard and accounted (a metric and an access-log
line), whatever it is: the catch-all route matches any path S3 accepts (a key
may hold a newline), a request the router or a handler still refuses becomes
an S3 XML error here, ``100 Continue`` is sent only once a request is
admitted, an ``Expect`` value other than ``100-continue`` is ignored instead
of answered with aiohttp's plain-text 417, and what aiohttp's
HTTP parser refuses before any handler runs is answered by ``rejected``
(installed by ``listener.py``), as S3 XML with a request id too.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.app.admin import Admin
from gateway.app.hotwire import wire_answer
from gateway.cluster.peer_server import PeerServer
from gateway.cluster.peers import PREFIX as PEER_PREFIX
from gateway.core import compiled
from gateway.obs import request_keys as keys
from gateway.obs.access_log import AccessLog
from gateway.obs.metrics import Metrics
from gateway.s3 import xml
from gateway.s3.front import S3Front, send_continue
from gateway.s3.hits import HitPath
from gateway.s3.routing import split_host

log = logging.getLogger("hoard")

STATE = web.AppKey("state", dict)
HIT_PATH = web.AppKey("hit_path", HitPath)  # answers hits before the application (s3/hits.py)
# Answers hits as they are parsed (hotwire.py); None: aiohttp lacks what it needs.
HIT_WIRE = web.AppKey("hit_wire", object)


class RequestIds:
    """Request ids unique across processes and restarts: a random prefix and a counter.

    One ``os.urandom`` per request was a measurable share of a cached GET.
    """

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex().upper()
        self._next = itertools.count(1)

    def new(self) -> str:
        return f"{self._prefix}{next(self._next) & 0xFFFFFFFF:08X}"


@web.middleware
async def _observe(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Request id, metrics and one access-log line for every request."""
    state = request.app[STATE]
    request[keys.REQUEST_ID] = state["request_ids"].new()
    started = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # a route or handler refusal aiohttp would answer in text
        request[keys.ERROR_CODE] = _code_for(exc.status)
        response = xml_error(
            exc.status, request[keys.ERROR_CODE], exc.reason, request[keys.REQUEST_ID]
        )
    elapsed = time.perf_counter() - started
    account(state, request, response.status, _body_bytes(request, response), elapsed)
    return response


def account_hit(
    state: dict, request: web.BaseRequest, status: int, body_bytes: int, elapsed: float,
    source: str,
) -> None:  # fmt: skip
    """``account`` of a hit answered from ``source`` (``s3/hits.py``), counted as such
    (``Metrics.hit_answered``: the same series ``account`` moves, in one call)."""
    if keys.CUT in request:
        state["metrics"].hit(source)
        request[keys.SOURCE], request[keys.SERVED] = source, {source: body_bytes}
        account(state, request, status, body_bytes, elapsed)
        return
    count_hit(state, request[keys.REQUEST_ID], request.path, request[keys.BUCKET],
              request[keys.MOUNT], status, body_bytes, elapsed, source)  # fmt: skip


def count_hit(
    state: dict, request_id: str, path: str, bucket: str, mount: str, status: int,
    body_bytes: int, elapsed: float, source: str,
) -> None:  # fmt: skip
    """The metrics and access-log line of a whole hit (a GET; ``Metrics.hit_answered``:
    the series ``account`` moves, in one call), from the fields alone (``s3/express.py``
    answers without a request)."""
    state["metrics"].hit_answered(source, status, mount, elapsed, body_bytes)
    access = state["access_log"]
    if access.enabled:
        access.record(request_id, "GET", path, "GetObject", bucket, status, body_bytes, elapsed,
                      source, "-", None)  # fmt: skip


def account(
    state: dict, request: web.BaseRequest, status: int, body_bytes: int, elapsed: float
) -> None:
    """The metrics and the access-log line of one answered request (whole or cut)."""
    operation = request.get(keys.OPERATION, "Admin")
    metrics: Metrics = state["metrics"]
    mount = request.get(keys.MOUNT, "")
    cut = request.get(keys.CUT)
    if cut is not None:  # a body cut short: its bytes and its cause, never a clean 200
        sent = request[keys.SENT]
        metrics.cut(operation, cut, mount, elapsed, sent)
    else:
        sent = body_bytes
        metrics.answered(operation, status, mount, elapsed, sent)
    if keys.SERVED in request:
        metrics.served(mount, request[keys.SERVED])
    if not state["access_log"].enabled:
        return  # the line's fields are not even gathered: this runs for every hit
    error = f"cut:{cut}" if cut is not None else request.get(keys.ERROR_CODE, "-")
    state["access_log"].record(
        request[keys.REQUEST_ID], request.method, request.path, operation, request.get(keys.BUCKET, ""),
        status, sent, elapsed, request.get(keys.SOURCE, "-"), error, request.get(keys.OBJECTS),
    )  # fmt: skip


def _code_for(status: int) -> str:
    if status == 404:
        return "NoSuchKey"
    if status == 405:
        return "MethodNotAllowed"
    if status == 413:
        return "EntityTooLarge"
    if status == 431:
        return "RequestHeaderSectionTooLarge"
    return "InvalidRequest" if status < 500 else "InternalError"


def xml_error(status: int, code: str, message: str, request_id: str) -> web.Response:
    """An S3 error answer made outside the S3 front (no bucket or key was understood)."""
    body = xml.error(code, message, request_id, {})
    headers = {"x-amz-request-id": request_id, "x-amz-id-2": request_id, "Server": "Hoard"}
    return web.Response(status=status, body=body, headers=headers, content_type="application/xml")


def rejected(app: web.Application, status: int, reason: str) -> web.Response:
    """The answer to a request aiohttp's HTTP parser refused, accounted like any other.

    ``reason`` names what was wrong (the parser's error class), never the bytes
    sent: they may be anything, and they stay out of the answer and the log.
    """
    state = app[STATE]
    request_id = state["request_ids"].new()
    code = _code_for(status)
    response = xml_error(status, code, f"The request could not be parsed: {reason}.", request_id)
    state["metrics"].answered("Rejected", status, "", 0.0, len(response.body or b""))
    state["access_log"].record(request_id, "-", "-", "Rejected", "", status,
                               len(response.body or b""), 0.0, "-", code)  # fmt: skip
    return response


async def _expect(request: web.Request) -> None:
    """Nothing yet: ``100 Continue`` goes out once a request is admitted (``send_continue``).

    aiohttp's default would send it before any check (so a refused upload's
    body came anyway), and answer other values with a plain-text 417 before
    any middleware runs; S3 clients do not send them, and ignoring one is what S3 does.
    """


def _body_bytes(request: web.Request, response: web.StreamResponse) -> int:
    """The body bytes of an answer, for metrics and the access log alike.

    A ``web.Response`` (listings, errors, admin JSON) is sent after the handler
    returns, so its body is counted here; a streamed one counts its declared
    length, since sendfile bytes bypass aiohttp's own count. HEAD, 204 and 304
    answers carry no body, whatever length they declare.
    """
    if request.method == "HEAD" or response.status in (204, 304):
        return 0
    if keys.SENT in request:  # counted by the handler (a bundle's sendfile bytes too)
        return request[keys.SENT]
    if response.prepared:
        return response.content_length or response.body_length
    body = getattr(response, "body", None)
    if isinstance(body, bytes | bytearray):
        return len(body)
    return response.content_length or 0


async def _per_request_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Headers every answer carries, of whatever status: set here, once, rather than by
    each handler and each error (the request id; the CORS headers ``s3/cors.py`` found)."""
    request_id = request.get(keys.REQUEST_ID)
    if request_id:
        response.headers["x-amz-request-id"] = request_id
        response.headers["x-amz-id-2"] = request_id
    response.headers["Server"] = "Hoard"
    cors = request.get(keys.CORS)
    if cors:
        response.headers.update(cors)


def build_app(
    front: S3Front,
    metrics: Metrics,
    domains: list[str],
    admin: Admin,
    access: AccessLog,
    peers: PeerServer | None = None,
) -> web.Application:
    """The gateway application. Everything it needs is passed in, built by ``wiring.py``."""
    app = web.Application(middlewares=[_observe], client_max_size=1024**2)
    app[STATE] = state = {
        "metrics": metrics,
        "ready": False,
        "access_log": access,
        "request_ids": RequestIds(),
    }
    app[HIT_PATH] = hits = HitPath(front, front.reader, front.body, metrics,
                                   state["request_ids"].new, functools.partial(account_hit, state),
                                   functools.partial(count_hit, state))  # fmt: skip
    app[HIT_WIRE] = wire_answer(hits)
    metrics.hit_wire.set(0 if app[HIT_WIRE] is None else 1)
    for module, runs in compiled.in_use().items():
        metrics.compiled.labels(module).set(1 if runs else 0)
        if not runs:
            log.info("%s: the Python twin runs (slower; see gateway/core/compiled.py)", module)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        path = request.raw_path.split("?", 1)[0]
        if peers is not None and path.startswith(PEER_PREFIX):
            request[keys.OPERATION] = "Peer"
            await send_continue(request)
            return await peers.handle(request, path)  # signed by the cluster secret
        if path.startswith("/_hoard/"):
            await send_continue(request)
            return await _open_endpoints(request, path) or await admin.handle(request, path)
        if _is_scrape(request, path, domains):
            return web.Response(
                body=metrics.render(), headers={"Content-Type": metrics.content_type}
            )
        return await front.handle(request)

    async def mark_ready(app: web.Application) -> None:
        await access.start()
        app[STATE]["ready"] = True

    async def mark_not_ready(app: web.Application) -> None:
        app[STATE]["ready"] = False

    async def close_log(app: web.Application) -> None:
        await access.close()

    # [\s\S], not ".": a key may hold a newline, and "." stops at one.
    app.router.add_route("*", r"/{tail:[\s\S]*}", dispatch, expect_handler=_expect)
    app.on_response_prepare.append(_per_request_headers)
    app.on_startup.append(mark_ready)
    app.on_shutdown.append(mark_not_ready)
    app.on_cleanup.append(close_log)
    return app


def _is_scrape(request: web.Request, path: str, domains: list[str]) -> bool:
    return (
        path == "/metrics"
        and request.method == "GET"
        and not request.query_string
        and "Authorization" not in request.headers
        and split_host(request.host, domains) is None
    )


async def _open_endpoints(request: web.Request, path: str) -> web.StreamResponse | None:
    """Health and readiness: the only admin endpoints that need no credentials."""
    if path == "/_hoard/health":
        return web.json_response({"status": "ok"})
    if path == "/_hoard/ready":
        ready = request.app[STATE]["ready"]
        return web.json_response({"ready": ready}, status=200 if ready else 503)
    return None
