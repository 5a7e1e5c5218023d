"""GetObject and HeadObject.

What is answered is decided here (status, headers, conditionals, ranges,
``response-*`` overrides); how the bytes are obtained is one call into
``Reader.open_object``. Bytes are written as they arrive; a client that goes
away mid-body closes the read, which releases the origin stream.
"""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.core import errors
from gateway.obs import request_keys as keys
from gateway.origins.base import ObjectInfo
from gateway.pieces import CLIENT_GONE, FileSegment
from gateway.read.object_read import ObjectRead
from gateway.s3 import object_checksums, xml
from gateway.s3.call import Call
from gateway.s3.conditionals import Conditions
from gateway.s3.errors import Code, S3Error
from gateway.s3.ranges import parse_range

log = logging.getLogger(__name__)

# Query parameters that override response headers on GetObject/HeadObject.
OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


def object_headers(info: ObjectInfo, checksums: bool = False) -> dict[str, str]:
    """The headers S3 sends for an object on GET and HEAD (not the length/range):
    every header the origin sent about it but its checksums, which are S3's for the
    whole object when ``checksums`` (``object_checksums.py``), else none."""
    headers = {
        "ETag": info.etag,
        "Last-Modified": xml.http_date(info.last_modified),
        "Content-Type": info.content_type,
        "Accept-Ranges": "bytes",
    }
    headers.update(
        (name, value)
        for name, value in info.headers.items()
        if not object_checksums.is_checksum_header(name)
    )
    if checksums:
        headers.update(object_checksums.served(info.headers, info.etag))
    headers.update({f"x-amz-meta-{name}": value for name, value in info.metadata.items()})
    if info.storage_class != "STANDARD":
        headers["x-amz-storage-class"] = info.storage_class
    if info.version_id:
        headers["x-amz-version-id"] = info.version_id
    return headers


def _wants_checksums(call: Call, partial: bool) -> bool:
    """S3 sends an object's checksums when asked with ``x-amz-checksum-mode: ENABLED``,
    and never for a range: they describe the whole object (as MinIO, matching S3)."""
    mode = call.request.headers.get("x-amz-checksum-mode", "")
    return not partial and mode.upper() == "ENABLED"


def _overrides(call: Call) -> dict[str, str]:
    found = {
        header: call.query[param] for param, header in OVERRIDES.items() if param in call.query
    }
    if found and call.principal.anonymous:
        raise S3Error(
            Code.InvalidRequest,
            "Request specific response headers cannot be used for anonymous GET requests.",
        )
    for param, header in OVERRIDES.items():
        if header in found and not _header_safe(found[header]):
            # A CR or LF would split the answer's headers (aiohttp refuses it mid-answer
            # and drops the connection); NUL and other controls have no place there either.
            raise S3Error(
                Code.InvalidArgument,
                f"{param} must not hold control characters.",
                fields={"ArgumentName": param},
            )
    return found


def _header_safe(value: str) -> bool:
    return value.isprintable() or all(c == "\t" or c.isprintable() for c in value)


def _range_headers(read_start: int, read_end: int, size: int) -> dict[str, str]:
    return {"Content-Range": f"bytes {read_start}-{read_end}/{size}"}


async def head_object(call: Call) -> web.StreamResponse:
    overrides = _overrides(call)
    conditions = Conditions.from_headers(call.request.headers)
    info = await call.reader.head_object(call.bucket, call.key)
    conditions.check(info)
    status, length, ranged = 200, info.size, {}
    spec = parse_range(call.request.headers.get("Range"))
    if spec is not None and spec.applies(info.size):
        start, end = spec.resolve(info.size)
        ranged = _range_headers(start, end, info.size)
        status, length = 206, end - start + 1
    headers = object_headers(info, _wants_checksums(call, status == 206))
    headers.update(ranged)
    headers.update(overrides)
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = length
    return response


async def get_object(call: Call) -> web.StreamResponse:
    overrides = _overrides(call)
    conditions = Conditions.from_headers(call.request.headers)
    spec = parse_range(call.request.headers.get("Range"))
    read = await call.reader.open_object(
        call.bucket, call.key, spec, conditions.check if conditions else None,
        may_warm=call.may_warm,
    )  # fmt: skip
    try:
        # The first bytes are fetched before the headers go out, so a cold block
        # that cannot be fetched is still an S3 error rather than a cut connection.
        await read.prime()
        headers = object_headers(read.info, _wants_checksums(call, read.partial))
        if read.partial:
            headers.update(_range_headers(read.start, read.end, read.info.size))
        headers.update(overrides)
        response = _HeldHeaders(status=206 if read.partial else 200, headers=headers)
        response.content_length = read.length
        await _stream(call, response, read)
    finally:
        call.request[keys.SOURCE] = "+".join(sorted(read.sources)) or "-"
        call.request[keys.SERVED] = read.sources
        await read.aclose()
    return response


async def _stream(call: Call, response: web.StreamResponse, read: ObjectRead) -> None:
    """Send the body; a body that cannot be finished is cut, and says so.

    A cut response leaves ``request[keys.CUT]`` (its reason) and ``request[keys.SENT]``
    (the body bytes handed to the socket) for the access log and the metrics:
    it is not a clean 200 with its full length.
    """
    sent = 0
    try:
        writer = await response.prepare(call.request)
        assert writer is not None
        async for piece in read.chunks():
            if isinstance(piece, FileSegment):
                count = piece.count
                _send_held_headers(writer)  # sendfile goes around the writer's buffer
            else:
                count = len(piece)
            await call.body.send(call.request, writer, piece)
            sent += count
        await response.write_eof()
    except Exception as exc:
        cut_short(call, exc, sent, read.length)


class _HeldHeaders(web.StreamResponse):
    """A response whose headers wait for the first bytes of the body.

    aiohttp (3.11 and later) writes a ``StreamResponse``'s headers on their own
    at ``prepare``; held, they leave with the body's first piece, so a small
    object's answer is one send, not two (a syscall here and a read fewer for
    the client, on every cold small object). ``web.Response`` does the same;
    without the attribute (older aiohttp) the headers go out at ``prepare`` as before.
    """

    _send_headers_immediately = False


def _send_held_headers(writer: object) -> None:
    """Put held headers on the wire now: what follows is sent around the writer."""
    send_headers = getattr(writer, "send_headers", None)
    if send_headers is not None:
        send_headers()


def cut_reason(exc: BaseException) -> str:
    """The bounded label of why a body was cut (``hoard_responses_cut_total{reason}``)."""
    if isinstance(exc, CLIENT_GONE):
        return "client_gone"
    if isinstance(exc, errors.OriginChanged):
        return "origin_changed"
    if isinstance(exc, errors.OriginUnavailable):
        return "origin_unavailable"
    return "error"


def cut_short(call: Call, exc: Exception, sent: int, length: int | None) -> None:
    """End an answer whose headers are gone after ``sent`` of ``length`` body bytes.

    Dropping the connection is the only honest signal left, so the client sees
    a short body rather than a wrong one; a client that left is its own doing
    (a debug line), anything else a warning.
    """
    reason = cut_reason(exc)
    if reason == "client_gone":
        log.debug("client went away mid-body, request %s", call.request_id)
    else:
        log.warning("response cut after %d of %s bytes, request %s: %s (%s)",
                    sent, length, call.request_id, reason, exc,
                    exc_info=reason == "error")  # fmt: skip
    call.request[keys.CUT] = reason
    call.request[keys.SENT] = sent
    _drop_connection(call)


def _drop_connection(call: Call) -> None:
    if call.request.transport is not None:
        call.request.transport.abort()
