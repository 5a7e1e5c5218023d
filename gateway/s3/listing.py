"""ListObjectsV2 and ListObjects (v1).

Continuation tokens are Hoard's own: the marker to continue after, encoded
opaquely. That makes every page reproducible from the marker alone, whether
the origin or a cached listing answers it.

A page is rendered by a closure the reader calls only when it has no body
for it yet: from a cached whole listing, one rendering serves every request
asking the same thing of the same snapshot. The *variant* passed along names
every parameter the body echoes beyond the page itself.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from aiohttp import web

from gateway.origins.base import ListPage
from gateway.s3 import xml
from gateway.s3.call import Call
from gateway.s3.errors import Code, S3Error
from gateway.s3.numbers import query_integer
from gateway.s3.xml import XML_TYPE

MAX_KEYS_LIMIT = 1000


def encode_token(marker: str) -> str:
    return base64.urlsafe_b64encode(marker.encode()).decode()


def decode_token(token: str) -> str:
    try:
        return base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise S3Error(
            Code.InvalidArgument, "The continuation token provided is incorrect"
        ) from None


def _max_keys(call: Call) -> int:
    return query_integer(call.query, "max-keys", MAX_KEYS_LIMIT)


def url_encoding_requested(query: Mapping[str, str]) -> bool:
    """``encoding-type=url`` asked for; InvalidArgument for any other encoding."""
    encoding = query.get("encoding-type")
    if encoding is None:
        return False
    if encoding.lower() != "url":
        raise S3Error(Code.InvalidArgument, "Invalid Encoding Method specified in Request")
    return True


async def list_objects_v2(call: Call) -> web.StreamResponse:
    max_keys = _max_keys(call)
    prefix = call.query.get("prefix", "")
    delimiter = call.query.get("delimiter", "")
    start_after = call.query.get("start-after", "")
    token = call.query.get("continuation-token")
    if token is not None and not token:
        raise S3Error(Code.InvalidArgument, "The continuation token provided is incorrect")
    marker = decode_token(token) if token is not None else start_after
    encode = url_encoding_requested(call.query)
    fetch_owner = call.query.get("fetch-owner", "").lower() == "true"

    def render(page: ListPage) -> bytes:
        next_token = (
            encode_token(page.next_marker) if page.is_truncated and page.next_marker else None
        )
        return xml.list_objects_v2(
            call.bucket,
            page,
            prefix=prefix,
            delimiter=delimiter,
            max_keys=max_keys,
            start_after=start_after,
            continuation_token=token,
            next_token=next_token,
            encode=encode,
            fetch_owner=fetch_owner,
        )

    query = (prefix, delimiter, marker, min(max_keys, MAX_KEYS_LIMIT))
    variant = ("v2", max_keys, start_after, token, encode, fetch_owner)
    body = await call.reader.list_objects_body(call.bucket, query, render, variant, call.may_warm)
    return web.Response(body=body, content_type=XML_TYPE)


async def list_objects_v1(call: Call) -> web.StreamResponse:
    max_keys = _max_keys(call)
    prefix = call.query.get("prefix", "")
    delimiter = call.query.get("delimiter", "")
    marker = call.query.get("marker", "")
    encode = url_encoding_requested(call.query)

    def render(page: ListPage) -> bytes:
        return xml.list_objects_v1(
            call.bucket,
            page,
            prefix=prefix,
            delimiter=delimiter,
            max_keys=max_keys,
            marker=marker,
            encode=encode,
        )

    query = (prefix, delimiter, marker, min(max_keys, MAX_KEYS_LIMIT))
    variant = ("v1", max_keys, encode)
    body = await call.reader.list_objects_body(call.bucket, query, render, variant, call.may_warm)
    return web.Response(body=body, content_type=XML_TYPE)
