"""S3Origin against real servers: moto for behaviour, a tiny aiohttp app for failures."""

from __future__ import annotations

import asyncio
import base64
import socket
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import aiohttp
import boto3
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.config.settings import S3OriginConfig
from gateway.core.errors import (
    AccessDenied,
    NoSuchBucket,
    NoSuchKey,
    OriginChanged,
    OriginThrottled,
    OriginUnavailable,
    RangeNotSatisfiable,
)
from gateway.obs.events import OriginGuardMetrics
from gateway.obs.metrics import Metrics
from gateway.origins import s3_get
from gateway.origins.base import ListPage, Origin
from gateway.origins.guard import OriginGuard
from gateway.origins.s3 import CHUNK_SIZE, S3Origin


def s3_config(endpoint: str, **overrides: object) -> S3OriginConfig:
    # moto accepts any credentials; giving them keeps the test off the AWS chain.
    return S3OriginConfig(
        type="s3", endpoint=endpoint, access_key="origin-access", secret_key="origin-secret",
        **overrides,
    )  # fmt: skip


@pytest.fixture
async def origin(moto_endpoint: str) -> AsyncIterator[S3Origin]:
    origin = S3Origin("moto", s3_config(moto_endpoint))
    yield origin
    await origin.close()


async def read_all(stream) -> bytes:
    async with stream:
        return b"".join([chunk async for chunk in stream.chunks()])


def test_is_an_origin(moto_endpoint: str) -> None:
    assert isinstance(S3Origin("moto", s3_config(moto_endpoint)), Origin)


# --- HEAD and GET ----------------------------------------------------------


async def test_head_object_reports_metadata_and_representation_headers(
    origin: S3Origin, origin_client, bucket: str
) -> None:
    origin_client.put_object(
        Bucket=bucket, Key="data/x.json.gz", Body=b"{}" * 50, ContentType="application/json",
        ContentEncoding="gzip", CacheControl="max-age=60", ContentDisposition="inline",
        ContentLanguage="en", Metadata={"Owner": "team-a", "shard": "7"},
    )  # fmt: skip
    expected = origin_client.head_object(Bucket=bucket, Key="data/x.json.gz")

    info = await origin.head_object(bucket, "data/x.json.gz")

    assert info.key == "data/x.json.gz"
    assert info.size == 100
    assert info.etag == expected["ETag"] and info.etag.startswith('"')
    assert info.last_modified == expected["LastModified"]
    assert info.last_modified.tzinfo is not None
    assert info.content_type == "application/json"
    assert info.metadata == {"owner": "team-a", "shard": "7"}
    raw = expected["ResponseMetadata"]["HTTPHeaders"]
    assert info.headers == {
        "Cache-Control": "max-age=60",
        "Content-Disposition": "inline",
        "Content-Encoding": "gzip",
        "Content-Language": "en",
        # boto3 put a CRC32; every HEAD asks for the checksums, kept as sent
        "x-amz-checksum-crc32": base64.b64encode(
            zlib.crc32(b"{}" * 50).to_bytes(4, "big")
        ).decode(),
        "x-amz-sdk-checksum-algorithm": raw["x-amz-sdk-checksum-algorithm"],  # moto's own
    }
    assert info.storage_class == "STANDARD"


async def test_whole_get_matches_head(origin: S3Origin, origin_client, bucket: str) -> None:
    body = bytes(range(256)) * 10
    origin_client.put_object(
        Bucket=bucket, Key="k", Body=body, CacheControl="no-cache", Metadata={"a": "b"}
    )
    head = await origin.head_object(bucket, "k")

    stream = await origin.get_object(bucket, "k")

    assert (stream.start, stream.end) == (0, len(body) - 1)
    assert stream.info == head
    assert await read_all(stream) == body


async def test_empty_object(origin: S3Origin, origin_client, bucket: str) -> None:
    origin_client.put_object(Bucket=bucket, Key="empty", Body=b"")

    stream = await origin.get_object(bucket, "empty")

    assert (stream.info.size, stream.start, stream.end) == (0, 0, -1)
    assert await read_all(stream) == b""


@pytest.mark.parametrize("byte_range", [(0, 0), (999, 999), (100, 611)])
async def test_ranged_get_is_byte_exact_and_reports_full_size(
    origin: S3Origin, origin_client, bucket: str, byte_range: tuple[int, int]
) -> None:
    body = uuid.uuid4().bytes * 62 + b"12345678"  # 1000 bytes
    origin_client.put_object(Bucket=bucket, Key="r", Body=body)
    start, end = byte_range

    stream = await origin.get_object(bucket, "r", byte_range=byte_range)

    assert (stream.info.size, stream.start, stream.end) == (1000, start, end)
    assert await read_all(stream) == body[start : end + 1]


async def test_large_object_streams_in_bounded_chunks(
    origin: S3Origin, origin_client, bucket: str
) -> None:
    body = b"".join(uuid.uuid4().bytes for _ in range(3 * CHUNK_SIZE // 16)) + b"tail"
    origin_client.put_object(Bucket=bucket, Key="big", Body=body)

    async with await origin.get_object(bucket, "big") as stream:
        chunks = [chunk async for chunk in stream.chunks()]

    assert len(chunks) >= 4
    assert max(len(chunk) for chunk in chunks) <= CHUNK_SIZE
    assert b"".join(chunks) == body


async def test_if_match(origin: S3Origin, origin_client, bucket: str) -> None:
    etag = origin_client.put_object(Bucket=bucket, Key="k", Body=b"v1")["ETag"]

    assert await read_all(await origin.get_object(bucket, "k", if_match=etag)) == b"v1"
    with pytest.raises(OriginChanged):
        await origin.get_object(bucket, "k", byte_range=(0, 1), if_match='"0123abcd"')


async def test_unsatisfiable_range_reports_the_size(
    origin: S3Origin, origin_client, bucket: str
) -> None:
    origin_client.put_object(Bucket=bucket, Key="k", Body=b"x" * 10)

    with pytest.raises(RangeNotSatisfiable) as caught:
        await origin.get_object(bucket, "k", byte_range=(20, 30))
    assert caught.value.size == 10


async def test_missing_key(origin: S3Origin, bucket: str) -> None:
    with pytest.raises(NoSuchKey) as caught:
        await origin.head_object(bucket, "nope")
    assert caught.value.key == "nope"
    with pytest.raises(NoSuchKey):
        await origin.get_object(bucket, "nope")


async def test_missing_bucket(origin: S3Origin) -> None:
    missing = f"hoard-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NoSuchBucket):
        await origin.head_bucket(missing)
    with pytest.raises(NoSuchBucket) as caught:
        await origin.get_object(missing, "k")
    assert caught.value.bucket == missing
    with pytest.raises(NoSuchBucket):
        await origin.list_objects(missing)
    with pytest.raises(NoSuchBucket):
        await origin.head_object(missing, "k")


async def test_aclose_mid_stream_leaves_no_tasks_and_origin_keeps_working(
    origin: S3Origin, origin_client, bucket: str
) -> None:
    body = b"".join(uuid.uuid4().bytes for _ in range(4 * CHUNK_SIZE // 16))
    origin_client.put_object(Bucket=bucket, Key="big", Body=body)

    for _ in range(3):  # more than once: an abandoned connection must not be reused
        stream = await origin.get_object(bucket, "big")
        first = await anext(stream.chunks())
        assert body.startswith(first)
        await stream.aclose()
        await stream.aclose()  # idempotent
        await asyncio.sleep(0)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    assert await read_all(await origin.get_object(bucket, "big")) == body
    assert await read_all(await origin.get_object(bucket, "big", byte_range=(5, 9))) == body[5:10]


# --- LIST ------------------------------------------------------------------

TREE = [
    "a/1", "a/2", "a/b/1", "a/b/2", "a/c", "a+b", "a b", "b", "c/1", "c/2", "c/d/1",
    "d", "e/1", "e/2", "f", "g/1", "é/ü", "日本/語", "z",
]  # fmt: skip


async def walk(origin: S3Origin, bucket: str, **kwargs: object) -> list[ListPage]:
    """Every page, following next_marker the way Hoard's listing does."""
    pages, marker = [], ""
    while True:
        page = await origin.list_objects(bucket, start_after=marker, **kwargs)
        pages.append(page)
        if not page.is_truncated:
            return pages
        assert page.next_marker and page.next_marker > marker
        marker = page.next_marker


def boto3_listing(client, bucket: str, **kwargs: object) -> tuple[list[str], list[str]]:
    keys, prefixes = [], []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, **kwargs):
        keys += [item["Key"] for item in page.get("Contents", [])]
        prefixes += [item["Prefix"] for item in page.get("CommonPrefixes", [])]
    return keys, prefixes


@pytest.fixture
def tree(origin_client, bucket: str) -> str:
    for key in TREE:
        origin_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    return bucket


@pytest.mark.parametrize("max_keys", [1, 2, 3, 1000])
@pytest.mark.parametrize(("prefix", "delimiter"), [("", ""), ("", "/"), ("a/", "/"), ("c", "/")])
async def test_paging_by_next_marker_matches_boto3_pagination(
    origin: S3Origin, origin_client, tree: str, prefix: str, delimiter: str, max_keys: int
) -> None:
    pages = await walk(origin, tree, prefix=prefix, delimiter=delimiter, max_keys=max_keys)

    keys = [entry.key for page in pages for entry in page.entries]
    prefixes = [p for page in pages for p in page.common_prefixes]
    kwargs = {"Prefix": prefix} | ({"Delimiter": delimiter} if delimiter else {})
    assert (keys, prefixes) == boto3_listing(origin_client, tree, **kwargs)
    for page in pages:
        names = [e.key for e in page.entries] + page.common_prefixes
        assert 0 < len(names) <= max_keys or (not names and not page.is_truncated)
        assert page.next_marker == (max(names) if names else None)


async def test_page_ending_on_common_prefix_continues_after_it(origin: S3Origin, tree: str) -> None:
    # Code point order: "a b" < "a+b" < "a/" < "b".
    first = await origin.list_objects(tree, delimiter="/", max_keys=3)
    second = await origin.list_objects(tree, delimiter="/", max_keys=1, start_after="a/")

    assert [e.key for e in first.entries] == ["a b", "a+b"]
    assert (first.common_prefixes, first.next_marker, first.is_truncated) == (["a/"], "a/", True)
    assert [e.key for e in second.entries] == ["b"]  # not "a/" again
    assert (second.common_prefixes, second.next_marker, second.is_truncated) == ([], "b", True)


async def test_start_after_and_entry_fields(origin: S3Origin, origin_client, tree: str) -> None:
    page = await origin.list_objects(tree, start_after="c/2", max_keys=4)
    expected = origin_client.list_objects_v2(Bucket=tree, StartAfter="c/2", MaxKeys=4)

    assert [e.key for e in page.entries] == [item["Key"] for item in expected["Contents"]]
    assert page.is_truncated is True
    entry, raw = page.entries[0], expected["Contents"][0]
    assert (entry.size, entry.etag, entry.last_modified) == (
        raw["Size"], raw["ETag"], raw["LastModified"],
    )  # fmt: skip
    assert entry.storage_class == "STANDARD"


async def test_awkward_keys_round_trip_exactly(
    origin: S3Origin, origin_client, bucket: str
) -> None:
    keys = [
        "with space", "plus+sign", "per%cent", "%20literal", "ünï/cödé 日本", "tab\tkey",
        "ctl\x01\x7fkey", "amp&<lt>", "~!'()*", "/leading", "dot/./x",
    ]  # fmt: skip
    # (moto's router cannot take CR or LF in a key, so those stay untested here.)
    for key in keys:
        origin_client.put_object(Bucket=bucket, Key=key, Body=key.encode())

    page = await origin.list_objects(bucket)

    assert sorted(e.key for e in page.entries) == sorted(keys)
    for key in keys:
        assert (await origin.head_object(bucket, key)).size == len(key.encode())
        assert await read_all(await origin.get_object(bucket, key)) == key.encode()
    by_prefix = await origin.list_objects(bucket, prefix="ünï/", delimiter="/")
    assert [e.key for e in by_prefix.entries] == ["ünï/cödé 日本"]


# --- buckets ---------------------------------------------------------------


async def test_list_buckets_head_bucket_and_region(
    origin: S3Origin, moto_endpoint: str, bucket: str
) -> None:
    buckets = {b.name: b.created for b in await origin.list_buckets()}
    assert isinstance(buckets[bucket], datetime) and buckets[bucket].tzinfo is not None

    await origin.head_bucket(bucket)
    assert await origin.bucket_region(bucket) == "us-east-1"

    eu = f"hoard-eu-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3", endpoint_url=moto_endpoint, region_name="eu-central-1",
        aws_access_key_id="origin-access", aws_secret_access_key="origin-secret",
    ).create_bucket(Bucket=eu, CreateBucketConfiguration={"LocationConstraint": "eu-central-1"})  # fmt: skip
    assert await origin.bucket_region(eu) == "eu-central-1"


async def test_client_is_built_once_under_concurrency(origin: S3Origin, bucket: str) -> None:
    await asyncio.gather(*(origin.head_bucket(bucket) for _ in range(10)))
    client = await origin._s3()
    await origin.head_bucket(bucket)
    assert await origin._s3() is client


# --- failures --------------------------------------------------------------


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


async def test_unreachable_origin(closed_port: int) -> None:
    config = s3_config(f"http://127.0.0.1:{closed_port}", max_attempts=2, connect_timeout=1.0)
    origin = S3Origin("down", config)
    try:
        with pytest.raises(OriginUnavailable) as caught:
            await origin.head_object("b", "k")
        assert not isinstance(caught.value, OriginThrottled)
        with pytest.raises(OriginUnavailable):
            await origin.list_objects("b")
    finally:
        await origin.close()


class ErrorServer:
    """An S3 look-alike on a loopback port that answers every request with one error."""

    def __init__(self, status: int, code: str) -> None:
        self.status, self.code, self.requests = status, code, 0

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        xml = (
            f"<Error><Code>{self.code}</Code><Message>no</Message><RequestId>1</RequestId></Error>"
        )
        return web.Response(status=self.status, body=xml.encode(), content_type="application/xml")


@pytest.mark.parametrize(
    ("status", "code", "error", "attempts"),
    [
        (503, "SlowDown", OriginThrottled, 2),
        (500, "InternalError", OriginUnavailable, 2),
        (403, "AccessDenied", AccessDenied, 1),
    ],
)
async def test_error_answers_after_retries(
    status: int, code: str, error: type[Exception], attempts: int
) -> None:
    server = ErrorServer(status, code)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = s3_config(f"http://127.0.0.1:{port}", max_attempts=2)
    origin = S3Origin("flaky", config)
    # botocore makes one try; the retries are the guard's (tests/test_origin_guard.py).
    guarded = OriginGuard(origin, config, OriginGuardMetrics(Metrics(), "flaky"))
    try:
        with pytest.raises(error) as caught:
            await origin.get_object("bucket", "key")
        assert type(caught.value) is error
        assert server.requests == 1
        with pytest.raises(error) as caught:
            await guarded.get_object("bucket", "key")
        assert type(caught.value) is error
        assert server.requests == 1 + attempts
    finally:
        await origin.close()
        await runner.cleanup()


@pytest.mark.parametrize("encoding", ["Shift_JIS", "no-such-codec"])
async def test_an_origin_error_body_in_an_unreadable_encoding_is_no_body(encoding: str) -> None:
    """Before: expat's ValueError (or a LookupError) escaped ``error_of`` as an exception of
    no kind the origin translates; now the status says what happened, as for any body
    that does not parse."""
    body = (f'<?xml version="1.0" encoding="{encoding}"?><Error><Code>AccessDenied</Code>'
            "</Error>").encode("ascii")  # fmt: skip

    async def refuse(_: web.Request) -> web.Response:
        return web.Response(status=403, body=body, content_type="application/xml")

    app = web.Application()
    app.router.add_get("/b/k", refuse)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            answer = await session.get(server.make_url("/b/k"))
            error = await s3_get.error_of(answer)
    finally:
        await server.close()
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error.response["Error"] == {}
