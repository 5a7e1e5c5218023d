"""The raw forwarder against real servers: moto for S3 behaviour, a tiny aiohttp app
for what moto cannot show (signatures, headers on the wire, failures, memory)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import boto3
import pytest
from aiohttp import ClientPayloadError, web
from botocore.config import Config as BotoConfig

from gateway.config.settings import S3OriginConfig
from gateway.core.errors import OriginUnavailable
from gateway.origins.s3 import S3Origin
from gateway.origins.s3_forward import (
    ForwardRequest,
    ForwardResponse,
    S3Forwarder,
    origin_url,
)
from gateway.s3.sigv4 import RequestView, SigV4Verifier
from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET

MiB = 1024 * 1024
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
TRICKY_KEYS = [
    "dir/with space.bin",
    "ünïcödé/数据 файл.bin",
    "a+b=c&d;e,f.bin",
    "100%/literal%20and~tilde.bin",
]


def s3_config(endpoint: str | None, **overrides: object) -> S3OriginConfig:
    return S3OriginConfig(
        type="s3", endpoint=endpoint, access_key=ORIGIN_KEY, secret_key=ORIGIN_SECRET,
        **overrides,
    )  # fmt: skip


@pytest.fixture
async def origin(moto_endpoint: str) -> AsyncIterator[S3Origin]:
    # Through S3Origin.forward, as the S3 front will call it.
    origin = S3Origin("moto", s3_config(moto_endpoint))
    yield origin
    await origin.close()


async def pieces(data: bytes, size: int = MiB) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


async def call(
    origin: S3Origin | S3Forwarder,
    method: str,
    bucket: str,
    key: str | None = None,
    query: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> Answer:
    request = ForwardRequest(
        method=method,
        bucket=bucket,
        key=key,
        query=query or [],
        headers=headers or {},
        body=None if body is None else pieces(body),
        content_length=None if body is None else len(body),
    )
    response = await origin.forward(request)
    return await collect(response)


async def collect(response: ForwardResponse) -> Answer:
    async with response:
        data = b"".join([chunk async for chunk in response.body])
    headers = {name.lower(): value for name, value in response.headers}
    return Answer(response.status, headers, data)


def content_md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


def xml_text(body: bytes, tag: str) -> list[str]:
    """Texts of every ``tag`` element; S3 answers name a namespace, its errors do not."""
    root = ET.fromstring(body)
    return [e.text or "" for e in root.iter() if e.tag in (tag, NS + tag)]


# --- objects through moto -------------------------------------------------------------


@pytest.mark.parametrize("key", TRICKY_KEYS)
async def test_put_object_streams_a_body_byte_exact(
    origin: S3Origin, bucket: str, origin_client, key: str
) -> None:
    data = (uuid.uuid4().bytes * (5 * MiB // 16))[: 5 * MiB]
    headers = {"Content-Type": "application/x-test", "x-amz-meta-owner": "trainer"}
    answer = await call(origin, "PUT", bucket, key, headers=headers, body=data)
    assert answer.status == 200, answer.body
    assert answer.headers["etag"] == f'"{hashlib.md5(data).hexdigest()}"'
    stored = origin_client.get_object(Bucket=bucket, Key=key)
    assert stored["Body"].read() == data
    assert stored["ContentType"] == "application/x-test"
    assert stored["Metadata"] == {"owner": "trainer"}


async def test_put_without_content_type_stores_the_origins_default(
    origin: S3Origin, bucket: str, origin_client
) -> None:
    # aiohttp would add application/octet-stream to a streamed body; S3 stores what it gets.
    answer = await call(origin, "PUT", bucket, "plain", body=b"x")
    assert answer.status == 200
    assert origin_client.head_object(Bucket=bucket, Key="plain")["ContentType"] == (
        "binary/octet-stream"
    )


async def test_head_keeps_content_length_and_has_no_body(
    origin: S3Origin, bucket: str, origin_client
) -> None:
    origin_client.put_object(Bucket=bucket, Key="k", Body=b"12345")
    answer = await call(origin, "HEAD", bucket, "k")
    assert (answer.status, answer.headers["content-length"], answer.body) == (200, "5", b"")


async def test_object_tagging(origin: S3Origin, bucket: str, origin_client) -> None:
    origin_client.put_object(Bucket=bucket, Key="tagged", Body=b"x")
    tagging = (
        b'<Tagging xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><TagSet>'
        b"<Tag><Key>team</Key><Value>vision</Value></Tag>"
        b"<Tag><Key>stage</Key><Value>raw data</Value></Tag>"
        b"</TagSet></Tagging>"
    )
    headers = {"Content-Type": "application/xml", "Content-MD5": content_md5(tagging)}
    put = await call(origin, "PUT", bucket, "tagged", [("tagging", "")], headers, tagging)
    assert put.status == 200, put.body
    got = await call(origin, "GET", bucket, "tagged", [("tagging", "")])
    assert got.status == 200
    assert dict(zip(xml_text(got.body, "Key"), xml_text(got.body, "Value"), strict=True)) == {
        "team": "vision",
        "stage": "raw data",
    }
    assert origin_client.get_object_tagging(Bucket=bucket, Key="tagged")["TagSet"] == [
        {"Key": "team", "Value": "vision"},
        {"Key": "stage", "Value": "raw data"},
    ]


async def test_multipart_upload_streams_parts_and_returns_the_origins_etag(
    origin: S3Origin, bucket: str, origin_client
) -> None:
    key = "checkpoints/step 100+.pt"
    created = await call(origin, "POST", bucket, key, [("uploads", "")])
    assert created.status == 200, created.body
    [upload_id] = xml_text(created.body, "UploadId")
    parts = [bytes([n]) * (5 * MiB) for n in (1, 2)]
    etags = []
    for number, part in enumerate(parts, start=1):
        query = [("partNumber", str(number)), ("uploadId", upload_id)]
        answer = await call(origin, "PUT", bucket, key, query, body=part)
        assert answer.status == 200, answer.body
        etags.append(answer.headers["etag"])
    listed = await call(origin, "GET", bucket, None, [("uploads", "")])
    assert upload_id in xml_text(listed.body, "UploadId")
    complete = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
        for n, etag in enumerate(etags, start=1)
    )
    body = f"<CompleteMultipartUpload>{complete}</CompleteMultipartUpload>".encode()
    done = await call(origin, "POST", bucket, key, [("uploadId", upload_id)], body=body)
    assert done.status == 200, done.body
    stored = origin_client.get_object(Bucket=bucket, Key=key)
    assert stored["Body"].read() == b"".join(parts)
    assert xml_text(done.body, "ETag") == [stored["ETag"]]


async def test_abort_and_list_multipart_uploads(
    origin: S3Origin, bucket: str, origin_client
) -> None:
    upload_id = origin_client.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    listed = await call(origin, "GET", bucket, None, [("uploads", ""), ("prefix", "k")])
    assert listed.status == 200
    assert xml_text(listed.body, "UploadId") == [upload_id]
    aborted = await call(origin, "DELETE", bucket, "k", [("uploadId", upload_id)])
    assert aborted.status == 204, aborted.body
    assert "Uploads" not in origin_client.list_multipart_uploads(Bucket=bucket)


async def test_copy_object_passes_the_copy_source(
    origin: S3Origin, bucket: str, origin_client
) -> None:
    origin_client.put_object(Bucket=bucket, Key="src key+ü", Body=b"copied bytes")
    source = f"/{bucket}/src%20key%2B%C3%BC"  # the header is URL-encoded, as clients send it
    answer = await call(origin, "PUT", bucket, "dst", headers={"x-amz-copy-source": source})
    assert answer.status == 200, answer.body
    assert xml_text(answer.body, "ETag")
    assert origin_client.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"copied bytes"


async def test_delete_object(origin: S3Origin, bucket: str, origin_client) -> None:
    origin_client.put_object(Bucket=bucket, Key="doomed", Body=b"x")
    answer = await call(origin, "DELETE", bucket, "doomed")
    assert answer.status == 204
    assert "Contents" not in origin_client.list_objects_v2(Bucket=bucket)


async def test_delete_objects_with_content_md5(
    origin: S3Origin, bucket: str, origin_client
) -> None:
    keys = ["a", "b c", "d+e"]
    for key in keys:
        origin_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    objects = "".join(f"<Object><Key>{key}</Key></Object>" for key in keys)
    body = f"<Delete><Quiet>false</Quiet>{objects}</Delete>".encode()
    headers = {"Content-MD5": content_md5(body), "Content-Type": "application/xml"}
    answer = await call(origin, "POST", bucket, None, [("delete", "")], headers, body)
    assert answer.status == 200, answer.body
    assert sorted(xml_text(answer.body, "Key")) == sorted(keys)
    assert "Contents" not in origin_client.list_objects_v2(Bucket=bucket)


async def test_versioning_and_list_object_versions(
    origin: S3Origin, bucket: str, origin_client
) -> None:
    body = (
        b'<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Status>Enabled</Status></VersioningConfiguration>"
    )
    headers = {"Content-MD5": content_md5(body)}
    answer = await call(origin, "PUT", bucket, None, [("versioning", "")], headers, body)
    assert answer.status == 200, answer.body
    first = await call(origin, "PUT", bucket, "v", body=b"one")
    await call(origin, "PUT", bucket, "v", body=b"two")
    versions = await call(origin, "GET", bucket, None, [("versions", ""), ("prefix", "v")])
    assert versions.status == 200
    assert len(xml_text(versions.body, "VersionId")) == 2
    version = first.headers["x-amz-version-id"]
    old = await call(origin, "GET", bucket, "v", [("versionId", version)])
    assert (old.status, old.body) == (200, b"one")


async def test_list_buckets_is_service_level(origin: S3Origin, bucket: str) -> None:
    answer = await call(origin, "GET", "")
    assert answer.status == 200
    assert bucket in xml_text(answer.body, "Name")


async def test_an_s3_error_is_a_response_not_an_exception(origin: S3Origin, bucket: str) -> None:
    answer = await call(origin, "GET", bucket, "missing")
    assert answer.status == 404
    assert xml_text(answer.body, "Code") == ["NoSuchKey"]
    missing = await call(origin, "GET", f"nobucket-{uuid.uuid4().hex[:8]}", None)
    assert missing.status == 404
    assert xml_text(missing.body, "Code") == ["NoSuchBucket"]


class ClientWentAway(Exception):
    pass


async def broken_body() -> AsyncIterator[bytes]:
    yield b"x" * MiB
    raise ClientWentAway


async def test_a_failing_body_is_reraised_as_it_is(origin: S3Origin, bucket: str) -> None:
    request = ForwardRequest("PUT", bucket, "half", [], {}, broken_body(), 4 * MiB)
    with pytest.raises(ClientWentAway):
        await origin.forward(request)


async def test_origin_unreachable_is_origin_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connection refused
        forwarder = S3Forwarder(s3_config(f"http://127.0.0.1:{port}", max_attempts=2))
        try:
            with pytest.raises(OriginUnavailable):
                await call(forwarder, "GET", "bucket", "key")
            with pytest.raises(OriginUnavailable):
                await call(forwarder, "PUT", "bucket", "key", body=b"data")
        finally:
            await forwarder.close()


# --- URLs as botocore builds them -----------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "style"),
    [
        ("http://127.0.0.1:9000", "auto"),
        ("http://localhost:9000", "auto"),
        ("http://localhost:9000", "virtual"),
        ("https://minio.example.com", "virtual"),
        ("https://s3.example.com/prefix", "path"),
        (None, "auto"),
        (None, "path"),
    ],
)
@pytest.mark.parametrize("bucket", ["mybucket", "my.bucket"])
@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_origin_url_matches_botocore(
    endpoint: str | None, style: str, bucket: str, key: str
) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        config=BotoConfig(s3={"addressing_style": style}),
    )
    params = {"Bucket": bucket, "Key": key}
    expected = client.generate_presigned_url("get_object", Params=params).split("?")[0]
    url, host = origin_url(s3_config(endpoint, addressing_style=style), bucket, key)
    assert url == expected
    assert host == re.sub(r"^https?://([^/]+).*$", r"\1", expected)


def test_origin_url_encodes_the_query_the_sigv4_way() -> None:
    config = s3_config(None, region="eu-west-1")
    query = [("uploads", ""), ("prefix", "a b/+ü"), ("versionId", "x=y")]
    url, _ = origin_url(config, "bkt", None, query)
    assert url == (
        "https://bkt.s3.eu-west-1.amazonaws.com/?uploads&prefix=a%20b%2F%2B%C3%BC&versionId=x%3Dy"
    )


# --- on the wire: a fake origin -------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    raw_path: str
    headers: dict[str, str]
    body_size: int
    body_complete: bool  # False: the connection went before Content-Length was reached
    signature_ok: bool


@dataclass
class FakeOrigin:
    """Records every request, checks its SigV4 signature, answers with ``reply``."""

    reply: Handler | None = None
    seen: list[Seen] = field(default_factory=list)
    on_chunk: Callable[[], None] = lambda: None
    verifier: SigV4Verifier = field(
        default_factory=lambda: SigV4Verifier({ORIGIN_KEY: ORIGIN_SECRET})
    )
    recorded: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        size, complete = 0, True
        try:
            async for chunk in request.content.iter_any():  # read and dropped: never held
                size += len(chunk)
                self.on_chunk()
        except (ClientPayloadError, ConnectionError):  # the sender went mid-body
            complete = False
        raw_path, _, raw_query = request.raw_path.partition("?")
        try:
            self.verifier.verify(RequestView(request.method, raw_path, raw_query, request.headers))
            ok = True
        except Exception:
            ok = False
        headers = dict(request.headers)
        self.seen.append(Seen(request.method, request.raw_path, headers, size, complete, ok))
        self.recorded.set()
        if self.reply is not None:
            return await self.reply(request)
        return web.Response(status=200, headers={"ETag": '"fake"'})


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeOrigin, S3Forwarder]]:
    fake = FakeOrigin()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    forwarder = S3Forwarder(s3_config(f"http://127.0.0.1:{port}", max_attempts=3))
    yield fake, forwarder
    await forwarder.close()
    await runner.cleanup()


@pytest.mark.parametrize("key", TRICKY_KEYS)
async def test_the_origin_gets_the_forwarders_own_valid_signature(
    fake: tuple[FakeOrigin, S3Forwarder], key: str
) -> None:
    origin, forwarder = fake
    client_headers = {"x-amz-meta-note": "hello  world", "Content-Type": "text/plain"}
    query = [("tagging", ""), ("versionId", "a+b/c=d")]
    answer = await call(forwarder, "PUT", "bkt", key, query, client_headers, b"payload")
    assert answer.status == 200
    [seen] = origin.seen
    assert seen.signature_ok, seen
    assert f"Credential={ORIGIN_KEY}/" in seen.headers["Authorization"]
    assert seen.headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
    assert seen.raw_path == f"/bkt/{quote(key, safe='/~')}?tagging&versionId=a%2Bb%2Fc%3Dd"
    assert seen.headers["Content-Length"] == "7"
    assert "Transfer-Encoding" not in seen.headers


async def test_client_auth_and_hop_by_hop_headers_are_not_passed_on(
    fake: tuple[FakeOrigin, S3Forwarder],
) -> None:
    origin, forwarder = fake
    client_headers = {
        "Authorization": "AWS4-HMAC-SHA256 Credential=client-key/20240101/us-east-1/s3/...",
        "X-Amz-Date": "20000101T000000Z",
        "X-Amz-Content-SHA256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "connection": "keep-alive, X-Private",
        "X-Private": "hop",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Expect": "100-continue",
        "Content-Length": "999",
        "x-amz-acl": "private",
    }
    answer = await call(forwarder, "GET", "bkt", "k", headers=client_headers)
    assert answer.status == 200
    [seen] = origin.seen
    assert seen.signature_ok
    sent = {name.lower(): value for name, value in seen.headers.items()}
    assert "client-key" not in sent["authorization"]
    assert sent["x-amz-date"] != "20000101T000000Z"
    assert sent["x-amz-acl"] == "private"
    for name in ("x-private", "keep-alive", "te", "expect", "accept-encoding", "content-type"):
        assert name not in sent, name
    assert sent.get("content-length", "0") == "0"


async def test_response_headers_status_and_body_are_the_origins(
    fake: tuple[FakeOrigin, S3Forwarder],
) -> None:
    origin, forwarder = fake
    error = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchKey</Code>'
        b"<Message>The specified key does not exist.</Message><Key>k</Key></Error>"
    )

    async def not_found(request: web.Request) -> web.Response:
        headers = {
            "Content-Type": "application/xml",
            "x-amz-request-id": "R1",
            "Connection": "X-Hop",
            "X-Hop": "1",
            "Content-Encoding": "gzip",  # a lie, kept as it is: nothing is decompressed
        }
        return web.Response(status=404, body=error, headers=headers)

    origin.reply = not_found
    answer = await call(forwarder, "GET", "bkt", "k")
    assert (answer.status, answer.body) == (404, error)
    assert answer.headers["x-amz-request-id"] == "R1"
    assert answer.headers["content-length"] == str(len(error))
    assert answer.headers["content-encoding"] == "gzip"
    assert "x-hop" not in answer.headers
    assert "connection" not in answer.headers
    assert len(origin.seen) == 1  # a 404 is an answer: never retried


async def test_redirects_are_handed_back(fake: tuple[FakeOrigin, S3Forwarder]) -> None:
    origin, forwarder = fake

    async def moved(request: web.Request) -> web.Response:
        return web.Response(status=301, headers={"Location": "http://elsewhere.invalid/"})

    origin.reply = moved
    answer = await call(forwarder, "GET", "bkt", "k")
    assert answer.status == 301
    assert answer.headers["location"] == "http://elsewhere.invalid/"


@pytest.mark.parametrize("status", [500, 503])
async def test_an_answer_is_never_retried(
    fake: tuple[FakeOrigin, S3Forwarder], status: int
) -> None:
    # The client's SDK retries 5xx and SlowDown under its own policy; a gateway that
    # retried them too would multiply the tries (a GET ?acl answered 500: 5 tries, 1-2 s).
    origin, forwarder = fake

    async def failing(request: web.Request) -> web.Response:
        return web.Response(status=status, body=b"<Error><Code>InternalError</Code></Error>")

    origin.reply = failing
    answer = await call(forwarder, "GET", "bkt", "k", query=[("acl", "")])
    assert (answer.status, len(origin.seen)) == (status, 1)


async def test_a_safe_request_without_an_answer_is_tried_again(
    fake: tuple[FakeOrigin, S3Forwarder],
) -> None:
    origin, forwarder = fake

    async def cut_twice(request: web.Request) -> web.StreamResponse:
        if len(origin.seen) < 3:
            assert request.transport is not None
            request.transport.abort()  # no answer at all: the connection drops
        return web.Response(status=200, body=b"at last")

    origin.reply = cut_twice
    answer = await call(forwarder, "GET", "bkt", "k")
    assert (answer.status, answer.body, len(origin.seen)) == (200, b"at last", 3)
    assert all(seen.signature_ok for seen in origin.seen)
    origin.seen.clear()
    with pytest.raises(OriginUnavailable):  # POST is not safe: one try, no answer, an error
        await call(forwarder, "POST", "bkt", "k", query=[("uploads", "")])
    assert len(origin.seen) == 1


async def test_streamed_bodies_are_sent_once(fake: tuple[FakeOrigin, S3Forwarder]) -> None:
    origin, forwarder = fake

    async def slow_down(request: web.Request) -> web.Response:
        return web.Response(status=503, body=b"<Error><Code>SlowDown</Code></Error>")

    origin.reply = slow_down
    answer = await call(forwarder, "PUT", "bkt", "k", body=b"cannot replay")
    assert (answer.status, len(origin.seen)) == (503, 1)


async def test_a_failing_body_leaves_the_origin_a_short_body(
    fake: tuple[FakeOrigin, S3Forwarder],
) -> None:
    # The connection goes before Content-Length is reached: S3 stores nothing.
    origin, forwarder = fake
    request = ForwardRequest("PUT", "bkt", "half", [], {}, broken_body(), 4 * MiB)
    with pytest.raises(ClientWentAway):
        await forwarder.forward(request)
    async with asyncio.timeout(10):
        await origin.recorded.wait()
    [seen] = origin.seen
    assert (seen.body_complete, seen.headers["Content-Length"]) == (False, str(4 * MiB))
    assert seen.body_size < 4 * MiB


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_request_body_is_streamed_not_held(fake: tuple[FakeOrigin, S3Forwarder]) -> None:
    origin, forwarder = fake
    peak = [_rss()]
    baseline = peak[0]
    origin.on_chunk = lambda: peak.append(max(peak.pop(), _rss()))
    piece = b"\x5a" * MiB  # one buffer, yielded 64 times: only a copy could grow memory

    async def body() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield piece

    request = ForwardRequest("PUT", "bkt", "big", [], {}, body(), 64 * MiB)
    answer = await collect(await forwarder.forward(request))
    assert answer.status == 200
    assert origin.seen[0].body_size == 64 * MiB
    assert peak[0] - baseline < 24 * MiB, f"RSS grew by {(peak[0] - baseline) / MiB:.1f} MiB"


async def test_response_body_can_be_abandoned(fake: tuple[FakeOrigin, S3Forwarder]) -> None:
    origin, forwarder = fake

    async def large(request: web.Request) -> web.Response:
        return web.Response(status=200, body=b"y" * (8 * MiB))

    origin.reply = large
    request = ForwardRequest("GET", "bkt", "k", [], {}, None, None)
    response = await forwarder.forward(request)
    first = await anext(response.body)
    assert 0 < len(first) <= MiB
    await response.aclose()
    # The connection with unread bytes was dropped; the next request still works.
    origin.reply = None
    assert (await call(forwarder, "GET", "bkt", "k")).status == 200
