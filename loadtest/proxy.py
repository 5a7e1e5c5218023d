"""The counting proxy in front of the origin: what reaches the origin, and how slowly.

Every target that talks to the origin (``direct`` clients, nginx, Hoard) uses
this proxy's address as the origin endpoint (loopback, or moto's namespace:
``origin.py``), so one place counts
origin requests by kind (GET of an object, HEAD, LIST, other) and the body
bytes the origin sent. ``GET /_counts`` returns the counters as JSON (with ``connections``, the
client connections opened); bucket
names cannot start with ``_``, so no S3 request is shadowed.

When the kernel cannot delay packets (no ``sch_netem``), the proxy emulates the
network itself: ``--rtt-ms`` holds each request for one round trip before it is
forwarded (request out, first byte back) and adds one more for each new client
connection (the TCP handshake); ``--rate-mbit`` paces response bytes through one
shared token bucket.

``--stream-mbit`` paces each response on its own, always (the kernel shapes
links, not streams): one GET stream from an object store is much slower than
the store's aggregate bandwidth (tens of MB/s per S3 GET). Without it one
stream would fill the emulated link, and parallel range fetches could not show
what they buy against a real store. This models a remote store's time to first byte and its
bandwidth, not TCP's window dynamics over a long path.

Run: ``python -m loadtest.proxy --port P --upstream http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import weakref
from collections import Counter

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
}  # fmt: skip
CHUNK = 256 * 1024


def classify(method: str, path: str, query: str) -> str:
    """GET (object read), HEAD, LIST or OTHER for one S3 request, path-style."""
    parts = path.lstrip("/").split("/", 1)
    object_level = len(parts) == 2 and parts[1] != ""
    if method == "HEAD":
        return "HEAD"
    if method == "GET" and object_level:
        return "GET"
    if (
        method == "GET"
        and parts[0]
        and not any(
            flag in query for flag in ("location", "versioning", "acl", "policy", "uploads")
        )
    ):
        return "LIST"
    return "OTHER"


class Pacer:
    """One shared token bucket: ``take(n)`` returns when n bytes may be sent."""

    def __init__(self, bytes_per_second: float) -> None:
        self.rate = bytes_per_second
        self.next_free = time.monotonic()

    async def take(self, size: int) -> None:
        now = time.monotonic()
        start = max(now, self.next_free)
        self.next_free = start + size / self.rate
        if start - now > 0.0005:
            await asyncio.sleep(start - now)


class CountingProxy:
    def __init__(
        self, upstream: str, rtt: float, pacer: Pacer | None, stream_rate: float = 0.0
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.rtt = rtt
        self.pacer = pacer
        self.stream_rate = stream_rate  # bytes/s of one response; 0 = unpaced
        self.counts: Counter[str] = Counter()
        self.session: ClientSession | None = None
        # Transports that already paid their handshake round trip.
        self._seen: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()

    async def start(self, app: web.Application) -> None:
        self.session = ClientSession(
            connector=TCPConnector(limit=0, force_close=False),
            timeout=ClientTimeout(total=None, sock_read=300),
            auto_decompress=False,
        )

    async def stop(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/_counts":
            return web.json_response(dict(self.counts))
        kind = classify(request.method, request.path, request.query_string)
        self.counts[kind] += 1
        await self._delay(request, self._new_connection(request))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = request.content if request.body_exists else None
        assert self.session is not None
        async with self.session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body,
            allow_redirects=False, skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        ) as upstream:  # fmt: skip
            response = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            if request.method != "HEAD":
                own = Pacer(self.stream_rate) if self.stream_rate > 0 else None
                async for chunk in upstream.content.iter_chunked(CHUNK):
                    if self.pacer is not None:
                        await self.pacer.take(len(chunk))
                    if own is not None:
                        await own.take(len(chunk))
                    self.counts[f"{kind}_bytes"] += len(chunk)
                    self.counts["bytes"] += len(chunk)
                    await response.write(chunk)
            await response.write_eof()
            return response

    def _new_connection(self, request: web.Request) -> bool:
        """Whether ``request`` is its connection's first (counted: a client that does not
        keep its origin connections alive costs the origin a handshake each time)."""
        transport = request.transport
        if transport is None or transport in self._seen:
            return False
        self._seen.add(transport)
        self.counts["connections"] += 1
        return True

    async def _delay(self, request: web.Request, new_connection: bool) -> None:
        if self.rtt > 0:
            await asyncio.sleep(self.rtt * (2 if new_connection else 1))


def build_app(
    upstream: str, rtt_ms: float, rate_mbit: float, stream_mbit: float = 0.0
) -> web.Application:
    pacer = Pacer(rate_mbit * 1e6 / 8) if rate_mbit > 0 else None
    proxy = CountingProxy(upstream, rtt_ms / 1000, pacer, stream_mbit * 1e6 / 8)
    app = web.Application(client_max_size=1024**4)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--rate-mbit", type=float, default=0.0)
    parser.add_argument("--stream-mbit", type=float, default=0.0)
    args = parser.parse_args(argv)
    print(json.dumps({"proxy": args.port, "upstream": args.upstream}), flush=True)
    web.run_app(
        build_app(args.upstream, args.rtt_ms, args.rate_mbit, args.stream_mbit),
        host=args.host, port=args.port, access_log=None, print=None,
        shutdown_timeout=2, backlog=1024,
    )  # fmt: skip


if __name__ == "__main__":
    main()
