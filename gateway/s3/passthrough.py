"""Every S3 operation Hoard does not answer itself: forwarded through the writer.

What is decided here is only the wire: which client headers travel on (never
the client's signature, never aws-chunked framing), how a request body is
decoded and verified (``RequestBody``: aws-chunked, chunk signatures,
trailer and header checksums, Content-MD5, signed payload hashes) before a
byte reaches the origin, and that the origin's answer — status, headers, body
— is streamed back unchanged. A body that fails verification raises midway,
the forwarder cuts the origin request short, and nothing is stored.

A bucket whose origin takes no raw forwarding (a posix directory) is answered
by ``writes.py`` instead, for the operations it knows; any other is
NotImplemented.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.s3 import cors, writes, xml_writes
from gateway.s3.call import Call
from gateway.s3.checksums import of_the_body
from gateway.s3.chunked import RequestBody, read_whole
from gateway.s3.errors import Code, S3Error
from gateway.s3.numbers import natural
from gateway.s3.objects import cut_short

# Client headers that describe the client's own request to Hoard, not the object.
_NOT_FORWARDED = frozenset({
    "authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token", "host",
    "content-length", "x-amz-decoded-content-length", "expect", "transfer-encoding",
    "connection", "keep-alive", "te", "trailer", "upgrade", "content-encoding", "x-amz-trailer",
})  # fmt: skip
# Origin answer headers aiohttp sets itself on our response.
_NOT_RETURNED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive",
                           "date", "server"})  # fmt: skip
_MUTATING = frozenset({"PUT", "POST", "DELETE"})
_SSE_CUSTOMER = "x-amz-server-side-encryption-customer-"


def _has_body(request: web.Request) -> bool:
    return request.body_exists or "chunked" in request.headers.get("Transfer-Encoding", "").lower()


async def passthrough(call: Call) -> web.StreamResponse:
    if not call.writer.forwards(call.route.bucket):
        handler = writes.handler_for(call)
        if handler is None:
            raise S3Error(Code.NotImplemented, "This operation is not supported by a posix origin.")
        return await handler(call)
    request = call.request
    if "partNumber" in call.query:
        writes.part_number(call.query)  # S3's own check: an origin may not make it
    if request.method == "OPTIONS":
        headers, query = cors.preflight_headers(request.headers), []
    else:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        query = [(k, v) for k, v in call.query.items()]
    body, length, touched = None, None, None
    if _has_body(request):
        declared = of_the_body(request.headers, call.route.operation)
        decoded = RequestBody(call.body_source(), declared, call.principal.context)
        if decoded.content_encoding:
            headers["Content-Encoding"] = decoded.content_encoding
        body, length = await _verified_before_last_byte(decoded), decoded.length
        if call.route.operation in ("DeleteObjects", "CompleteMultipartUpload"):
            raw = await read_whole(body)
            touched = _checked_xml(call.route.operation, raw)
            body, length = _once(raw), len(raw)
    elif request.method in ("PUT", "POST") and request.headers.get("Content-Encoding"):
        headers["Content-Encoding"] = request.headers["Content-Encoding"]
    answer = await call.writer.forward(
        method=request.method,
        bucket=call.route.bucket,
        key=call.route.key,
        query=query,
        headers=headers,
        body=body,
        content_length=length
        if body is not None
        else (0 if request.method in ("PUT", "POST") else None),
        mutating=request.method in _MUTATING,
        touched_keys=touched,
        write_through=body is not None and _stores_whole_object(call),
    )
    try:
        response = web.StreamResponse(status=answer.status)
        for name, value in answer.headers:
            if name.lower() not in _NOT_RETURNED:
                response.headers.add(name, value)
        declared = next((v for n, v in answer.headers if n.lower() == "content-length"), None)
        if declared is not None and natural(declared) is not None:
            response.content_length = int(declared)
        await response.prepare(request)
        await _relay(call, response, answer.body, response.content_length)
    finally:
        await answer.aclose()
    return response


async def _relay(
    call: Call, response: web.StreamResponse, body: AsyncIterator[bytes], length: int | None
) -> None:
    """The origin's body to the client; cut short, as a GetObject's, when either end fails
    midway (a client that stops reading and hangs up is its own doing, not a 500)."""
    sent = 0
    try:
        async for chunk in body:
            await response.write(chunk)
            sent += len(chunk)
        await response.write_eof()
    except Exception as exc:
        cut_short(call, exc, sent, length)


def _stores_whole_object(call: Call) -> bool:
    """A PutObject of a body (no sub-resource, no copy): what the origin stores is the body.

    Not with an SSE-C key: the origin serves such an object only to a caller
    who sends the key, so its bytes must not be served from the cache.
    """
    headers = call.request.headers
    return (
        call.route.operation == "PutObject"
        and not writes.has_subresource(call.query)
        and "x-amz-copy-source" not in headers
        and not any(name.lower().startswith(_SSE_CUSTOMER) for name in headers)
    )


async def _verified_before_last_byte(pieces: RequestBody) -> AsyncIterator[bytes]:
    """The body, with its last piece held back until the whole body has verified.

    A checksum or signature is only known good at the end. Holding the last
    piece means the origin never receives every declared byte of a bad body,
    so it stores nothing; pulling the first piece before returning means a
    body that is wrong from its first chunk never opens an origin request.
    """
    source = aiter(pieces)
    first = await anext(source, None)

    async def held() -> AsyncIterator[bytes]:
        if first is None:
            return
        previous = first
        async for piece in source:
            yield previous
            previous = piece
        yield previous  # the source has ended: every check has passed

    return held()


async def _once(data: bytes):
    yield data


def _checked_xml(operation: str, body: bytes) -> list[str] | None:
    """Parse an XML body as S3 does before forwarding it; the keys a DeleteObjects touches.

    The origin is not trusted to refuse what S3 refuses: a DTD or entity bomb, a
    part number that is not a number. Each is MalformedXML here, before any byte
    is forwarded (some S3-compatible stores answered them with a 500).
    """
    if not xml_writes.in_native_encoding(body):
        # NOTE: Hoard's own handlers read Shift_JIS, GBK, Big5, UTF-7...; an origin is
        # not trusted to (moto answers them with a 500), and the body is forwarded as
        # signed, so it cannot be re-encoded: refused as S3 refuses what it cannot read.
        raise S3Error(Code.MalformedXML)
    if operation == "DeleteObjects":
        return [key for key, _ in xml_writes.parse_delete(body).objects]
    xml_writes.parse_complete(body)
    return None
