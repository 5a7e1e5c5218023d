"""The express lane (gateway/s3/express.py): a presigned hit answered again from its bytes.

The real application served by the real listener on a loopback port, in front of
moto through the counting proxy (``test_hit_wire.serve``); clients send raw
HTTP/1.1 keep-alive requests over sockets, the same presigned bytes again and
again. Which way each request took is seen without timing: the lane's own
``repeat`` is wrapped (a repeat returned: the lane answered; None: the hit
path decided), as are the hit path's entries (``answer_now``/``answer_again``:
on the wire; ``answer``: aiohttp's request machinery), and ``len`` of the lane
counts the heads kept. Checked here: a repeat is answered by the lane with the
hit path's very answer (bar the per-request lines); a repeat that is not the same
bytes, a URL past its expiry, credentials reloaded, an object written anew, a
block evicted, are each answered as without the lane; a range is kept as a
range; a header-signed request is never kept; a connection goes back to the
wire as soon as aiohttp answered its request; and a lane's answer is counted
and logged as the hit path's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import SecretStr

from gateway.app.server import HIT_PATH, STATE
from gateway.config.settings import Credential
from gateway.core.hot_sets import HotSets
from gateway.s3.express import Repeat
from gateway.s3.hits import HitPath
from tests.harness import ACCESS_KEY, SECRET_KEY, s3_client
from tests.rawhttp import sign_headers
from tests.test_hit_replay import CREDENTIALS, _clocked, _plain
from tests.test_hit_wire import SMALL, Served, _warm, access_lines, seeded, serve
from tests.test_presigned_memo import _signed_at

__all__ = ["seeded"]  # the fixture, used by name

PER_REQUEST = (b"date", b"x-amz-request-id", b"x-amz-id-2")


@dataclass
class Raw:
    """An answer as sent: its head's bytes and its body."""

    head: bytes
    body: bytes

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])

    def lines(self) -> list[tuple[bytes, bytes]]:
        """The header lines, in order: (name in lower case, value)."""
        fields = []
        for line in self.head.split(b"\r\n")[1:]:
            if line:
                name, _, value = line.partition(b":")
                fields.append((name.strip().lower(), value.strip()))
        return fields

    def header(self, name: str) -> str:
        (value,) = [v for n, v in self.lines() if n == name.lower().encode()]
        return value.decode()

    def comparable(self) -> bytes:
        """The whole answer, byte for byte, without the lines set per request."""
        kept = [
            line
            for line in self.head.split(b"\r\n")
            if line.partition(b":")[0].strip().lower() not in PER_REQUEST
        ]
        return b"\r\n".join(kept) + self.body

    def fields(self) -> list[tuple[bytes, bytes]]:
        """The header lines but the per-request ones, in any order."""
        return sorted(line for line in self.lines() if line[0] not in PER_REQUEST)


async def read_raw(reader: asyncio.StreamReader, head_only: bool = False) -> Raw:
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), head
    answer = Raw(head, b"")
    if not head_only:
        length = [v for n, v in answer.lines() if n == b"content-length"]
        answer.body = await reader.readexactly(int(length[0]) if length else 0)
    return answer


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def ask(self, request: bytes) -> Raw:
        self.writer.write(request)
        return await read_raw(self.reader)


@contextlib.asynccontextmanager
async def connected(served: Served) -> AsyncIterator[Connection]:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        yield Connection(reader, writer)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


class Spy:
    """What the lane and the hit path's entries returned, request by request (set before
    a connection is opened: a connection takes the wire's methods when it is made)."""

    def __init__(self, hits: HitPath) -> None:
        self.repeats: list[Repeat | None] = []  # the lane's: a repeat is an answer of its own
        self.now: list[bool] = []  # answer_now's (on the wire, the hit path deciding)
        self.again: list[bool] = []  # answer_again's (on the wire, the lane first)
        self.behind: list[str] = []  # the raw paths aiohttp's request machinery asked about
        lane, answer_now, answer_again, answer = (
            hits._lane, hits.answer_now, hits.answer_again, hits.answer,
        )  # fmt: skip
        repeat = lane.repeat

        def spied_repeat(head: bytes, transport: Any) -> Repeat | None:
            found = repeat(head, transport)
            self.repeats.append(found)
            return found

        def spied_now(message: Any, transport: Any, sockfd: Any) -> bool:
            self.now.append(answer_now(message, transport, sockfd))
            return self.now[-1]

        def spied_again(head: bytes, transport: Any, sockfd: Any) -> bool:
            self.again.append(answer_again(head, transport, sockfd))
            return self.again[-1]

        async def spied_answer(request: Any) -> Any:
            self.behind.append(request.raw_path)
            return await answer(request)

        lane.repeat = spied_repeat  # type: ignore[method-assign]
        hits.answer_now = spied_now  # type: ignore[method-assign]
        hits.answer_again = spied_again  # type: ignore[method-assign]
        hits.answer = spied_answer  # type: ignore[method-assign]

    @property
    def lane_answers(self) -> int:
        return sum(1 for found in self.repeats if found is not None)

    def clear(self) -> None:
        for seen in (self.repeats, self.now, self.again, self.behind):
            seen.clear()


def _changed(request: bytes, after: bytes, offset: int = 0) -> bytes:
    """``request`` with the byte ``offset`` bytes past ``after`` (in its query) changed: a
    digit for a letter, never the same byte in another case."""
    at = request.index(after) + len(after) + offset
    byte = b"1" if request[at : at + 1] == b"0" else b"0"
    return request[:at] + byte + request[at + 1 :]


def _ask_for(served: Served, target: str, method: str = "GET", extra: str = "") -> bytes:
    """A presigned request of ``target``, as sent again and again; its own bytes, never
    those of a request ``_warm`` sent in the same second (whose answer may be kept)."""
    return served.request(target, method, f"User-Agent: express-lane-test\r\n{extra}")


def _target(request: bytes) -> str:
    return request.split(b" ", 2)[1].decode()


async def test_a_repeat_is_answered_by_the_lane_as_the_hit_path_answered_it(
    tmp_path, proxy, seeded
) -> None:
    """The first hit of a presigned GET is the hit path's (and kept); each repeat of its
    bytes, one at a time or pipelined, is the lane's: byte for byte the hit path's answer
    but for Date and the request id (a fresh one each time), header order included; the
    general path's answer has the same headers and body; the origin is not asked."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        request = _ask_for(served, target)
        gets, counted = proxy.counts["GetObject"], served.hits()
        async with connected(served) as connection:
            first = await connection.ask(request)  # the hit path's answer, kept
            assert (spy.repeats, spy.now) == ([None], [True])
            assert len(hits._lane) == 1
            repeats = [await connection.ask(request) for _ in range(3)]
            connection.writer.write(request * 2)  # pipelined: each answered in turn
            repeats += [await read_raw(connection.reader) for _ in range(2)]
            # The general path's answer to the same GET (an If-Match of the object's own
            # ETag sends it there and changes nothing in the answer).
            etag = first.header("etag")
            general = await connection.ask(_ask_for(served, target, extra=f"If-Match: {etag}\r\n"))
        assert all(found is not None for found in spy.repeats[1:6])
        assert spy.now[:1] == [True] and len(spy.now) == 2  # the If-Match one's: declined
        assert spy.again == [False] + [True] * 5 + [False]  # answered by the lane: repeats
        assert (first.status, first.body) == (200, SMALL)
        for answer in repeats:
            assert answer.comparable() == first.comparable()
        assert general.fields() == first.fields() and general.body == SMALL
        ids = [answer.header("x-amz-request-id") for answer in (first, *repeats, general)]
        assert len(set(ids)) == len(ids), ids  # each repeat has a request id of its own
        for answer in (first, *repeats):
            names = [name for name, _ in answer.lines()]
            assert all(names.count(name) == 1 for name in PER_REQUEST), names
            assert answer.header("x-amz-id-2") == answer.header("x-amz-request-id")
        assert served.hits() == counted + 6
        assert proxy.counts["GetObject"] == gets
        assert served.behind_aiohttp == []


async def test_a_repeat_with_one_query_byte_changed_is_refused_not_laned(
    tmp_path, proxy, seeded
) -> None:
    """The kept bytes with one byte of the signature (first, last) or of the expiry
    changed: not the lane's, refused with the general path's S3 XML; the kept bytes
    are still answered by the lane after each."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        request = _ask_for(served, target)
        async with connected(served) as connection:
            for _ in range(2):
                assert (await connection.ask(request)).body == SMALL
            assert spy.lane_answers == 1 and len(hits._lane) == 1
            for after, offset in ((b"X-Amz-Signature=", 0), (b"X-Amz-Signature=", 63),
                                  (b"X-Amz-Expires=", 2)):  # fmt: skip
                changed = _changed(request, after, offset)
                assert changed != request and len(changed) == len(request)
                spy.clear()
                refused = await connection.ask(changed)
                assert spy.repeats == [None], after  # not the lane's
                assert refused.status == 403, after
                assert b"<Code>SignatureDoesNotMatch</Code>" in refused.body, refused.body
                assert refused.header("content-type") == "application/xml"
                request_id = refused.header("x-amz-request-id")
                assert f"<RequestId>{request_id}</RequestId>".encode() in refused.body
                assert len(hits._lane) == 1  # a refusal is never kept
                spy.clear()
                again = await connection.ask(request)  # the bytes kept are still the lane's
                assert (again.status, again.body) == (200, SMALL)
                assert spy.lane_answers == 1


async def test_an_expired_url_is_refused_never_laned(tmp_path, proxy, seeded) -> None:
    """The authenticator's clock moved (``test_hit_replay._clocked``): at the URL's last
    valid second the lane answers; a millisecond later, and an hour later, the repeat is
    refused as the general path refuses it with nothing remembered."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        auth, clock = _clocked(served)  # before any verdict is kept: all on this clock
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        request = _ask_for(served, target)  # presigned for 600 s
        expiry = _signed_at(_target(request)) + 600
        hits_before = served.hits()
        async with connected(served) as connection:
            for _ in range(2):
                assert (await connection.ask(request)).body == SMALL
            assert spy.lane_answers == 1
            clock.now = expiry  # its last valid second: still the lane's
            assert (await connection.ask(request)).body == SMALL
            assert spy.lane_answers == 2
            clock.now = expiry + 0.001
            spy.clear()
            refused = await connection.ask(request)
            assert spy.repeats == [None]
            assert refused.status == 403
            assert b"<Code>AccessDenied</Code>" in refused.body
            assert b"<Message>Request has expired</Message>" in refused.body
            clock.now += 3600
            spy.clear()
            later = await connection.ask(request)
            assert spy.repeats == [None] and later.status == 403
        assert served.hits() == hits_before + 3
        # What the server answers those bytes with nothing remembered (no lane, no memo),
        # on the same clock (the error names the server's time).
        auth.reload(CREDENTIALS, False)
        async with connected(served) as connection:
            fresh = await connection.ask(request)
        assert _plain((later.status, later.body)) == _plain((fresh.status, fresh.body))


async def test_reloaded_credentials_refuse_a_kept_repeat(tmp_path, proxy, seeded) -> None:
    """What a SIGHUP does (``Authenticator.reload``): the same key re-verified and kept
    anew; a key limited to other buckets, or removed, refused at its next repeat."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        auth, _ = _clocked(served)
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        request = _ask_for(served, target)
        async with connected(served) as connection:
            for _ in range(2):
                assert (await connection.ask(request)).body == SMALL
            assert spy.lane_answers == 1
            auth.reload(CREDENTIALS, False)  # the same key: verified again, then the lane's
            spy.clear()
            for _ in range(2):
                assert (await connection.ask(request)).body == SMALL
            assert spy.repeats[0] is None and spy.repeats[1] is not None
            assert spy.now == [True]
            limited = Credential(access_key=ACCESS_KEY, secret_key=SecretStr(SECRET_KEY),
                                 buckets=["elsewhere"])  # fmt: skip
            auth.reload([limited], False)
            spy.clear()
            denied = await connection.ask(request)
            assert spy.repeats == [None]
            assert denied.status == 403 and b"<Code>AccessDenied</Code>" in denied.body
            other = Credential(access_key="other-key", secret_key=SecretStr("other-secret"))
            auth.reload([other], False)
            spy.clear()
            for _ in range(2):
                removed = await connection.ask(request)
                assert removed.status == 403
                assert b"<Code>InvalidAccessKeyId</Code>" in removed.body
            assert spy.repeats == [None, None]


async def _until_laned(
    connection: Connection, spy: Spy, request: bytes, check: Callable[[Raw], None]
) -> list[Raw]:
    """``request`` sent again and again, each answer checked, until the lane answers it
    (its object held again, and kept anew by the hit path's answer)."""
    spy.clear()
    answers, deadline = [], time.monotonic() + 30
    while True:
        answers.append(await connection.ask(request))
        check(answers[-1])
        if spy.repeats[-1] is not None:
            return answers
        assert time.monotonic() < deadline, "never answered by the lane again"
        await asyncio.sleep(0.005)  # polling the event itself (the lane's answer)


async def test_an_object_written_through_hoard_is_never_answered_old(
    tmp_path, proxy, seeded
) -> None:
    """A PUT through the gateway of new bytes of the same size (another ETag, the same
    length), then of another size, then a DELETE: each repeat of the kept bytes (the
    whole object's and a range's) answers the object as it is now, never as it was, and
    the lane keeps the new version once it is held."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        whole = _ask_for(served, target)
        ranged = _ask_for(served, target, extra="Range: bytes=0-99\r\n")
        client = s3_client(f"http://{served.host}")
        async with connected(served) as connection:
            for request in (whole, ranged, whole, ranged):
                assert (await connection.ask(request)).status in (200, 206)
            assert spy.lane_answers == 2 and len(hits._lane) == 2
            etag = None
            for body in (bytes(b ^ 0xFF for b in SMALL), b"another size"):
                put = await asyncio.to_thread(
                    client.put_object, Bucket=seeded, Key="small.bin", Body=body
                )
                assert put["ETag"] != etag
                etag, size, end = put["ETag"], len(body), min(len(body), 100) - 1

                def new_whole(answer: Raw, body: bytes = body, etag: str = etag) -> None:
                    assert (answer.status, answer.body) == (200, body)
                    assert answer.header("etag") == etag

                def new_range(
                    answer: Raw, body: bytes = body, etag: str = etag, size: int = size,
                    end: int = end,
                ) -> None:  # fmt: skip
                    assert (answer.status, answer.body) == (206, body[: end + 1])
                    assert answer.header("etag") == etag
                    assert answer.header("content-range") == f"bytes 0-{end}/{size}"

                for request, check in ((whole, new_whole), (ranged, new_range)):
                    answered = await _until_laned(connection, spy, request, check)
                    assert len(answered) >= 2  # the first after the write: not the lane's
                assert len(hits._lane) == 2
            await asyncio.to_thread(client.delete_object, Bucket=seeded, Key="small.bin")
            spy.clear()
            for request in (whole, ranged, whole, ranged):
                gone = await connection.ask(request)
                assert gone.status == 404 and b"<Code>NoSuchKey</Code>" in gone.body
            assert spy.repeats == [None] * 4


async def test_a_block_evicted_is_answered_from_disk_or_refilled_never_wrong(
    tmp_path, proxy, seeded
) -> None:
    """The block of a kept repeat dropped from memory: the lane looks it up again and
    answers from the disk record; dropped from every tier (``DELETE /_hoard/cache``):
    the hit path hands it on, the origin is asked once, the bytes are the object's."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        await _warm(served, target, "disk")  # held in both tiers
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        request = _ask_for(served, target)
        async with connected(served) as connection:
            first = await connection.ask(request)
            for _ in range(2):
                assert (await connection.ask(request)).comparable() == first.comparable()
            assert [found[2] for found in spy.repeats if found] == ["memory"] * 2
            # Memory evicted: the block is looked up again and found on disk.
            hits._reader.blocks.memory.clear()
            spy.clear()
            for _ in range(3):
                answer = await connection.ask(request)
                assert answer.comparable() == first.comparable()
            # Still the lane's, from the disk record (sent with sendfile): found by lookup
            # once, then lent again by the lease the key's ticket keeps of it.
            assert [found and found[2] for found in spy.repeats] == ["disk"] * 3
            ticket = hits._reader.ticket(seeded, "small.bin")
            assert ticket is not None and ticket.lease is not None
            assert ticket.loan is None or ticket.loan.data is None  # the loan ended
            # Every tier dropped (the admin API): the origin is asked again, once.
            gets = proxy.counts["GetObject"]
            drop = f"/_hoard/cache?bucket={seeded}&prefix="
            lines = "".join(
                f"{name}: {value}\r\n"
                for name, value in sign_headers("DELETE", served.host, drop).items()
            )
            dropped = await connection.ask(
                f"DELETE {drop} HTTP/1.1\r\nHost: {served.host}\r\n{lines}\r\n".encode()
            )
            assert dropped.status == 200, dropped.body
            counts = json.loads(dropped.body)
            assert counts["disk_blocks"] >= 1, counts  # memory holds none since the clear
            spy.clear()
            refilled = await connection.ask(request)
            assert spy.repeats == [None]
            assert refilled.fields() == first.fields() and refilled.body == SMALL
            assert proxy.counts["GetObject"] == gets + 1


async def test_a_ranged_repeat_is_answered_by_the_lane_with_its_range(
    tmp_path, proxy, seeded
) -> None:
    """A presigned GET with ``Range: bytes=0-99``, repeated: 206 with the same
    Content-Range each time, the repeats the lane's; a suffix range and the whole object
    of the same key are lanes of their own, interleaved on one connection."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        ranged = _ask_for(served, target, extra="Range: bytes=0-99\r\n")
        tail = _ask_for(served, target, extra="Range: bytes=-7\r\n")
        whole = _ask_for(served, target)
        size = len(SMALL)
        async with connected(served) as connection:
            answers = [await connection.ask(ranged) for _ in range(4)]
            assert spy.repeats[0] is None and all(spy.repeats[1:4]), spy.repeats
            for answer in answers:
                assert (answer.status, answer.body) == (206, SMALL[:100])
                assert answer.header("content-range") == f"bytes 0-99/{size}"
                assert answer.header("content-length") == "100"
                assert answer.comparable() == answers[0].comparable()
            spy.clear()
            # Other ranges and the whole object of the same key: lanes of their own.
            for _ in range(2):
                last = await connection.ask(tail)
                assert (last.status, last.body) == (206, SMALL[-7:])
                assert last.header("content-range") == f"bytes {size - 7}-{size - 1}/{size}"
                full = await connection.ask(whole)
                assert (full.status, full.body) == (200, SMALL)
                again = await connection.ask(ranged)
                assert again.comparable() == answers[0].comparable()
            assert [found is not None for found in spy.repeats] == [False, False, True] + [True] * 3
        assert len(hits._lane) == 3
        assert served.behind_aiohttp == []


def _header_signed(served: Served, target: str, extra: dict[str, str] | None = None,
                   access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> bytes:  # fmt: skip
    """A SigV4 header-signed request of ``target``, signed now, as boto3 sends one: with a
    fresh invocation id (and so a signature of its own) every time."""
    headers = {"amz-sdk-invocation-id": str(uuid.uuid4()), "amz-sdk-request": "attempt=1",
               **(extra or {})}  # fmt: skip
    signed = sign_headers("GET", served.host, target, headers=headers, access_key=access_key,
                          secret_key=secret_key)  # fmt: skip
    lines = "".join(f"{name}: {value}\r\n" for name, value in signed.items())
    return (f"GET {target} HTTP/1.1\r\nHost: {served.host}\r\nUser-Agent: express-lane-test"
            f"\r\n{lines}\r\n").encode()  # fmt: skip


@pytest.mark.parametrize("ranged", [False, True])
async def test_header_signed_repeats_are_laned_and_each_verified(
    tmp_path, proxy, seeded, ranged: bool
) -> None:
    """Every request signed anew (date, signature, invocation id differ): the first
    answered by the hit path and kept by its signed form, the rest by the lane, each as the
    hit path answered it; each one's signature is verified: the first repeat in full, the
    later ones by the check it left (``sigv4_repeat.py``); one byte changed is refused."""
    target = f"/{seeded}/small.bin"
    extra = {"Range": "bytes=0-99"} if ranged else None
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        in_full = []
        verified = hits.front.verified
        hits.front.verified = lambda *asked: in_full.append(asked) or verified(*asked)
        async with connected(served) as connection:
            answers = [await connection.ask(_header_signed(served, target, extra))
                       for _ in range(4)]  # fmt: skip
            assert len(hits._lane) == 1
            assert [found is not None for found in spy.repeats] == [False, True, True, True]
            assert len(in_full) == 1  # the first repeat; the later two by the check
            first = answers[0]
            for answer in answers:
                assert answer.status == (206 if ranged else 200)
                assert answer.body == (SMALL[:100] if ranged else SMALL)
                assert _without_per_request(answer.head) == _without_per_request(first.head)
            spy.clear()
            forged = _changed(_header_signed(served, target, extra), b"Signature=", 3)
            refused = await connection.ask(forged)
            assert refused.status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in refused.body
            assert spy.repeats == [None] and len(hits._lane) == 1 and len(in_full) == 2
            assert (await connection.ask(_header_signed(served, target, extra))).status in (
                200, 206)  # fmt: skip
            assert spy.lane_answers == 1  # the lane still holds: a forgery drops nothing


async def test_a_header_signed_lane_is_its_signers_alone(tmp_path, proxy, seeded) -> None:
    """The signed form leaves out who signed: another key's request is verified as its
    own, and answered by the hit path for it (then kept for it); a date past the skew,
    a key limited to other buckets or removed by a reload are refused, never laned."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        other = Credential(access_key="other-key", secret_key=SecretStr("other-secret"))
        auth, clock = _clocked(served)
        auth.reload([*CREDENTIALS, other], False)
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        async with connected(served) as connection:
            for _ in range(2):
                assert (await connection.ask(_header_signed(served, target))).body == SMALL
            assert spy.lane_answers == 1
            spy.clear()
            for _ in range(2):
                asked = _header_signed(served, target, access_key="other-key",
                                       secret_key="other-secret")  # fmt: skip
                assert (await connection.ask(asked)).body == SMALL
            assert [found is not None for found in spy.repeats] == [False, True]
            spy.clear()
            clock.now += 16 * 60  # past the 15 minutes S3 allows a signature's date
            skewed = await connection.ask(_header_signed(served, target))
            assert skewed.status == 403 and b"<Code>RequestTimeTooSkewed</Code>" in skewed.body
            clock.now -= 16 * 60
            limited = Credential(access_key=ACCESS_KEY, secret_key=SecretStr(SECRET_KEY),
                                 buckets=["elsewhere"])  # fmt: skip
            auth.reload([limited], False)
            denied = await connection.ask(_header_signed(served, target))
            assert denied.status == 403 and b"<Code>AccessDenied</Code>" in denied.body
            auth.reload([other], False)
            removed = await connection.ask(_header_signed(served, target))
            assert removed.status == 403 and b"<Code>InvalidAccessKeyId</Code>" in removed.body
            assert spy.repeats == [None, None, None]


def _without_per_request(head: bytes) -> bytes:
    """A head without the lines set per request (Date, the request ids)."""
    return re.sub(rb"(?im)^(date|x-amz-request-id|x-amz-id-2):[^\r\n]*\r\n", b"", head)


async def test_the_lanes_are_a_hot_set_oldest_out_first(tmp_path, proxy, seeded) -> None:
    """At most ``hot.urls`` heads kept (here 3, set on the running front). Once full, a
    fourth and fifth are turned away at their first sight (``core/hot_sets.py``'s
    doorkeeper) and taken in at their second, pushing the oldest out, which is then
    the hit path's again, and kept anew at its own second sight."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        hits.front._hot = HotSets(keys=hits.front.hot.keys, urls=3)
        spy = Spy(hits)
        heads = [_ask_for(served, target, extra=f"X-Reader: {i}\r\n") for i in range(5)]
        async with connected(served) as connection:
            for request in heads:
                assert (await connection.ask(request)).body == SMALL
            assert len(hits._lane) == 3 and spy.repeats == [None] * 5
            spy.clear()
            for request in (heads[3], heads[4], heads[4], heads[2], heads[0], heads[0],
                            heads[0]):  # fmt: skip
                assert (await connection.ask(request)).body == SMALL
            laned = [found is not None for found in spy.repeats]
            assert laned == [False, False, True, True, False, False, True]
            assert len(hits._lane) == 3


@pytest.mark.parametrize("first", ["miss", "head"])
async def test_after_a_request_aiohttp_answered_hits_are_answered_on_the_wire(
    tmp_path, proxy, seeded, first: str
) -> None:
    """One keep-alive connection: a request aiohttp's loop answers (a miss of a cold key,
    or a HEAD), pipelined with hits behind it, then more hits one by one. aiohttp's
    request machinery (``HitPath.answer``) is asked about the first request only."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        counted = served.hits()
        if first == "miss":
            before = _ask_for(served, f"/{seeded}/other.bin")
        else:
            before = _ask_for(served, target, method="HEAD")
        hit = _ask_for(served, target)
        async with connected(served) as connection:
            connection.writer.write(before + hit * 3)  # one write: parsed together
            answer = await read_raw(connection.reader, head_only=first == "head")
            assert answer.status == 200
            assert answer.body == (b"other object" if first == "miss" else b"")
            pipelined = [await read_raw(connection.reader) for _ in range(3)]
            alone = [await connection.ask(hit) for _ in range(3)]
        assert [a.body for a in (*pipelined, *alone)] == [SMALL] * 6
        assert spy.behind == [_target(before)]  # aiohttp's machinery: the first request only
        # Each hit answered on the wire: queued behind the first (answer_now of aiohttp's
        # parsed message), or as it came (answer_again, then answer_now if not laned).
        on_wire = spy.now.count(True) + sum(1 for found in spy.repeats if found is not None)
        assert on_wire == 6, (spy.now, spy.repeats)
        assert served.hits() == counted + 6
        assert served.behind_aiohttp == []


def _counters(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every Hoard counter of the registry, and every histogram's count (its buckets and
    sum are timings; the process's CPU seconds are not the request's), as a scrape would
    read them now."""
    metrics = served.app[STATE]["metrics"]
    metrics.flush()
    samples = {}
    for family in metrics.registry.collect():
        if not family.name.startswith("hoard_"):
            continue
        for sample in family.samples:
            counter = family.type == "counter" and sample.name.endswith("_total")
            if counter or (family.type == "histogram" and sample.name.endswith("_count")):
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _hit_series(status: int) -> list[tuple[str, dict[str, str]]]:
    """The series a hit of the memory tier moves (``test_hit_wire``'s comparison)."""
    getobject = {"operation": "GetObject", "mount": "m0"}
    return [
        ("hoard_requests_total", {**getobject, "status": str(status)}),
        ("hoard_bytes_served_total", {"source": "memory", "mount": "m0"}),
        ("hoard_hit_path_responses_total", {"source": "memory"}),
        ("hoard_request_duration_seconds_count", getobject),
        ("hoard_response_bytes_total", getobject),
    ]


async def test_a_lane_answer_is_counted_and_logged_as_the_hit_paths(
    tmp_path, proxy, seeded, capsys
) -> None:
    """As ``test_hit_wire``'s wire/aiohttp comparison: the series a hit moves, and then
    every counter of the registry, move alike for the hit path's answer and the lane's,
    whole and ranged; and each has its access-log line, under the request id it sent."""
    target = f"/{seeded}/small.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, target)
        hits = served.app[HIT_PATH]
        spy = Spy(hits)
        ids: list[str] = []
        async with connected(served) as connection:
            for status, extra, size in ((200, "", len(SMALL)), (206, "Range: bytes=0-99\r\n", 100)):
                counted = _hit_series(status)
                request = _ask_for(served, target, extra=extra)
                deltas, moved = [], []
                for _ in range(2):  # the hit path's answer, then the lane's
                    before = [served.sample(name, **labels) for name, labels in counted]
                    every = _counters(served)
                    answer = await connection.ask(request)
                    assert answer.status == status
                    ids.append(answer.header("x-amz-request-id"))
                    now = _counters(served)
                    after = [served.sample(name, **labels) for name, labels in counted]
                    deltas.append([a - b for a, b in zip(after, before, strict=True)])
                    moved.append({k: v - every.get(k, 0) for k, v in now.items()
                                  if v != every.get(k, 0)})  # fmt: skip
                assert deltas[0] == deltas[1] == [1, size, 1, 1, size], deltas
                assert moved[0] == moved[1], moved
        assert [found is not None for found in spy.repeats] == [False, True] * 2
        assert len(set(ids)) == 4
        assert served.app[STATE]["access_log"].enabled
    lines = access_lines(capsys.readouterr().err, ids)
    assert set(lines) == set(ids), lines  # one line per answer, under the id sent
    variable = ("request_id", "duration", "time")
    by_path, by_lane = (
        [{k: v for k, v in lines[ids[i]].items() if k not in variable} for i in which]
        for which in ((0, 2), (1, 3))
    )
    assert by_lane == by_path
    assert [(line["status"], line["bytes"], line["source"]) for line in by_lane] == [
        (200, len(SMALL), "memory"), (206, 100, "memory"),
    ]  # fmt: skip
    assert by_lane[0]["operation"] == "GetObject" and by_lane[0]["method"] == "GET"
    assert by_lane[0]["path"] == target and by_lane[0]["error"] == "-"


async def test_repeats_from_a_loan_are_observed_counted_and_kept_recent_per_read(
    tmp_path, proxy, seeded
) -> None:
    """A repeat answered from its ticket's loan (``MemoryTier.lend``) does what any hit
    does besides finding the bytes, at the end of the loop's turn: the observers (epoch
    prefetch) told of each read in order, a metadata hit counted per read, the block
    marked recently used; a block evicted meanwhile ends the loan, and the next repeat
    finds it by lookup, never the loan's bytes."""
    small, other = f"/{seeded}/small.bin", f"/{seeded}/other.bin"
    async with serve(tmp_path, proxy, seeded) as served:
        await _warm(served, small)
        hits = served.app[HIT_PATH]
        reader = hits._reader
        async with connected(served) as connection:  # the other object, filled
            await connection.ask(served.request(other))
        deadline = time.monotonic() + 30
        while len(reader.blocks.memory) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the fill lands a moment after the client's bytes
        told: list[tuple[str, str]] = []
        reader.observers.append(lambda bucket, key: told.append((bucket, key)))
        spy = Spy(hits)
        requests = {target: _ask_for(served, target) for target in (small, other)}
        order = [other, small, small, other, other, small]
        head_hits = ("hoard_metadata_lookups_total", {"kind": "head", "state": "hit",
                                                      "mount": reader.mount_label(seeded)})  # fmt: skip
        async with connected(served) as connection:
            for target in (small, other):  # the hit path's answers, kept by the lane
                await connection.ask(requests[target])
            told.clear()
            before = served.sample(head_hits[0], **head_hits[1])
            for target in order:
                answer = await connection.ask(requests[target])
                assert answer.body == (SMALL if target == small else b"other object")
            assert served.sample(head_hits[0], **head_hits[1]) - before == len(order)
            assert told == [(seeded, target.rsplit("/", 1)[1]) for target in order]
            assert spy.lane_answers == len(order)
            memory = reader.blocks.memory
            newest = list(memory._items)[-1]
            assert newest.key == "small.bin"  # the last read, renewed at the turn's end
            # Evicted: the loan ends; the repeat is found by lookup (here: on disk, or
            # refilled), and its bytes are the object's.
            memory.clear()
            answer = await connection.ask(requests[small])
            assert answer.body == SMALL
