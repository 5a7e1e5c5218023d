"""The aiohttp application: one catch-all route, the admin endpoints, lifecycle.

S3 addressing (path- or virtual-hosted-style, sub-resources in the query)
does not fit a URL router, so every request lands in ``dispatch``, which
sends ``/_hoard/peer/...`` to the cluster's peer server (signed with the
cluster secret), the rest of ``/_hoard/...`` and an unsigned ``GET /metrics`` to the admin handlers
and everything else to the S3 front. ``_hoard`` can never be a bucket (S3
bucket names have no underscore); ``metrics`` can, so only an unsigned GET of
exactly ``/metrics`` with no query is the scrape endpoint, and a signed
request for it still lists the bucket.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler

from gateway.accesslog import AccessLog
from gateway.admin import Admin
from gateway.cluster.peers import PREFIX as PEER_PREFIX
from gateway.cluster.peers import PeerServer
from gateway.metrics import Metrics
from gateway.s3.front import S3Front
from gateway.s3.routing import split_host

log = logging.getLogger("hoard")

STATE = web.AppKey("state", dict)


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
    request["request_id"] = state["request_ids"].new()
    started = time.perf_counter()
    response = await handler(request)
    elapsed = time.perf_counter() - started
    operation = request.get("operation", "Admin")
    metrics: Metrics = state["metrics"]
    mount = request.get("mount", "")
    sent = _body_bytes(request, response)
    metrics.answered(operation, response.status, mount, elapsed, sent)
    if "served" in request:
        metrics.served(mount, request["served"])
    state["access_log"].record(
        request["request_id"], request.method, request.path, operation, request.get("bucket", ""),
        response.status, sent, elapsed, request.get("source", "-"), request.get("error_code", "-"),
    )  # fmt: skip
    return response


def _body_bytes(request: web.Request, response: web.StreamResponse) -> int:
    """The body bytes of an answer, for metrics and the access log alike.

    A ``web.Response`` (listings, errors, admin JSON) is sent after the handler
    returns, so its body is counted here; a streamed one counts its declared
    length, since sendfile bytes bypass aiohttp's own count. HEAD, 204 and 304
    answers carry no body, whatever length they declare.
    """
    if request.method == "HEAD" or response.status in (204, 304):
        return 0
    if response.prepared:
        return response.content_length or response.body_length
    body = getattr(response, "body", None)
    if isinstance(body, bytes | bytearray):
        return len(body)
    return response.content_length or 0


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    request_id = request.get("request_id")
    if request_id:
        response.headers["x-amz-request-id"] = request_id
        response.headers["x-amz-id-2"] = request_id
    response.headers["Server"] = "Hoard"


def build_app(
    front: S3Front,
    metrics: Metrics,
    domains: list[str],
    admin: Admin,
    access: AccessLog,
    peers: PeerServer | None = None,
) -> web.Application:
    """The gateway application. Everything it needs is passed in, built by ``cli.py``."""
    app = web.Application(middlewares=[_observe], client_max_size=1024**2)
    app[STATE] = {
        "metrics": metrics,
        "ready": False,
        "access_log": access,
        "request_ids": RequestIds(),
    }

    async def dispatch(request: web.Request) -> web.StreamResponse:
        path = request.raw_path.split("?", 1)[0]
        if peers is not None and path.startswith(PEER_PREFIX):
            request["operation"] = "Peer"
            return await peers.handle(request, path)  # signed by the cluster secret
        if path.startswith("/_hoard/"):
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

    app.router.add_route("*", "/{tail:.*}", dispatch, expect_handler=_expect)
    app.on_response_prepare.append(_add_request_id)
    app.on_startup.append(mark_ready)
    app.on_shutdown.append(mark_not_ready)
    app.on_cleanup.append(close_log)
    return app


async def _expect(request: web.Request) -> None:
    """``Expect`` before the handler runs: ``100-continue`` is answered as aiohttp does;
    another expectation on a request without a body is ignored, as S3 ignores it
    (RFC 9110 §10.1.1 lets a server refuse it, not oblige it to); with a body,
    aiohttp's 417 stands, since the body may depend on the expectation."""
    bodiless = not request.body_exists and "Transfer-Encoding" not in request.headers
    if request.headers.get("Expect", "").lower() == "100-continue" or not bodiless:
        await _default_expect_handler(request)


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
