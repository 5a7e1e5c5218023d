"""The ``BundleObjects`` operation: a checked request in, a streaming TAR out.

Order of things: options from the headers (a bad one refused before the body
is read), the body read whole under its 5 MiB limit and verified against the
signed payload hash (``RequestBody``, as every body), the keys checked. In
fail mode every key is then looked up as a read would (the held ones at the
head of the list opened there and then, ``ahead.held_first``; a cold key's
lookup, ``Reader.block_refs``, is the GET of its first block, which fills
it, so the stream that follows reads it from the cache), and a missing one
is a 404 ``BundleKeyNotFound`` listing them all, before any byte; the count
and bytes are then known, and go out as leading ``x-tigris-bundle-*``
headers. So is the archive's length (``tar.archive_length``): a client that
asks for it (``X-Hoard-Bundle-Framing: length``, see ``request``) gets it as
the Content-Length, and the body goes out unframed through ``LengthSink``.
Each member must then be the size its lookup found (an object that changed
since, larger or smaller, is a cut before its header), and the bytes sent
must add up to the length announced, or the answer is cut.

Then the 200 goes out, chunked (unless its length was asked for), and each
key in request order: its TAR header, its bytes, its padding. A key that
could not be opened (missing, refused, its origin down) is left out and
listed, at the end, in a ``__bundle_errors.json`` entry (skip mode; written
only when something was skipped). Once an object's header is out, its bytes
must all follow: a failure mid-object (the origin gone for good, the object
changed) cuts the connection (``objects.cut_short``: the log line and
``hoard_responses_cut_total``), as a GET's body is cut, so no client ever
reads an entry with wrong bytes or a wrong length; without the last chunk
(or short of the Content-Length) the client's HTTP layer reports the cut. In
fail mode a key found missing mid-stream (deleted since the check) is such a
failure too.

A chunked answer ends with the ``x-tigris-bundle-count``, ``-bytes`` and
``-skipped`` trailers Tigris documents (announced in a ``Trailer`` header):
the members sent, their object bytes and the keys skipped, known only at the
end. aiohttp writes no trailers, so the last chunk and the trailer section are
written here (``_end_with_trailers``). Fail mode also sends the three counts as
leading headers, where they are known first: the one client of the dialect
(``tigris-boto3-ext``, over urllib3) reads those, and discards trailers unread.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from gateway.core import errors
from gateway.obs import request_keys as keys
from gateway.pieces import FileSegment
from gateway.read.object_read import ObjectRead
from gateway.s3.bundle import request as bundle_request
from gateway.s3.bundle import tar
from gateway.s3.bundle.ahead import MAX_AHEAD, Ahead, Held, Skipped, close, held_first
from gateway.s3.bundle.sink import GzipSink, LengthSink, Sink
from gateway.s3.call import Call
from gateway.s3.chunked import RequestBody, read_whole
from gateway.s3.errors import Code, S3Error
from gateway.s3.objects import cut_short

T = TypeVar("T")
ERRORS_ENTRY = "__bundle_errors.json"
_TYPES = {"none": "application/x-tar", "gzip": "application/gzip"}


class _Broken(Exception):
    """An object whose bytes could not all be sent after its header was."""


async def bundle_objects(call: Call) -> web.StreamResponse:
    options = bundle_request.options(call.request.headers)
    declared = call.request.content_length
    if declared is not None and declared > bundle_request.MAX_BODY:
        raise bundle_request.too_large()
    body = RequestBody(call.body_source(), call.request.headers, call.principal.context)
    try:
        raw = await read_whole(body, bundle_request.MAX_BODY)
    except S3Error as exc:
        raise (bundle_request.too_large() if exc.code is Code.MalformedXML else exc) from None
    wanted = bundle_request.parse_keys(raw)
    call.request[keys.OBJECTS] = len(wanted)
    headers = {"Content-Type": _TYPES[options.compression]}
    sizes, first = None, []
    if options.on_error == "fail":
        first = held_first(call.reader, call.bucket, wanted)
        sizes = await _released_unless(_all_present(call, wanted, first), first)
        headers.update(_totals(wanted, sizes))
    length, sink_type = _framing(options, wanted, sizes)
    if length is None:
        headers["Trailer"] = ", ".join(TRAILERS)
    response = web.StreamResponse(status=200, headers=headers)
    if length is None:
        response.enable_chunked_encoding()
    else:
        response.content_length = length
    writer = await _released_unless(response.prepare(call.request), first)
    assert writer is not None
    sink = sink_type(call.request, writer, call.body)
    ahead = Ahead(call.reader, call.bucket, wanted, call.may_warm, sink.flush, first)
    await _stream(call, response, writer, sink, ahead, sizes, length)
    return response


async def _released_unless(step: Awaitable[T], first: list[Held]) -> T:
    """``step``'s result; if it raises, the held answers ``first`` are released first."""
    try:
        return await step
    except BaseException:
        for held in first:
            await close(held)
        raise


def _framing(options: bundle_request.Options, wanted: list[str],
             sizes: dict[str, int] | None) -> tuple[int | None, type[Sink]]:  # fmt: skip
    """The answer's Content-Length (None: chunked) and the sink that writes its body."""
    if sizes is not None and options.compression == "none" and options.framing == "length":
        return tar.archive_length((key, sizes[key]) for key in wanted), LengthSink
    return None, GzipSink if options.compression == "gzip" else Sink


async def _all_present(call: Call, wanted: list[str], first: list[Held]) -> dict[str, int]:
    """Fail mode: 404 ``BundleKeyNotFound`` unless every key is there; else their sizes.

    The keys of ``first`` were opened already (held whole: ``held_first``); a key whose
    metadata this worker holds is known there and then, without a task (a warm batch
    is a loop); only the others are looked up as reads, ``MAX_AHEAD`` at once (a lookup
    holds no bytes: a cold one fills the cache; the origin guard's limits apply
    underneath)."""
    sizes: dict[str, int | None] = {
        key: held.info.size for key, held in zip(wanted[: len(first)], first, strict=True)
    }
    for key in wanted[len(first) :]:
        if key not in sizes:
            sizes[key] = call.reader.size_now(call.bucket, key)
    unknown = [key for key, size in sizes.items() if size is None]
    if unknown:
        slots = asyncio.Semaphore(MAX_AHEAD)

        async def size_of(key: str) -> int | None:
            async with slots:
                try:
                    refs = await call.reader.block_refs(call.bucket, key)
                except errors.NoSuchKey:
                    return None
            return sum(ref.length for ref in refs)

        sizes.update(zip(unknown, await asyncio.gather(*map(size_of, unknown)), strict=True))
    missing = [key for key, size in sizes.items() if size is None]
    if missing:
        raise S3Error(Code.BundleKeyNotFound, fields={"MissingKeys": missing})
    return {key: size for key, size in sizes.items() if size is not None}


TRAILERS = ("x-tigris-bundle-count", "x-tigris-bundle-bytes", "x-tigris-bundle-skipped")


def _totals(wanted: list[str], sizes: dict[str, int]) -> dict[str, str]:
    totals = (len(wanted), sum(sizes[key] for key in wanted), 0)
    return {name: str(value) for name, value in zip(TRAILERS, totals, strict=True)}


async def _stream(call: Call, response: web.StreamResponse, writer: AbstractStreamWriter,
                  sink: Sink, ahead: Ahead, sizes: dict[str, int] | None,
                  length: int | None) -> None:  # fmt: skip
    """The archive, in ``ahead``'s order; ``sizes``: fail mode's (each member must match
    its lookup), ``length``: the Content-Length sent (the bytes sent must add up to it)."""
    served: Counter[str] = Counter()
    skipped: list[dict[str, str]] = []
    count = size = 0
    try:
        async for key, opened in ahead:
            if isinstance(opened, Skipped):
                if sizes is not None:
                    raise _Broken(f"{key!r} is gone since it was checked: {opened.reason}")
                skipped.append({"key": key, "reason": opened.reason})
                continue
            expected = None if sizes is None else sizes[key]
            size += await _entry(sink, key, opened, served, expected)
            count += 1
        if skipped:
            data = json.dumps({"skipped": skipped}).encode()
            await sink.write(tar.member(ERRORS_ENTRY, len(data), 0) + data + tar.padding(len(data)))
        await sink.write(tar.END)
        await sink.finish()
        if length is not None and sink.sent != length:
            raise _Broken(f"{sink.sent} bytes sent of the {length} announced")
        if length is None:
            await _end_with_trailers(call, writer, (count, size, len(skipped)))
        await response.write_eof()
    except Exception as exc:
        cut_short(call, exc, sink.sent, None)
    finally:
        await ahead.aclose()
        call.request[keys.SENT] = sink.sent
        call.request[keys.SERVED] = served
        call.request[keys.SOURCE] = "+".join(sorted(t for t, n in served.items() if n)) or "-"
        call.reader.metrics.bundle(count, len(skipped), size)


async def _end_with_trailers(
    call: Call, writer: AbstractStreamWriter, totals: tuple[int, int, int]
) -> None:
    """The chunked answer's last chunk and its trailer section (RFC 9112 §7.1.2): the
    members sent, their object bytes, the keys skipped. Written on the transport after
    every chunk (the sink is finished), then the writer is told the body is framed, so
    ``write_eof`` ends the answer without a last chunk of its own."""
    transport = call.request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went before the archive's end")
    fields = "".join(f"{name}: {value}\r\n" for name, value in zip(TRAILERS, totals, strict=True))
    transport.write(f"0\r\n{fields}\r\n".encode())
    writer.chunked = False  # type: ignore[attr-defined]  # aiohttp 3.14's StreamWriter
    await writer.drain()


async def _entry(sink: Sink, key: str, opened: Held | ObjectRead, served: Counter[str],
                 expected: int | None) -> int:  # fmt: skip
    """One object's member: header, bytes (all of them, or ``_Broken``), padding.
    ``expected``: the size fail mode's lookup found (and announced); another is a cut."""
    try:
        length = opened.info.size if isinstance(opened, Held) else opened.length
        if expected is not None and length != expected:
            raise errors.OriginChanged(f"{key!r} is {length} bytes, {expected} when looked up")
        if isinstance(opened, Held):
            await sink.write(tar.member(key, length, _mtime(opened)))
            piece, opened.piece = opened.piece, b""  # the sink releases a segment it sends
            await sink.piece(piece)
            served[opened.tier] += length
        else:
            await sink.write(tar.member(key, length, _mtime(opened)))
            done = 0
            async for piece in opened.chunks():  # an origin failure here cuts the answer
                done += piece.count if isinstance(piece, FileSegment) else len(piece)
                await sink.piece(piece)
            if done != length:
                raise _Broken(f"{key!r} ended after {done} of {length} bytes")
            served.update(opened.sources)
        await sink.write(tar.padding(length))
        return length
    finally:
        await close(opened)


def _mtime(opened: Held | ObjectRead) -> int:
    return int(opened.info.last_modified.timestamp())
