"""A presigned URL whose verdict the hit path remembers is refused on the wire as the
general path refuses it: after it expired, after its key was removed by a reload, and
with any one byte of its query changed.

The wire answers a hit of a presigned URL from the remembered verdict
(``auth.PresignedMemo``), with no HMAC. Each test first has the URL answered
as a hit (so the verdict is remembered), then replays it changed in time,
credentials or bytes, and compares the answer with the one the same server
gives the same request once nothing is remembered (the memo emptied by a
reload of the same credentials): status and body alike, bar the request id.
"""

from __future__ import annotations

import asyncio
import re
import time

from multidict import CIMultiDict
from pydantic import SecretStr

from gateway.app.server import HIT_PATH
from gateway.config.settings import Credential
from gateway.s3.auth import Authenticator
from gateway.s3.sigv4 import RequestView
from tests.harness import ACCESS_KEY, SECRET_KEY
from tests.rawhttp import presign
from tests.test_hit_wire import SMALL, Served, _warm, read_answer, seeded, serve

__all__ = ["seeded"]  # the fixture, used by name

CREDENTIALS = [Credential(access_key=ACCESS_KEY, secret_key=SecretStr(SECRET_KEY))]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _clocked(served: Served) -> tuple[Authenticator, Clock]:
    """The server's authenticator swapped for one on a clock the test moves."""
    clock = Clock()
    auth = Authenticator(CREDENTIALS, allow_anonymous=False, clock=clock)
    served.app[HIT_PATH]._front._auth = auth

    return auth, clock


def _wire(served: Served, target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: {served.host}\r\n\r\n".encode()


def _plain(answer_bytes: tuple[int, bytes]) -> tuple[int, bytes]:
    status, body = answer_bytes
    return status, re.sub(rb"<(RequestId|HostId)>[^<]*</\1>", b"", body)


async def _ask(served: Served, target: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        writer.write(_wire(served, target))
        answer = await read_answer(reader)
        return answer.status, answer.body
    finally:
        writer.close()


async def _remembered(served: Served, auth: Authenticator, target: str) -> None:
    """``target`` answered as a hit twice: its verdict is remembered."""
    hits = served.hits()
    for _ in range(2):
        assert await _ask(served, target) == (200, SMALL)
    assert served.hits() == hits + 2
    assert auth._presigned.get(auth._presigned.key(_view(served, target))) is not None


def _view(served: Served, target: str) -> RequestView:
    path, _, query = target.partition("?")
    return RequestView("GET", path, query, CIMultiDict({"Host": served.host}))


async def _fresh(served: Served, auth: Authenticator, target: str) -> tuple[int, bytes]:
    """What the server answers ``target`` with nothing remembered."""
    auth.reload(CREDENTIALS, False)
    return await _ask(served, target)


async def test_an_expired_remembered_url_is_refused_as_without_the_memo(
    tmp_path, proxy, seeded
) -> None:
    async with serve(tmp_path, proxy, seeded) as served:
        auth, clock = _clocked(served)
        target = presign("GET", served.host, f"/{seeded}/small.bin", expires=60)
        await _warm(served, f"/{seeded}/small.bin")
        await _remembered(served, auth, target)
        clock.now += 61
        refused = await _ask(served, target)
        assert refused[0] == 403 and b"Request has expired" in refused[1]
        assert _plain(refused) == _plain(await _fresh(served, auth, target))


async def test_a_remembered_url_of_a_removed_key_is_refused_as_without_the_memo(
    tmp_path, proxy, seeded
) -> None:
    async with serve(tmp_path, proxy, seeded) as served:
        auth, _ = _clocked(served)
        target = presign("GET", served.host, f"/{seeded}/small.bin", expires=600)
        await _warm(served, f"/{seeded}/small.bin")
        await _remembered(served, auth, target)
        other = [Credential(access_key="other-key", secret_key=SecretStr("other-secret"))]
        auth.reload(other, False)  # what a SIGHUP does with a config without the key
        refused = await _ask(served, target)
        assert refused[0] == 403 and b"<Code>InvalidAccessKeyId</Code>" in refused[1]
        auth.reload(other, False)  # nothing remembered
        assert _plain(refused) == _plain(await _ask(served, target))


async def test_a_remembered_url_with_any_query_byte_changed_is_refused_as_without_the_memo(
    tmp_path, proxy, seeded
) -> None:
    async with serve(tmp_path, proxy, seeded) as served:
        auth, _ = _clocked(served)
        target = presign("GET", served.host, f"/{seeded}/small.bin", expires=600)
        await _warm(served, f"/{seeded}/small.bin")
        await _remembered(served, auth, target)
        path, _, query = target.partition("?")
        for i, byte in enumerate(query):
            # A digit for a letter: never the same byte in another case (S3 reads the
            # signature's hex in either case; so does Hoard, memo or not).
            changed = f"{path}?{query[:i]}{'1' if byte == '0' else '0'}{query[i + 1 :]}"
            answered = await _ask(served, changed)
            assert answered[0] != 200, f"byte {i} of the query changed, still served"
            await _remembered(served, auth, target)  # the original stays remembered
            assert _plain(answered) == _plain(await _fresh(served, auth, changed)), i
            await _remembered(served, auth, target)


async def test_a_remembered_url_with_an_unsigned_amz_header_or_a_second_signature_is_refused(
    tmp_path, proxy, seeded
) -> None:
    """Every ``x-amz-*`` header must be signed: a remembered URL does not spare a request
    that adds one (nor one that adds an ``Authorization`` too) the check."""
    async with serve(tmp_path, proxy, seeded) as served:
        auth, _ = _clocked(served)
        target = presign("GET", served.host, f"/{seeded}/small.bin", expires=600)
        await _warm(served, f"/{seeded}/small.bin")
        for extra in ("x-amz-request-payer: requester", "Authorization: AWS4-HMAC-SHA256 x"):
            await _remembered(served, auth, target)
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            raw = f"GET {target} HTTP/1.1\r\nHost: {served.host}\r\n{extra}\r\n\r\n".encode()
            writer.write(raw)
            refused = await read_answer(reader)
            writer.close()
            assert refused.status in (400, 403), extra
            auth.reload(CREDENTIALS, False)  # nothing remembered
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(raw)
            fresh = await read_answer(reader)
            writer.close()
            assert _plain((refused.status, refused.body)) == _plain((fresh.status, fresh.body))
