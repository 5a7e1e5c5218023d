"""Peer fills over a real loopback server: streaming, sendfile, signatures, failures.

A ``PeerServer`` with a scripted owner (pieces, events to hold it, errors to
raise) answers a ``PeerClient``. Every wait is bounded and releases on an event;
nothing asserts on how fast anything happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from gateway.cluster.peer_client import PeerClient
from gateway.cluster.peer_server import PeerServer
from gateway.cluster.peers import (
    BlockRequest,
    PeerChanged,
    PeerNotCached,
    PeerNotFound,
    PeerUnavailable,
    metadata_target,
    parse_metadata_query,
    sign,
)
from gateway.core import errors
from gateway.core.invalidation import Invalidation
from gateway.metadata.query import MetadataQuery
from gateway.pieces import FileSegment, Piece
from gateway.s3.body import BodySender
from tests.harness import free_port

pytestmark = pytest.mark.timeout(60)

SECRET = "cluster-secret"
REQUEST = BlockRequest("aws", "data", "dir/a b?&=+%ü.bin", '"etag-1"', 3, 3000, 3999, 100, 600)
SECRET_DATA = b"\xfe" * REQUEST.length  # what a refused request must not see
BOUND = 10.0  # seconds any single wait may take before the test fails


class Owner:
    """A fake owner: replays ``script`` (pieces; events it waits on; errors it raises)."""

    def __init__(self) -> None:
        self.script: list[Piece | asyncio.Event | Exception] = []
        self.requests: list[BlockRequest] = []
        self.invalidated: list[list[Invalidation]] = []
        self.queries: list[MetadataQuery] = []
        self.answer: dict | Exception = {}  # what a metadata query gets
        self.dropped_all = 0
        self.messages: list[tuple[str, bytes]] = []
        self.finished = asyncio.Event()  # the producer was closed, one way or another
        self.completed = False  # it ran to its end (rather than being closed early)

    async def read_block(self, request: BlockRequest) -> AsyncIterator[Piece]:
        self.requests.append(request)
        try:
            for step in self.script:
                if isinstance(step, asyncio.Event):
                    await step.wait()
                elif isinstance(step, Exception):
                    raise step
                else:
                    yield step
            self.completed = True
        finally:
            self.finished.set()

    async def invalidate(self, items: list[Invalidation]) -> None:
        self.invalidated.append(items)

    async def metadata(self, query: MetadataQuery) -> dict:
        self.queries.append(query)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def drop_all(self) -> None:
        self.dropped_all += 1

    async def on_message(self, name: str, body: bytes) -> None:
        self.messages.append((name, body))


async def _serve(owner: Owner, sender: BodySender | None = None, clock=time.time, secret=SECRET):
    server = PeerServer(secret, sender, clock)
    server.serve(owner)
    return await _listen(server)


async def _listen(server: PeerServer):
    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, request.raw_path.split("?", 1)[0])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def peer():
    owner = Owner()
    runner, url = await _serve(owner)
    client = PeerClient(SECRET)
    yield owner, url, client
    await client.close()
    await runner.cleanup()


async def _read_all(client: PeerClient, url: str, request: BlockRequest = REQUEST) -> bytes:
    async def collect() -> bytes:
        return b"".join([chunk async for chunk in client.read_block(url, request)])

    return await asyncio.wait_for(collect(), BOUND)


def test_block_request_roundtrips_through_its_query() -> None:
    assert BlockRequest.from_query(REQUEST.target().partition("?")[2]) == REQUEST
    assert REQUEST.target().startswith(f"/_hoard/peer/block/{REQUEST.block_id.digest}?")
    with pytest.raises(ValueError):
        BlockRequest("aws", "data", "k", "e", 0, 0, 99, 50, 51)  # past the block's end


async def test_streams_each_chunk_as_it_arrives(peer) -> None:
    owner, url, client = peer
    gate = asyncio.Event()
    owner.script = [b"a" * 100, gate, memoryview(b"b" * 300), b"c" * 200]
    async with aclosing(client.read_block(url, REQUEST)) as chunks:
        first = await asyncio.wait_for(anext(chunks), BOUND)
        assert not owner.completed  # it arrived while the owner was held on the gate
        gate.set()
        rest = await asyncio.wait_for(_collect(chunks), BOUND)
    assert first + rest == b"a" * 100 + b"b" * 300 + b"c" * 200
    assert owner.requests == [REQUEST]  # the odd key and ETag arrived intact


async def _collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile", "copy"])
async def test_file_segment_is_sent_and_released(tmp_path, sendfile: bool) -> None:
    data = os.urandom(REQUEST.length - 10)
    path = tmp_path / "block"
    path.write_bytes(b"header" + data + b"trailer")
    fd = os.open(path, os.O_RDONLY)
    released: list[int] = []
    segment = FileSegment(fd, 6, len(data), lambda: released.append(os.close(fd) or fd))
    owner = Owner()
    owner.script = [b"0123456789", segment]
    sender = BodySender() if sendfile else None
    runner, url = await _serve(owner, sender)
    client = PeerClient(SECRET)
    try:
        assert await _read_all(client, url) == b"0123456789" + data
        assert released == [fd]
    finally:
        await client.close()
        await runner.cleanup()
        if sender is not None:
            sender.close()


async def _raw_get(url: str, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(URL(url + target, encoded=True), headers=headers) as response,
    ):
        return response.status, await response.read()


def _headers(target: str, date: str, secret: str = SECRET) -> dict[str, str]:
    return {"X-Hoard-Date": date, "X-Hoard-Signature": sign(secret, "GET", target, date)}


def _other_key_target() -> str:
    other = BlockRequest("aws", "data", "secret/other", '"etag-1"', 3, 3000, 3999, 100, 600)
    return other.target()


NOW = str(int(time.time()))
REFUSED = {
    "missing": {},
    "wrong secret": _headers(REQUEST.target(), NOW, "another-secret"),
    "stale date": _headers(REQUEST.target(), str(int(time.time()) - 600)),
    "garbage date": _headers(REQUEST.target(), "yesterday"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_unsigned_requests_get_403_and_no_data(peer, case: str) -> None:
    owner, url, _ = peer
    owner.script = [SECRET_DATA]
    status, body = await _raw_get(url, REQUEST.target(), REFUSED[case])
    assert status == 403
    assert SECRET_DATA not in body and owner.requests == []


async def test_a_signature_covers_the_query(peer) -> None:
    owner, url, _ = peer
    owner.script = [SECRET_DATA]
    headers = _headers(REQUEST.target(), str(int(time.time())))
    status, body = await _raw_get(url, _other_key_target(), headers)
    assert status == 403 and SECRET_DATA not in body and owner.requests == []
    # The same signature on its own target is accepted, with an RFC 3339 date too.
    assert (await _raw_get(url, REQUEST.target(), headers))[0] == 200
    rfc3339 = datetime.now(UTC).isoformat()
    assert (await _raw_get(url, REQUEST.target(), _headers(REQUEST.target(), rfc3339)))[0] == 200


async def test_server_with_a_skewed_clock_refuses(peer) -> None:
    owner = Owner()
    runner, url = await _serve(owner, clock=lambda: time.time() + 3600)
    client = PeerClient(SECRET)
    try:
        with pytest.raises(PeerUnavailable, match="403"):
            await _read_all(client, url)
        assert owner.requests == []
    finally:
        await client.close()
        await runner.cleanup()


async def test_a_server_without_a_secret_refuses_everything() -> None:
    owner = Owner()
    runner, url = await _serve(owner, secret="")
    try:
        headers = _headers(REQUEST.target(), str(int(time.time())), "")
        assert (await _raw_get(url, REQUEST.target(), headers))[0] == 403
        assert owner.requests == []
    finally:
        await runner.cleanup()
    with pytest.raises(ValueError):
        PeerClient("")


async def test_a_node_still_starting_answers_503_until_it_serves() -> None:
    """The cluster part is built before the tiers; until the wiring hands it what to
    answer with, a signed request is a 503 the asking node reads as unavailable."""
    owner = Owner()
    server = PeerServer(SECRET)
    runner, url = await _listen(server)
    client = PeerClient(SECRET)
    try:
        with pytest.raises(PeerUnavailable, match="503"):
            await _read_all(client, url)
        assert not await client.message(url, "prefetch", b"{}")
        server.serve(owner)
        assert await client.message(url, "prefetch", b"{}")
        assert owner.messages == [("prefetch", b"{}")]
    finally:
        await client.close()
        await runner.cleanup()


async def test_wrong_secret_is_unavailable_to_the_client(peer) -> None:
    owner, url, _ = peer
    client = PeerClient("another-secret")
    try:
        with pytest.raises(PeerUnavailable, match="403"):
            await _read_all(client, url)
    finally:
        await client.close()
    assert owner.requests == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (errors.OriginChanged("moved"), PeerChanged),
        (errors.NoSuchKey("k"), PeerNotFound),
        (errors.OriginUnavailable("down"), PeerUnavailable),
        (RuntimeError("bug"), PeerUnavailable),
    ],
    ids=["changed", "not-found", "origin-down", "bug"],
)
async def test_errors_before_the_first_byte_have_a_status(peer, error, expected) -> None:
    owner, url, client = peer
    owner.script = [error]
    with pytest.raises(expected):
        await _read_all(client, url)


async def test_server_down_is_unavailable() -> None:
    client = PeerClient(SECRET, connect_timeout=BOUND)
    try:
        with pytest.raises(PeerUnavailable) as caught:
            await _read_all(client, f"http://127.0.0.1:{free_port()}")
        assert caught.value.received == 0
    finally:
        await client.close()


async def test_mid_stream_abort_raises_after_the_bytes_received(peer) -> None:
    owner, url, client = peer
    gate = asyncio.Event()
    owner.script = [b"a" * 100, gate, errors.OriginUnavailable("origin died mid-block")]
    got = b""
    with pytest.raises(PeerUnavailable) as caught:
        async with aclosing(client.read_block(url, REQUEST)) as chunks:
            got += await asyncio.wait_for(anext(chunks), BOUND)
            gate.set()
            got += await asyncio.wait_for(_collect(chunks), BOUND)
    assert got == b"a" * 100
    assert caught.value.received == 100  # the caller resumes elsewhere at this byte


async def test_an_abandoned_read_closes_its_connection(peer) -> None:
    owner, url, client = peer
    gate = asyncio.Event()
    mib = 1024 * 1024
    big = BlockRequest("aws", "data", "big", "e", 0, 0, 64 * mib + 99, 0, 64 * mib + 100)
    owner.script = [b"a" * 100, gate, *[b"b" * mib] * 64]
    async with aclosing(client.read_block(url, big)) as chunks:
        await asyncio.wait_for(anext(chunks), BOUND)
    gate.set()
    # More than any socket buffer follows: on a closed connection the owner's
    # writes fail and its producer is closed early; on a connection left open and
    # unread they would block, and this wait would fail.
    await asyncio.wait_for(owner.finished.wait(), BOUND)
    assert not owner.completed
    owner.script = [b"c" * REQUEST.length]
    assert await _read_all(client, url) == b"c" * REQUEST.length  # the pool is sound


async def test_invalidate_roundtrip(peer) -> None:
    owner, url, client = peer
    items = [Invalidation("aws", "data", key="a/b"), Invalidation("aws", "data", prefix="")]
    assert await client.invalidate(url, items) is True
    assert owner.invalidated == [items]
    assert await client.invalidate(f"http://127.0.0.1:{free_port()}", items) is False
    with pytest.raises(ValueError):
        Invalidation("aws", "data")


async def test_invalidate_body_is_bound_to_the_signature(peer) -> None:
    owner, url, _ = peer
    target = "/_hoard/peer/invalidate?sha256=" + "0" * 64
    date = str(int(time.time()))
    headers = {"X-Hoard-Date": date, "X-Hoard-Signature": sign(SECRET, "POST", target, date)}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + target, data=b'[{"origin": "aws", "bucket": "data", "prefix": ""}]',
                     headers=headers) as response,
    ):  # fmt: skip
        assert response.status == 403
    assert owner.invalidated == []


def test_queries_roundtrip_through_their_query_strings() -> None:
    cached = dataclasses.replace(REQUEST, cached_only=True)
    assert BlockRequest.from_query(cached.target().partition("?")[2]) == cached
    query = MetadataQuery("list", "aws", "data", "a b/&ü", math.inf, 10.0, "/", "a b/x", 7)
    assert parse_metadata_query(metadata_target(query).partition("?")[2]) == query
    with pytest.raises(ValueError):
        MetadataQuery("drop", "aws", "data", "k", 1.0, 1.0)


async def test_a_cached_only_miss_is_not_cached_not_unavailable(peer) -> None:
    owner, url, client = peer
    owner.script = [PeerNotCached("not here")]
    with pytest.raises(PeerNotCached):
        await _read_all(client, url, dataclasses.replace(REQUEST, cached_only=True))
    assert owner.requests[0].cached_only


async def test_metadata_answers_errors_and_signature(peer) -> None:
    owner, url, client = peer
    query = MetadataQuery("head", "aws", "data", "dir/k?", 60.0, 10.0)
    owner.answer = {"key": "dir/k?", "size": 3}
    assert await client.metadata(url, query, BOUND) == owner.answer
    assert owner.queries == [query]
    owner.answer = errors.NoSuchKey("dir/k?")
    with pytest.raises(PeerNotFound):
        await client.metadata(url, query, BOUND)
    marker = {"x-amz-delete-marker": "true", "x-amz-version-id": "v1"}
    owner.answer = errors.NoSuchKey("dir/k?", marker)  # a delete marker's 404 says so
    with pytest.raises(PeerNotFound) as raised:
        await client.metadata(url, query, BOUND)
    assert raised.value.headers == marker
    owner.answer = errors.NoSuchBucket("data")  # not to be cached as a missing key
    with pytest.raises(PeerUnavailable):
        await client.metadata(url, query, BOUND)
    owner.answer = errors.OriginUnavailable("origin down")
    with pytest.raises(PeerUnavailable) as answered:
        await client.metadata(url, query, BOUND)
    assert answered.value.answered  # the peer is alive: not a failure to report
    with pytest.raises(PeerUnavailable) as down:
        await client.metadata(f"http://127.0.0.1:{free_port()}", query, BOUND)
    assert not down.value.answered
    with pytest.raises(PeerUnavailable):
        await PeerClient("not-the-secret").metadata(url, query, BOUND)
    assert len(owner.queries) == 5


async def test_invalidate_can_drop_everything(peer) -> None:
    owner, url, client = peer
    assert await client.invalidate(url, [], drop_all=True) is True
    assert owner.dropped_all == 1 and owner.invalidated == [[]]
