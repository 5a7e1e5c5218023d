"""ListBuckets, HeadBucket and GetBucketLocation.

ListBuckets pages as S3 does (``max-buckets`` 1..10000, ``prefix``,
``continuation-token``); the token is Hoard's own, like ListObjectsV2's: the
last bucket name of the page, encoded, so any page can be asked again.
"""

from __future__ import annotations

from aiohttp import web

from gateway.s3 import xml
from gateway.s3.call import Call
from gateway.s3.errors import Code, S3Error
from gateway.s3.listing import decode_token, encode_token
from gateway.s3.xml import XML_TYPE

MAX_BUCKETS = 10_000  # S3's limit of max-buckets, and of buckets per account


async def list_buckets(call: Call) -> web.StreamResponse:
    prefix = call.query.get("prefix", "")
    limit = _max_buckets(call.query.get("max-buckets"))
    token = call.query.get("continuation-token")
    after = decode_token(token) if token else ""
    buckets = [
        b for b in await call.reader.list_buckets()
        if call.principal.may_use(b.name) and b.name.startswith(prefix) and b.name > after
    ]  # fmt: skip
    buckets.sort(key=lambda bucket: bucket.name)
    page = buckets[:limit]
    next_token = encode_token(page[-1].name) if len(buckets) > limit else None
    echoed = prefix if "prefix" in call.query else None
    return web.Response(body=xml.list_buckets(page, echoed, next_token), content_type=XML_TYPE)


def _max_buckets(raw: str | None) -> int:
    if raw is None:
        return MAX_BUCKETS
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_BUCKETS:
        raise S3Error(
            Code.InvalidArgument, "Argument max-buckets must be an integer between 1 and 10000"
        )
    return int(raw)


async def head_bucket(call: Call) -> web.StreamResponse:
    region = await call.reader.bucket_region(call.bucket)
    # S3 types even this empty answer as XML; clients parse nothing from it.
    return web.Response(headers={"x-amz-bucket-region": region}, content_type=XML_TYPE)


async def get_bucket_location(call: Call) -> web.StreamResponse:
    region = await call.reader.bucket_region(call.bucket)
    return web.Response(body=xml.location(region), content_type=XML_TYPE)
