"""The real Hoard application, in the test's own process, on a real loopback port.

Most behaviour needs neither workers, signals, restarts nor a cluster, only
the application: ``wiring.build`` wires every object from the same settings a
``hoard serve`` would read, and aiohttp's ``TestServer`` serves it on
127.0.0.1 with a real socket, so clients speak real HTTP to it. What a
subprocess costs (an interpreter start, imports, a readiness poll, a second
event loop the test cannot see) is gone, and the test shares the loop with
the gateway, so it can wait on events instead of sleeping.

A test whose clients block (boto3, ``rawhttp``) cannot share its loop with
the app: ``threaded_app`` serves the same app from a loop on a thread of its
own (no SIGHUP reload there: TLS and cluster configs stay subprocesses).

Subprocess tests (``harness.HoardProcess``) stay for what needs a process:
workers, signals, restarts, kill -9, clusters. Below the application, a test
may build a ``Reader`` itself and read through it (``read_object``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import wiring
from gateway.config.load import build_settings
from gateway.pieces import FileSegment
from gateway.read.reader import Reader
from tests.harness import ACCESS_KEY, SECRET_KEY, s3_client, sum_samples


@dataclass(frozen=True, slots=True)
class InProcessHoard:
    endpoint: str  # http://127.0.0.1:<port>
    app: web.Application

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def client(self, **config: Any):
        """A boto3 client of this gateway (blocking: use it with ``threaded_app``)."""
        return s3_client(self.endpoint, **config)


@contextlib.asynccontextmanager
async def hoard_app(workdir: Path, config: dict[str, Any]) -> AsyncIterator[InProcessHoard]:
    """Build the app from ``config`` (as ``HoardProcess`` would write it) and serve it."""
    config = {
        "credentials": [{"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}],
        **config,
        "cache": {"dir": str(workdir / "cache"), **config.get("cache", {})},
    }
    app = wiring.build(build_settings(config))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield InProcessHoard(str(server.make_url("")).rstrip("/"), app)
    finally:
        await server.close()


@contextlib.contextmanager
def threaded_app(workdir: Path, config: dict[str, Any]) -> Iterator[InProcessHoard]:
    """``hoard_app`` on an event loop of its own thread, for a test that blocks on its clients."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="hoard-app", daemon=True)
    thread.start()
    serving = hoard_app(workdir, config)
    try:
        hoard = asyncio.run_coroutine_threadsafe(serving.__aenter__(), loop).result(60)
        try:
            yield hoard
        finally:
            asyncio.run_coroutine_threadsafe(serving.__aexit__(None, None, None), loop).result(60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


async def get_all(urls: list[str], headers: dict[str, str] | None = None) -> list[bytes]:
    """GET every URL at once over one client session; each must answer 200 or 206."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(url: str) -> bytes:
            async with session.get(url, headers=headers) as answer:
                assert answer.status in (200, 206), await answer.text()
                return await answer.read()

        return await asyncio.gather(*(one(url) for url in urls))


async def metric(endpoint: str, selector: str) -> float:
    """``harness.metric`` for an app in this loop: a blocking scrape would stall the app."""
    async with aiohttp.ClientSession() as session, session.get(f"{endpoint}/metrics") as answer:
        return sum_samples(await answer.text(), selector)


async def read_object(
    reader: Reader, bucket: str, key: str, sources: Counter[str] | None = None
) -> bytes:
    """An object's bytes through a ``Reader`` built in the test; ``sources`` gets them by tier."""
    read = await reader.open_object(bucket, key)
    out = bytearray()
    try:
        async for piece in read.chunks():
            if isinstance(piece, FileSegment):
                out += os.pread(piece.fd, piece.count, piece.offset)
                piece.release()
            else:
                out += piece
    finally:
        await read.aclose()
    if sources is not None:
        sources.update(read.sources)
    return bytes(out)
