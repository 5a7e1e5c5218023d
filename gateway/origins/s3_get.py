"""GetObject as one signed aiohttp GET, read straight from its headers.

A cold small object costs Hoard one origin GET, and through aiobotocore that
GET was the largest share of Hoard's own CPU per object (measured with py-spy
on a cold epoch of 4 KiB objects: about half of the event loop's time, in
request building, event hooks, signing and response parsing). The forwarder
(``s3_forward.py``) already knows how to address and sign a request for the
origin with a plain aiohttp session; this module makes a GetObject of it:
``Range`` and ``If-Match`` headers out, an ``ObjectInfo`` from the answer's
headers back, and an S3 error answer turned into the same botocore-shaped
error ``s3.py`` translates for every other call, so a 404, 412, 416 or 503
means exactly what it means there.

Not guaranteed: anything botocore adds to a GetObject beyond signing
(checksum validation is off there too: "when_required"); SSE-C, requester
pays and other request parameters are not sent (Hoard never asks for them).
"""

from __future__ import annotations

import contextlib
from email.utils import parsedate_to_datetime
from typing import Any
from xml.etree import ElementTree

import aiohttp
from botocore.exceptions import ClientError
from multidict import CIMultiDictProxy

_META = "x-amz-meta-"
_ERROR_BODY_MAX = 64 * 1024  # an S3 error document is small; never read more of one


def request_headers(byte_range: tuple[int, int] | None, if_match: str | None) -> dict[str, str]:
    # Checksums too, as every origin GET and HEAD asks (s3.py's _ask_checksums): S3
    # sends them only when asked, and they are kept with the object's other headers.
    headers = {"x-amz-checksum-mode": "ENABLED"}
    if byte_range is not None:
        headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
    if if_match is not None:
        headers["If-Match"] = if_match
    return headers


def response_fields(headers: CIMultiDictProxy[str]) -> dict[str, Any]:
    """The fields of botocore's GetObject answer that ``s3.py`` reads, from raw headers."""
    raw = {name.lower(): value for name, value in headers.items()}
    fields: dict[str, Any] = {
        "ETag": headers.get("ETag", ""),
        "ContentLength": int(headers.get("Content-Length", "0")),
        "ContentType": headers.get("Content-Type"),
        "Metadata": {k[len(_META) :]: v for k, v in raw.items() if k.startswith(_META)},
        "StorageClass": headers.get("x-amz-storage-class"),
        "VersionId": headers.get("x-amz-version-id"),
        "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": raw},
    }
    if "Content-Range" in headers:
        fields["ContentRange"] = headers["Content-Range"]
    modified = headers.get("Last-Modified")
    fields["LastModified"] = parsedate_to_datetime(modified) if modified else None
    return fields


async def error_of(response: aiohttp.ClientResponse) -> ClientError:
    """The error answer as botocore would have raised it (its body read and closed)."""
    try:
        body = await response.content.read(_ERROR_BODY_MAX)
    except aiohttp.ClientError:
        body = b""
    finally:
        response.close()
    error: dict[str, str] = {}
    # An error body in a multi-byte encoding (expat's ValueError) or an unknown one reads
    # as no body, as an unparsable one does: the status still says what happened.
    with contextlib.suppress(ElementTree.ParseError, ValueError, LookupError):
        if body:
            for child in ElementTree.fromstring(body):
                if child.text is not None:
                    error[child.tag] = child.text
    raw = {name.lower(): value for name, value in response.headers.items()}
    answer = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": response.status,
                                                  "HTTPHeaders": raw}}  # fmt: skip
    if "content-range" in raw:
        answer["ContentRange"] = raw["content-range"]
    return ClientError(answer, "GetObject")  # type: ignore[arg-type]


class ResponseBody:
    """An aiohttp answer's body with the calls ``S3ObjectStream`` makes of it."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def read(self, n: int) -> bytes:
        # aiohttp raises ClientPayloadError when the body ends before Content-Length.
        return await self._response.content.read(n)

    def arrived(self) -> bool:
        """Whether the body's end has arrived (what is left is in the buffer)."""
        return self._response.content.is_eof()

    async def aclose(self) -> None:
        # After the end of the body the connection is back in the pool and this is a
        # no-op; before it, the socket is closed rather than pooled with unread bytes.
        self._response.close()
