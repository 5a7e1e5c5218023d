"""A counting, fault-injecting reverse proxy in front of the moto origin.

Caching is proved by what reaches the origin, so every request through here is
counted by S3 operation (GetObject, HeadObject, ListObjects, other) and by
bytes. ``mode`` makes the origin misbehave: ``"down"`` refuses with 503,
``"slow"`` trickles bodies, ``"flaky"`` answers 503 SlowDown to the first
``flaky_failures`` tries of each distinct request (1: half of all requests).
``latency`` (seconds) holds every request that long before it is forwarded, as
a remote store's round trip would, so that concurrent work overlaps.
``max_in_flight`` is the most requests it held at once. It runs its own event
loop in a thread on a loopback port.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable

import aiohttp
from aiohttp import web
from yarl import URL

from tests.harness import free_port

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate", "host", "content-length"}  # fmt: skip
_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")  # fmt: skip


def operation(method: str, path: str, query: dict[str, str]) -> str:
    parts = path.strip("/").split("/", 1)
    if method == "GET" and len(parts) == 1:
        return "ListObjects" if "location" not in query else "GetBucketLocation"
    if method == "GET":
        return "GetObject"
    if method == "HEAD":
        return "HeadObject" if len(parts) > 1 else "HeadBucket"
    return method


class OriginProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.counts: Counter[str] = Counter()
        self.ranges: list[tuple[str, str]] = []  # (path, Range header) of each GetObject
        self.bytes = 0
        self.get_bytes = 0  # body bytes of GetObject answers only (not listings, not errors)
        self.mode = "ok"
        self.slow_delay = 0.05
        self.flaky_failures = 1
        self.latency = 0.0
        self.slow_downs = 0  # 503 SlowDown answers sent in "flaky" mode
        self._tries: Counter[tuple[str, str, str]] = Counter()  # per distinct request
        self.in_flight = 0
        self.max_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OriginProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.ranges.clear()
            self.bytes = 0
            self._tries.clear()
            self.slow_downs = 0
            self.max_in_flight = self.in_flight
            self.get_bytes = 0

    def gets(self, key_suffix: str = "") -> int:
        return sum(1 for path, _ in self.ranges if path.endswith(key_suffix))

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._startup())
        self._ready.set()
        self._loop.run_forever()

    async def _startup(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _shutdown(self) -> None:
        await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _arrived(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _left(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _flaky(self, request: web.Request) -> bool:
        """In "flaky" mode: whether this try of the request gets a SlowDown."""
        identity = (request.method, request.raw_path, request.headers.get("Range", ""))
        with self._lock:
            self._tries[identity] += 1
            failing = self._tries[identity] <= self.flaky_failures
            self.slow_downs += failing
        return failing

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # In flight from arrival until just before the last bytes go out: the
        # client cannot have finished with a request (and sent its next) sooner.
        self._arrived()
        left = [False]

        def leave() -> None:
            if not left[0]:
                left[0] = True
                self._left()

        try:
            return await self._answer(request, leave)
        finally:
            leave()

    async def _answer(self, request: web.Request, leave: Callable[[], None]) -> web.StreamResponse:
        op = operation(request.method, request.path, dict(request.query))
        with self._lock:
            self.counts[op] += 1
            if op == "GetObject":
                self.ranges.append((request.path, request.headers.get("Range", "")))
        if self.latency:
            await asyncio.sleep(self.latency)
        if self.mode == "down" or (self.mode == "flaky" and self._flaky(request)):
            return web.Response(status=503, body=_SLOW_DOWN, content_type="application/xml")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        # encoded=True: the path goes on byte for byte, as a transparent hop must send it
        # (yarl would otherwise resolve "%2E%2E" segments and change which key is asked for).
        target = URL(self.upstream + request.raw_path, encoded=True)
        async with self._session.request(
            request.method, target, headers=headers, data=body or None
        ) as upstream:
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            response = web.StreamResponse(status=upstream.status, headers=out)
            if upstream.content_length is not None:  # HEAD answers carry it too
                response.content_length = upstream.content_length
            await response.prepare(request)
            held = b""  # each chunk waits for the next, so the last one is known as last
            async for chunk in upstream.content.iter_chunked(64 * 1024):
                with self._lock:
                    self.bytes += len(chunk)
                    if op == "GetObject" and upstream.status < 300:
                        self.get_bytes += len(chunk)
                if self.mode == "slow":
                    await asyncio.sleep(self.slow_delay)
                if held:
                    await response.write(held)
                held = chunk
            leave()
            if held:
                await response.write(held)
            await response.write_eof()
            return response
