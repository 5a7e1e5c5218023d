"""Peer fills over a real loopback server: streaming, sendfile, signatures, failures.

A ``PeerServer`` with a scripted owner (pieces, events to hold it, errors to
raise) answers a ``PeerClient``. Every wait is bounded and releases on an event;
nothing asserts on how fast anything happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
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

from gateway.cluster import replays
from gateway.cluster.peer_client import PeerClient
from gateway.cluster.peer_server import PeerServer
from gateway.cluster.peers import (
    BlockRequest,
    PeerChanged,
    PeerNotCached,
    PeerNotFound,
    PeerUnavailable,
    metadata_target,
    nonce_text,
    parse_metadata_query,
    request_headers,
)
from gateway.cluster.replays import SeenCounters
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


async def _serve(owner: Owner, sender: BodySender | None = None, clock=time.time, secret=SECRET,
                 seen: SeenCounters | None = None):  # fmt: skip
    server = PeerServer(secret, sender, clock, seen=seen)
    server.serve(owner)
    return await _listen(server)


async def _listen(server: PeerServer):
    """Serve ``server`` on a free loopback port; its URL is the audience it accepts."""

    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await server.handle(request, request.raw_path.split("?", 1)[0])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    server.audience = url
    return runner, url


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


_SENDER = os.urandom(8)  # this test module's requests, as a node's client signs them
_COUNTER = iter(range(1, 1 << 62))


def _headers(
    url: str, target: str, date: str | None = None, secret: str = SECRET, method: str = "GET"
) -> dict[str, str]:
    """A request signed for the node at ``url``, with a nonce never used before."""
    date = str(int(time.time())) if date is None else date
    nonce = nonce_text(_SENDER, next(_COUNTER))
    return request_headers(secret, method, url, target, date, nonce)


def _other_key_target() -> str:
    other = BlockRequest("aws", "data", "secret/other", '"etag-1"', 3, 3000, 3999, 100, 600)
    return other.target()


REFUSED = {
    "missing": lambda url: {},
    "wrong secret": lambda url: _headers(url, REQUEST.target(), secret="another-secret"),
    "stale date": lambda url: _headers(url, REQUEST.target(), str(int(time.time()) - 600)),
    "garbage date": lambda url: _headers(url, REQUEST.target(), "yesterday"),
    "another node": lambda url: _headers("http://127.0.0.1:1", REQUEST.target()),
    "no nonce": lambda url: {
        k: v for k, v in _headers(url, REQUEST.target()).items() if k != "X-Hoard-Nonce"
    },
}


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_unsigned_requests_get_403_and_no_data(peer, case: str) -> None:
    owner, url, _ = peer
    owner.script = [SECRET_DATA]
    status, body = await _raw_get(url, REQUEST.target(), REFUSED[case](url))
    assert status == 403
    assert SECRET_DATA not in body and owner.requests == []


async def test_a_signature_covers_the_query(peer) -> None:
    owner, url, _ = peer
    owner.script = [SECRET_DATA]
    headers = _headers(url, REQUEST.target())
    status, body = await _raw_get(url, _other_key_target(), headers)
    assert status == 403 and SECRET_DATA not in body and owner.requests == []
    # The same signature on its own target is accepted, with an RFC 3339 date too.
    assert (await _raw_get(url, REQUEST.target(), headers))[0] == 200
    rfc3339 = datetime.now(UTC).isoformat()
    assert (await _raw_get(url, REQUEST.target(), _headers(url, REQUEST.target(), rfc3339)))[
        0
    ] == 200


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
        headers = _headers(url, REQUEST.target(), secret="")
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
    headers = _headers(url, target, method="POST")
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


# -- replays and answers ------------------------------------------------------------


async def test_a_replayed_request_is_refused(peer) -> None:
    """A captured request, sent again at once (well within its date), is refused."""
    owner, url, _ = peer
    owner.script = [SECRET_DATA]
    headers = _headers(url, REQUEST.target())
    assert (await _raw_get(url, REQUEST.target(), headers))[0] == 200
    status, body = await _raw_get(url, REQUEST.target(), headers)
    assert status == 403 and SECRET_DATA not in body and len(owner.requests) == 1
    # The drop-everything request of the issue: once, never twice.
    target = "/_hoard/peer/invalidate?all=1&sha256=" + hashlib.sha256(b"[]").hexdigest()
    post = _headers(url, target, method="POST")
    async with aiohttp.ClientSession() as session:
        for expected in (204, 403):
            async with session.post(URL(url + target, encoded=True), data=b"[]",
                                    headers=post) as response:  # fmt: skip
                assert response.status == expected
    assert owner.dropped_all == 1


async def test_a_replay_on_another_worker_or_another_node_is_refused(tmp_path) -> None:
    """Workers of a node share the nonces they accepted; another node is not the audience."""
    table = tmp_path / "node" / "peer-nonces"
    owners = [Owner(), Owner(), Owner()]
    runners = []
    try:
        first = await _serve(owners[0], seen=SeenCounters(table, 601))
        sibling = PeerServer(SECRET, seen=SeenCounters(table, 601))  # same node, another worker
        sibling.serve(owners[1])
        second = await _listen(sibling)
        sibling.audience = first[1]  # both workers answer on the node's one URL
        other = await _serve(owners[2])  # another node, same cluster secret
        runners = [first[0], second[0], other[0]]
        for owner in owners:
            owner.script = [SECRET_DATA]
        headers = _headers(first[1], REQUEST.target())
        assert (await _raw_get(first[1], REQUEST.target(), headers))[0] == 200
        for url in (second[1], other[1]):
            status, body = await _raw_get(url, REQUEST.target(), headers)
            assert status == 403 and SECRET_DATA not in body
        assert [len(owner.requests) for owner in owners] == [1, 0, 0]
    finally:
        for runner in runners:
            await runner.cleanup()


class Tamperer:
    """An on-path attacker between a client and a peer: forwards each request as it is
    and hands back what ``alter(target, status, headers, body)`` makes of the answer."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.alter = lambda target, status, headers, body: (status, headers, body)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.startswith("X-Hoard-")}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(request.method, URL(self.upstream + request.raw_path, encoded=True),
                            data=await request.read(), headers=headers) as answer,
        ):  # fmt: skip
            body = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.startswith("X-Hoard-")}
            status, kept, body = self.alter(request.raw_path, answer.status, kept, body)
        return web.Response(status=status, headers=kept, body=body)

    async def listen(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_a_tampered_or_swapped_answer_is_refused_by_the_client() -> None:
    owner = Owner()
    server = PeerServer(SECRET)
    server.serve(owner)
    runner, url = await _listen(server)
    tamperer = Tamperer(url)
    proxy_runner, proxy_url = await tamperer.listen()
    server.audience = proxy_url  # the client names the node by the address it dials
    client = PeerClient(SECRET)
    query = MetadataQuery("head", "aws", "data", "k", 60.0, 10.0)
    try:
        owner.answer = {"key": "k", "etag": '"1"', "size": 3}
        assert await client.metadata(proxy_url, query, BOUND) == owner.answer  # untouched
        # A changed body (another ETag, size) under the real signature.
        tamperer.alter = lambda t, s, h, b: (s, h, b.replace(b'"size": 3', b'"size": 9'))
        with pytest.raises(PeerUnavailable, match="answer signature"):
            await client.metadata(proxy_url, query, BOUND)
        # A block answer swapped for a forged "no such key": not believed, not cached as one.
        owner.script = [SECRET_DATA]
        forged = (b'{"error": "NoSuchKey", "message": "gone"}', 404, "NoSuchKey")
        tamperer.alter = lambda t, s, h, b: (
            forged[1],
            {**h, "X-Hoard-Error": forged[2]},
            forged[0],
        )
        with pytest.raises(PeerUnavailable, match="answer signature"):
            await _read_all(client, proxy_url)
        # A genuine answer, signed by the peer, given to another request.
        recorded: dict[str, tuple] = {}

        def swap(target, status, headers, body):
            if not recorded:
                recorded["first"] = (status, headers, body)
            return recorded["first"]

        tamperer.alter = swap
        assert await client.metadata(proxy_url, query, BOUND) == owner.answer  # recorded
        other = dataclasses.replace(query, key="other")
        with pytest.raises(PeerUnavailable, match="answer signature"):
            await client.metadata(proxy_url, other, BOUND)
        # An invalidation "confirmed" by the attacker, who dropped it on the way.
        tamperer.alter = lambda t, s, h, b: (204, {}, b"")
        assert await client.invalidate(proxy_url, [Invalidation("aws", "data", key="k")]) is False
    finally:
        await client.close()
        await proxy_runner.cleanup()
        await runner.cleanup()


def test_seen_counters_remember_each_sender_in_a_window(tmp_path) -> None:
    seen = SeenCounters(tmp_path / "nonces", reusable_after=601)
    alice, bob = b"a" * 8, b"b" * 8
    assert seen.accept(alice, 5, 0.0) and not seen.accept(alice, 5, 1.0)
    assert seen.accept(alice, 3, 1.0) and seen.accept(alice, 9, 1.0)  # out of order: fine
    assert not seen.accept(alice, 3, 2.0) and not seen.accept(alice, 9, 2.0)
    assert seen.accept(bob, 5, 2.0)  # senders are apart
    assert seen.accept(alice, 9 + 5000, 3.0)
    assert not seen.accept(alice, 10, 3.0)  # more than the window behind: cannot tell
    assert not seen.accept(b"\0" * 8, 1, 3.0) and not seen.accept(alice, 0, 3.0)
    seen.close()
    again = SeenCounters(tmp_path / "nonces", reusable_after=601)  # a restarted worker
    assert not again.accept(alice, 9 + 5000, 4.0)
    again.close()


def test_seen_counters_are_bounded_and_fail_closed(tmp_path) -> None:
    seen = SeenCounters(None, reusable_after=601)
    senders = [i.to_bytes(8, "little") for i in range(1, replays.SLOTS + 200)]
    accepted = [seen.accept(sender, 1, 0.0) for sender in senders]
    assert accepted.count(True) <= replays.SLOTS and not all(accepted)  # full: refused
    refused = senders[accepted.index(False)]
    assert seen.accept(refused, 1, 602.0)  # once the others fell silent past any date window
