"""Hits answered inside the connection's protocol (gateway/hotwire.py), in process.

The real application (``wiring.build``) served by the real listener
(``listener.start``: Hoard's connection handler, ``HitConnection``) on a
loopback port, in front of moto through the counting proxy; clients speak raw
HTTP/1.1 over sockets. What aiohttp's request machinery answers is seen by
wrapping the hit path's ``answer`` (the first thing aiohttp's handler runs): a
hit answered on the wire never reaches it. Checked here: hits skip aiohttp;
pipelined hits and non-hits are answered in order; a client that stops reading
stops the server reading (its answers do not pile up in memory); a connection
serving only hits is not closed as idle; without the aiohttp internals the
wire needs, hits are answered behind aiohttp; and a wire hit's access-log line
and metrics are those of a hit answered behind aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.app import hotwire, listener, wiring
from gateway.app.server import HIT_PATH, HIT_WIRE, STATE, rejected
from gateway.config.load import build_settings
from gateway.obs import request_keys as keys
from gateway.s3.auth import Authenticator
from gateway.s3.hits import HitPath
from tests.conftest import moto_origin
from tests.harness import ACCESS_KEY, SECRET_KEY
from tests.origin_proxy import OriginProxy
from tests.rawhttp import presign, sign_headers

SMALL = os.urandom(48 * 1024)  # kept in memory (cache.memory_item_max_on_disk)


@dataclass
class Served:
    port: int
    app: web.Application
    runner: web.AppRunner
    behind_aiohttp: list[str]  # request ids of hits aiohttp's machinery answered

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def sample(self, name: str, **labels: str) -> float:
        metrics = self.app[STATE]["metrics"]
        metrics.flush()  # this loop turn's counts, as a scrape would
        return metrics.registry.get_sample_value(name, labels) or 0.0

    def hits(self) -> float:
        return self.sample("hoard_hit_path_responses_total", source="memory")

    def request(self, target: str, method: str = "GET", extra: str = "") -> bytes:
        presigned = presign(method, self.host, target, expires=600)
        return f"{method} {presigned} HTTP/1.1\r\nHost: {self.host}\r\n{extra}\r\n".encode()


@contextlib.asynccontextmanager
async def serve(
    workdir: Path, proxy: OriginProxy, bucket: str, handler: type = RequestHandler,
    memory: str = "64MiB", **server: Any,
) -> AsyncIterator[Served]:  # fmt: skip
    """The app and the listener as ``hoard serve`` runs them; ``handler``: the aiohttp
    connection handler whose internals the wire is checked against."""
    config = {
        "origins": {"moto": moto_origin(proxy)},
        "default_origin": "moto",
        "mounts": [{"bucket": bucket, "origin": "moto", "metadata_ttl": "forever"}],
        "cache": {"dir": str(workdir / "cache"), "block_size": "1MiB", "memory": memory},
        "credentials": [{"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}],
        "log_format": "json",
    }
    app = wiring.build(build_settings(config))
    hits = app[HIT_PATH]
    behind: list[str] = []

    async def first(request: web.BaseRequest) -> web.StreamResponse | None:
        answer = await hits.answer(request)
        if answer is not None:
            behind.append(request[keys.REQUEST_ID])
        return answer

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    answer = hotwire.wire_answer(hits, handler)
    runner = await listener.start(app, sock, functools.partial(rejected, app), None,
                                  (first, answer), access_log=None, **server)  # type: ignore[arg-type]  # fmt: skip
    try:
        yield Served(sock.getsockname()[1], app, runner, behind)
    finally:
        await runner.cleanup()
        sock.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def read_answer(reader: asyncio.StreamReader, head: bool = False) -> Answer:
    status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head else int(headers.get("content-length", "0"))
    body = await reader.readexactly(length)
    return Answer(int(status_line.split()[1]), headers, body)


@pytest.fixture
def seeded(origin_client, bucket: str) -> str:
    origin_client.put_object(Bucket=bucket, Key="small.bin", Body=SMALL, ContentType="image/jpeg")
    origin_client.put_object(Bucket=bucket, Key="other.bin", Body=b"other object")
    return bucket


async def _warm(served: Served, target: str, tier: str = "memory") -> None:
    """A first GET, then the wait until its block is held: the fill puts it in memory a
    moment after the client has every byte, and a GET meanwhile is no hit."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(served.request(target))
    assert (await read_answer(reader)).body == SMALL
    writer.close()
    metrics, deadline = served.app[STATE]["metrics"], time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics.render()  # refreshes the tier gauges
        if served.sample("hoard_cache_bytes", tier=tier) >= len(SMALL):
            return
        await asyncio.sleep(0.005)  # polling the event itself, not waiting in its place


async def test_hits_are_answered_on_the_wire_without_aiohttp(tmp_path, proxy, seeded) -> None:
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        assert served.sample("hoard_hit_wire_enabled") == 1
        await _warm(served, target)
        hits, gets = served.hits(), proxy.counts["GetObject"]
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        for _ in range(5):
            writer.write(served.request(target))
            answer = await read_answer(reader)
            assert (answer.status, answer.body) == (200, SMALL)
            assert answer.headers["content-type"] == "image/jpeg"
        writer.close()
        assert served.hits() == hits + 5
        assert served.behind_aiohttp == []  # no aiohttp request was built for them
        assert proxy.counts["GetObject"] == gets


async def test_disk_hits_are_answered_on_the_wire_with_sendfile(tmp_path, proxy, seeded) -> None:
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded, memory="0") as served:
        await _warm(served, target, "disk")
        hits, gets = (
            served.sample("hoard_hit_path_responses_total", source="disk"),
            proxy.counts["GetObject"],
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        for _ in range(3):
            writer.write(served.request(target))
            assert (await read_answer(reader)).body == SMALL
        assert served.behind_aiohttp == []  # the record looked up and checked on the wire too
        batch = [served.request(target), served.request(target, extra="Range: bytes=5-9\r\n")]
        writer.write(b"".join(batch * 3))  # pipelined: sendfile's bytes stay in order too
        answers = [await read_answer(reader) for _ in range(6)]
        writer.close()
        assert [a.body for a in answers] == [SMALL, SMALL[5:10]] * 3
        assert served.sample("hoard_hit_path_responses_total", source="disk") == hits + 9
        assert proxy.counts["GetObject"] == gets


async def test_a_record_this_process_never_read_is_looked_up_and_checked_on_the_wire(
    tmp_path, proxy, seeded
) -> None:
    """After a restart (as for a sibling worker's first read of a record) nothing of the
    object is in this process's memory: its metadata is read from the node's store, its
    place from the disk index, its record checked, all on the wire, and answered there.
    A record damaged meanwhile is not served: it is dropped (counted) and fetched again."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded, memory="0") as served:
        await _warm(served, target, "disk")
    gets = proxy.counts["GetObject"]
    async with serve(tmp_path, proxy, seeded, memory="0") as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        for _ in range(3):
            writer.write(served.request(target))
            assert (await read_answer(reader)).body == SMALL
        writer.close()
        assert served.behind_aiohttp == []
        assert served.sample("hoard_hit_path_responses_total", source="disk") == 3
    assert sum(proxy.counts.values()) == gets, proxy.counts  # no HEAD, no GET
    (segment,) = [p for p in (tmp_path / "cache").rglob("*.seg") if SMALL in p.read_bytes()]
    data = bytearray(segment.read_bytes())
    at = data.index(SMALL) + 100
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))
    async with serve(tmp_path, proxy, seeded, memory="0") as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(served.request(target))
        assert (await read_answer(reader)).body == SMALL
        writer.close()
        assert served.sample("hoard_cache_corrupt_blocks_total") == 1
        assert served.sample("hoard_hit_path_responses_total", source="disk") == 0
    assert proxy.counts["GetObject"] == gets + 1


async def test_pipelined_hits_and_other_requests_are_answered_in_order(
    tmp_path, proxy, seeded
) -> None:
    target, other = f"/{seeded}/small.bin", f"/{seeded}/other.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.hits()
        batch = [
            served.request(target),
            served.request(target, extra='If-None-Match: "x"\r\n'),  # the general path
            served.request(target),
            served.request(other),  # a miss: the origin is asked
            served.request(target),
            served.request(target, method="HEAD"),
            served.request(target),
        ]
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"".join(batch))  # one write: the server parses them together
        answers = [await read_answer(reader, head=i == 5) for i in range(len(batch))]
        writer.close()
        assert [a.status for a in answers] == [200] * 7
        bodies = [a.body for a in answers]
        assert bodies == [SMALL, SMALL, SMALL, b"other object", SMALL, b"", SMALL]
        assert served.hits() == hits + 4
        ids = [a.headers["x-amz-request-id"] for a in answers]
        assert len(set(ids)) == len(ids)


async def test_a_client_that_stops_reading_stops_the_server_reading(
    tmp_path, proxy, seeded
) -> None:
    """The answers of a client that sends and never reads are bounded by the socket
    buffers and one transport's high-water mark, not by what it sent."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.hits()
        # Requests padded so that those sent outgrow the socket buffers (~10 MB) long
        # before all are: 18 MB of requests, 300 MB of answers if the server read them all.
        request = served.request(target, extra=f"X-Pad: {'p' * 6000}\r\n")
        sent_at_most = 3000

        def send_without_reading() -> int:
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            client.connect(("127.0.0.1", served.port))
            client.settimeout(3.0)  # no progress for this long: the server stopped reading
            sent = 0
            try:
                while sent < sent_at_most:
                    client.sendall(request)
                    sent += 1
            except TimeoutError:
                pass
            finally:
                client.close()
            return sent

        sent = await asyncio.to_thread(send_without_reading)
        assert sent < sent_at_most
        send_buffer_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
        in_flight = (send_buffer_max + 4 * 1024 * 1024) // len(SMALL) + 4
        assert served.hits() - hits <= in_flight
        # The server is well: the next client gets its hit.
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(request)
        assert (await read_answer(reader)).body == SMALL
        writer.close()


async def test_a_connection_serving_only_hits_is_not_closed_as_idle(
    tmp_path, proxy, seeded
) -> None:
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded, keepalive_timeout=1.0) as served:
        await _warm(served, target)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        began, answered = time.monotonic(), 0
        # Hits for several keep-alive timeouts; aiohttp's timer counts from its last request.
        while time.monotonic() - began < 3.5 or answered < 10:
            writer.write(served.request(target))
            assert (await read_answer(reader)).body == SMALL
            answered += 1
        assert not reader.at_eof()
        writer.close()
        assert served.behind_aiohttp == []


async def test_a_miss_handed_on_from_the_wire_is_verified_once(
    tmp_path, proxy, seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request the wire admits but cannot answer goes through aiohttp's hit-path attempt
    and then the general path: its signature is checked once, not three times."""
    verified: list[str] = []
    verify = Authenticator._verify

    def counting(self: Authenticator, view: Any) -> Any:
        verified.append(view.raw_path)
        return verify(self, view)

    monkeypatch.setattr(Authenticator, "_verify", counting)
    target = f"/{seeded}/other.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        for expected in (1, 2):  # a miss (from the origin), then a hit of the memory tier
            headers = sign_headers("GET", served.host, target)
            lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            writer.write(f"GET {target} HTTP/1.1\r\nHost: {served.host}\r\n{lines}\r\n".encode())
            answer = await read_answer(reader)
            assert (answer.status, answer.body) == (200, b"other object")
            assert verified == [target] * expected
        writer.close()
        bad = sign_headers("GET", served.host, target, secret_key="not-the-secret")
        lines = "".join(f"{name}: {value}\r\n" for name, value in bad.items())
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {served.host}\r\n{lines}\r\n".encode())
        assert (await read_answer(reader)).status == 403  # a refusal is never handed on
        writer.close()


async def test_a_reload_between_the_wire_and_aiohttp_voids_the_verdict_handed_on(
    tmp_path, proxy, seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGHUP that removes the key after the wire verified a miss and before aiohttp built
    its request: the verdict handed on is not reused, and the request is refused."""
    hand_on = HitPath._hand_on

    def then_reload(self: HitPath, message: Any, call: Any, settled: bool) -> None:
        assert settled  # a cold key: the general path would be taken at once
        hand_on(self, message, call, settled)
        self._front._auth.reload([], allow_anonymous=False)  # the key is gone

    monkeypatch.setattr(HitPath, "_hand_on", then_reload)
    target = f"/{seeded}/other.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        lines = "".join(
            f"{n}: {v}\r\n" for n, v in sign_headers("GET", served.host, target).items()
        )
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {served.host}\r\n{lines}\r\n".encode())
        answer = await read_answer(reader)
        assert answer.status == 403 and b"<Code>InvalidAccessKeyId</Code>" in answer.body
        writer.close()


def test_missing_aiohttp_internals_are_named() -> None:
    class Stripped:
        pass

    assert hotwire.missing_internals() == []
    missing = hotwire.missing_internals(Stripped, Stripped)
    assert "_messages" in missing and "parser.message_consumed" in missing


async def test_without_the_internals_hits_are_answered_behind_aiohttp(
    tmp_path, proxy, seeded, caplog
) -> None:
    target = f"/{seeded}/small.bin"
    # ``object``: an aiohttp whose connection handler has none of what the wire needs.
    async with serve(tmp_path, proxy, seeded, handler=object) as served:
        assert "hits answered behind aiohttp" in caplog.text
        await _warm(served, target)
        hits = served.hits()
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        for _ in range(2):
            writer.write(served.request(target))
            assert (await read_answer(reader)).body == SMALL
        writer.close()
        assert served.hits() == hits + 2
        assert len(served.behind_aiohttp) == 2


def access_lines(stderr: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The JSON access-log lines among ``stderr``'s of the requests ``ids``, by id."""
    lines = {}
    for text in stderr.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(text)
            if record.get("request_id") in ids:
                lines[record["request_id"]] = record
    return lines


async def test_a_wire_hit_is_logged_and_counted_as_a_hit_behind_aiohttp(
    tmp_path, proxy, seeded, capsys
) -> None:
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        counted = (
            ("hoard_requests_total", {"operation": "GetObject", "status": "200", "mount": "m0"}),
            ("hoard_bytes_served_total", {"source": "memory", "mount": "m0"}),
            ("hoard_hit_path_responses_total", {"source": "memory"}),
            ("hoard_request_duration_seconds_count", {"operation": "GetObject", "mount": "m0"}),
            ("hoard_response_bytes_total", {"operation": "GetObject", "mount": "m0"}),
        )
        deltas, ids = [], []
        for wire in (True, False):
            wire_answer = served.app[HIT_WIRE] if wire else None
            served.runner.server.wire = wire_answer  # type: ignore[union-attr]
            before = [served.sample(name, **labels) for name, labels in counted]
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(served.request(target))
            answer = await read_answer(reader)
            writer.close()
            assert answer.body == SMALL
            ids.append(answer.headers["x-amz-request-id"])
            deltas.append(
                [
                    served.sample(n, **labels) - b
                    for (n, labels), b in zip(counted, before, strict=True)
                ]
            )
        assert served.behind_aiohttp == [ids[1]]  # the second took aiohttp's way
        assert deltas[0] == deltas[1] == [1, len(SMALL), 1, 1, len(SMALL)]
    lines = access_lines(capsys.readouterr().err, ids)
    variable = ("request_id", "duration", "time")
    on_wire, behind = ({k: v for k, v in lines[i].items() if k not in variable} for i in ids)
    assert on_wire == behind
    assert on_wire["source"] == "memory" and on_wire["status"] == 200


async def test_a_body_shaped_like_a_hit_is_read_as_a_body_not_answered(
    tmp_path, proxy, seeded
) -> None:
    """The wire parses a read itself only while every byte before it was whole bodiless
    heads: a PUT's body that is, byte for byte, a GET of a held object (sent in reads of
    its own, after its head) is the PUT's body, as aiohttp's parser reads it."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.hits()
        smuggled = served.request(target)
        put = served.request(f"/{seeded}/put.bin", method="PUT",
                             extra=f"Content-Length: {len(smuggled)}\r\n")  # fmt: skip
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(put)
        await writer.drain()
        await asyncio.sleep(0.05)  # a read of its own (no answer comes before the body)
        writer.write(smuggled)
        assert (await read_answer(reader)).status == 200  # the PUT's, and only it
        writer.write(served.request(target))  # the connection still serves hits, in order
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, SMALL)
        assert served.hits() == hits + 1
        writer.write(served.request(f"/{seeded}/put.bin"))
        assert (await read_answer(reader)).body == smuggled  # what the PUT stored
        writer.close()


async def test_heads_split_over_reads_or_closing_go_through_aiohttp(
    tmp_path, proxy, seeded
) -> None:
    """A head that arrives in two reads, and one that closes its connection, are not
    plain: aiohttp parses them; the first is still a hit, the second the general path's
    (as every closing request), and both answers are the object."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.hits()
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        request = served.request(target)
        writer.write(request[:20])
        await writer.drain()
        await asyncio.sleep(0.05)  # the rest in a read of its own
        writer.write(request[20:])
        assert (await read_answer(reader)).body == SMALL
        writer.write(served.request(target, extra="Connection: close\r\n"))
        answer = await read_answer(reader)
        assert (answer.status, answer.body) == (200, SMALL)
        assert await reader.read() == b""  # closed, as asked
        writer.close()
        assert served.hits() == hits + 1


async def test_the_rest_of_a_split_head_shaped_like_a_hit_is_read_as_its_rest(
    tmp_path, proxy, seeded
) -> None:
    """A head cut inside a header, whose rest is, byte for byte, a GET of a held object:
    the rest completes the first head (one request, refused: it is not signed), and is
    never answered as a hit of its own."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.hits()
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(f"GET /{seeded}/other.bin HTTP/1.1\r\nX-Pad: ".encode())
        await writer.drain()
        await asyncio.sleep(0.05)  # the rest in a read of its own
        writer.write(served.request(target))
        answer = await read_answer(reader)
        assert answer.status == 403, answer  # the first head's: no signature
        writer.write(served.request(target))
        assert (await read_answer(reader)).body == SMALL  # the next request, the next answer
        writer.close()
        assert served.hits() == hits + 1
