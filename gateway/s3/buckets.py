"""ListBuckets, HeadBucket and GetBucketLocation."""

from __future__ import annotations

from aiohttp import web

from gateway.s3 import xml
from gateway.s3.call import Call

XML_TYPE = "application/xml"


async def list_buckets(call: Call) -> web.StreamResponse:
    buckets = [b for b in await call.reader.list_buckets() if call.principal.may_use(b.name)]
    return web.Response(body=xml.list_buckets(buckets), content_type=XML_TYPE)


async def head_bucket(call: Call) -> web.StreamResponse:
    region = await call.reader.bucket_region(call.bucket)
    # S3 types even this empty answer as XML; clients parse nothing from it.
    return web.Response(headers={"x-amz-bucket-region": region}, content_type=XML_TYPE)


async def get_bucket_location(call: Call) -> web.StreamResponse:
    region = await call.reader.bucket_region(call.bucket)
    return web.Response(body=xml.location(region), content_type=XML_TYPE)
