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

Deterministic faults (``faults``): a plan maps each GetObject, by its number
since ``reset()`` (1-based), path and Range header, to a ``Fault`` or None.
``fail_nth`` and ``fail_every`` build the usual plans (every 4th GET is a
deterministic p = 0.25). A fault can answer a status (503 SlowDown, 412), reset
the connection (RST) or truncate the body (FIN) after N body bytes, or stall
after N body bytes (``hang``: before the headers) until the test calls
``release()``; ``stalled`` is set when a request stalls, so a test waits on
that event, never on a sleep. ``injected`` counts the faults by kind, as
applied (a cut planned past the end of a short body does not happen).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import aiohttp
from aiohttp import web
from yarl import URL

from tests.harness import free_port

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate", "host", "content-length"}  # fmt: skip
_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")  # fmt: skip

_PRECONDITION_FAILED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PreconditionFailed'
                        b"</Code><Message>At least one of the pre-conditions you specified did not"
                        b" hold</Message><Condition>If-Match</Condition></Error>")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Fault:
    """What the proxy does to one GetObject answer.

    ``reset``/``truncate``/``stall``: after ``after`` body bytes, send a TCP RST,
    close cleanly short of Content-Length, or hold until released. ``hang``:
    hold before the headers. ``status``: answer ``status`` (503 SlowDown, 412
    PreconditionFailed) instead of forwarding.
    """

    kind: Literal["reset", "truncate", "stall", "hang", "status"]
    after: int = 0
    status: int = 503


FaultPlan = Callable[[int, str, str], "Fault | None"]  # (GET number, path, Range) → fault


def fail_nth(n: int, fault: Fault, path_suffix: str = "") -> FaultPlan:
    """A plan: the ``n``-th GetObject (of those whose path ends so) gets ``fault``."""
    seen = Counter[str]()

    def plan(number: int, path: str, byte_range: str) -> Fault | None:
        if not path.endswith(path_suffix):
            return None
        seen["n"] += 1
        return fault if seen["n"] == n else None

    return plan


def fail_every(k: int, fault: Fault, first: int = 1) -> FaultPlan:
    """A plan: GetObject number ``first``, ``first + k``, … get ``fault`` (p = 1/k)."""
    return lambda number, path, byte_range: (
        fault if number >= first and (number - first) % k == 0 else None
    )


def operation(method: str, path: str, query: dict[str, str]) -> str:
    parts = path.strip("/").split("/", 1)
    if method == "GET" and len(parts) == 1:
        if "cors" in query:
            return "GetBucketCors"
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
        self.seen: list[tuple[str, str, dict[str, str]]] = []  # (method, path?query, headers)
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
        self.faults: FaultPlan | None = None
        self.injected: Counter[str] = Counter()  # faults applied, by kind
        self.stalled = threading.Event()  # a request is being held (stall/hang)
        self._gets = 0  # GetObject requests since reset(), numbering them for the plan
        self._release: asyncio.Event | None = None
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
        self.release()
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.ranges.clear()
            self.seen.clear()
            self.bytes = 0
            self._tries.clear()
            self.slow_downs = 0
            self.max_in_flight = self.in_flight
            self.get_bytes = 0
            self._gets = 0
            self.injected.clear()
        self.faults = None

    def release(self) -> None:
        """Let every held request go on (and the next ones stall afresh)."""
        self.stalled.clear()
        if self._release is not None:
            self._loop.call_soon_threadsafe(self._release.set)

    def gets(self, key_suffix: str = "") -> int:
        return sum(1 for path, _ in self.ranges if path.endswith(key_suffix))

    def listed_gets(self) -> str:
        """Every GetObject as 'path range', a line each: an assertion's message in full
        (pytest cuts a list's repr short, and with it the GET that was one too many)."""
        return "\n".join(f"{path} {byte_range}" for path, byte_range in self.ranges)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._startup())
        self._ready.set()
        self._loop.run_forever()

    async def _startup(self) -> None:
        self._release = asyncio.Event()
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
        fault = None
        with self._lock:
            self.counts[op] += 1
            self.seen.append((request.method, request.path_qs, dict(request.headers)))
            if op == "GetObject":
                byte_range = request.headers.get("Range", "")
                self.ranges.append((request.path, byte_range))
                self._gets += 1
                if self.faults is not None:
                    fault = self.faults(self._gets, request.path, byte_range)
        if self.latency:
            await asyncio.sleep(self.latency)
        if self.mode == "down" or (self.mode == "flaky" and self._flaky(request)):
            return web.Response(status=503, body=_SLOW_DOWN, content_type="application/xml")
        if fault is not None and fault.kind in ("status", "hang"):
            self._injected(fault)
        if fault is not None and fault.kind == "status":
            body = _PRECONDITION_FAILED if fault.status == 412 else _SLOW_DOWN
            return web.Response(status=fault.status, body=body, content_type="application/xml")
        if fault is not None and fault.kind == "hang":
            await self._hold()
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
            if fault is not None and upstream.status < 300 and fault.kind != "hang":
                await self._faulty_body(request, response, upstream, fault)
                return response
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

    def _injected(self, fault: Fault) -> None:
        with self._lock:
            self.injected[fault.kind] += 1

    async def _hold(self) -> None:
        assert self._release is not None
        self.stalled.set()
        await self._release.wait()
        self._release = asyncio.Event()  # the next stall holds again

    async def _faulty_body(
        self,
        request: web.Request,
        response: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        fault: Fault,
    ) -> None:
        """Send ``fault.after`` body bytes, then the fault (a stall then sends the rest)."""
        sent = 0
        async for chunk in upstream.content.iter_chunked(64 * 1024):
            part = chunk[: max(0, fault.after - sent)]
            if part:
                await response.write(part)
                sent += len(part)
            if sent < fault.after:
                continue
            self._injected(fault)
            if fault.kind == "stall":
                await self._hold()
                fault = Fault("stall", after=1 << 62)  # released: the rest flows
                await response.write(chunk[len(part) :])
                continue
            self._cut(request, reset=fault.kind == "reset")
            return
        await response.write_eof()

    @staticmethod
    def _cut(request: web.Request, reset: bool) -> None:
        transport = request.transport
        if transport is None:
            return
        if reset:  # SO_LINGER 0: close() sends RST, not FIN
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        else:
            transport.close()  # what is buffered goes out, then FIN
