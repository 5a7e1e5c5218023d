"""aws-chunked request bodies, decoded as they stream in, and the payload of a PUT.

Since boto3 1.36 a plain ``put_object`` over HTTPS sends its body framed in aws-chunked
with a CRC32 trailer; over HTTP it signs the payload and sends the checksum as a header.
Which framing a body uses is said by ``x-amz-content-sha256`` (``Content-Encoding:
aws-chunked`` is informative, and some SDKs omit it)::

    STREAMING-UNSIGNED-PAYLOAD-TRAILER           size CRLF data CRLF ... 0 CRLF trailers CRLF
    STREAMING-AWS4-HMAC-SHA256-PAYLOAD           size;chunk-signature=sig CRLF data CRLF ...
    STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER   the same, then trailers + x-amz-trailer-signature

Each chunk signature signs the chunk's SHA-256 and the signature before it, starting
from the request's seed signature, so chunks cannot be dropped, swapped or replayed
from another request. The trailer signature signs the canonical trailer lines
(``name:value\\n``, sorted) chained from the final chunk's signature (AWS docs,
"Signature calculations for trailing headers": the tests reproduce both published
examples, trailer signature included).

``ChunkedDecoder`` is a small state machine over any async source of bytes: it holds at
most one header line (bounded) plus the source's current piece, and yields payload in
pieces of at most ``MAX_PIECE`` bytes. Every check that needs the end of a chunk or of
the body raises *from the iterator*, after the bytes before it were yielded. A consumer
must therefore treat the payload as provisional until iteration finishes, and abort
(never commit) what it wrote if it raises. ``RequestBody`` puts decoder and
``checksums.BodyVerifier`` together for the writer.

Errors follow S3 (and OpenStack Swift's s3api, which mirrors it): broken framing and a
body that ends early are ``IncompleteBody`` "The request body terminated unexpectedly";
a decoded length that disagrees with ``x-amz-decoded-content-length`` is
``IncompleteBody`` with NumberBytesExpected/NumberBytesProvided; a bad chunk or trailer
signature is ``SignatureDoesNotMatch``; missing or unexpected trailers are
``MalformedTrailerError`` (``InvalidRequest`` until errors.py has that code); bytes after
the end of the body are ``InvalidRequest``.

NOT supported: SigV4a (``STREAMING-AWS4-ECDSA-P256-SHA256-*``, answered NotImplemented);
S3's minimum chunk size of 8 KiB (not enforced: every conforming body passes, and a
few non-conforming ones too); aws-chunked bodies announced only by Content-Encoding
while ``x-amz-content-sha256`` says otherwise (they are treated as plain bodies).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping

from aiohttp.http_exceptions import PayloadEncodingError

from gateway.s3.checksums import (
    MALFORMED_TRAILER,
    MALFORMED_TRAILER_MESSAGE,
    BodyVerifier,
    parse_expected,
)
from gateway.s3.errors import Code, S3Error
from gateway.s3.sigv4 import AuthContext

UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
MODES = frozenset({UNSIGNED_TRAILER, SIGNED, SIGNED_TRAILER})
_ECDSA = frozenset(
    {"STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD", "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER"}
)
TRAILER_SIGNATURE = "x-amz-trailer-signature"
EMPTY_SHA256 = hashlib.sha256().hexdigest()

MAX_PIECE = 1 << 20  # largest piece of payload handed on at once
_MAX_LINE = 4096  # a chunk header or trailer line is ~100 bytes; this is not one
_HEX_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,19}")

Source = AsyncIterable[bytes]  # an aiohttp StreamReader is accepted too (see _pieces)


def streaming_mode(payload_hash: str | None) -> str | None:
    """The aws-chunked mode an ``x-amz-content-sha256`` value selects; None for a plain body."""
    if payload_hash in MODES:
        return payload_hash
    if payload_hash in _ECDSA:
        raise S3Error(Code.NotImplemented, f"{payload_hash} (SigV4a) payloads are not supported.")
    return None


def decoded_length(headers: Mapping[str, str]) -> int:
    """``x-amz-decoded-content-length``, which every aws-chunked body must carry."""
    value = headers.get("x-amz-decoded-content-length", "").strip()
    if value.startswith("-") and _DIGITS.fullmatch(value[1:]):
        fields = {"ArgumentName": "x-amz-decoded-content-length", "ArgumentValue": value}
        raise S3Error(Code.InvalidArgument, fields=fields)
    if not _DIGITS.fullmatch(value):
        raise S3Error(Code.MissingContentLength)
    return int(value)


def stored_content_encoding(header: str | None, *, streaming: bool = True) -> str | None:
    """The Content-Encoding to store: the client's, less the transport's ``aws-chunked``.

    S3 drops the token only from streaming uploads (a plain PUT keeps what it says), and
    stores no header at all when nothing else is left.
    """
    if header is None or not streaming:
        return header
    codings = [c.strip() for c in header.split(",") if c.strip()]
    kept = [c for c in codings if c.lower() != "aws-chunked"]
    if len(kept) == len(codings):
        return header
    return ",".join(kept) or None


class ChunkedDecoder:
    """Decodes one aws-chunked body; iterate it once for the payload, then read ``trailers``."""

    def __init__(
        self,
        source: Source,
        mode: str,
        auth: AuthContext | None,
        decoded_length: int | None,
        trailer_names: Iterable[str] = (),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"not an aws-chunked mode: {mode!r}")
        signed = mode != UNSIGNED_TRAILER
        if signed and auth is None:
            # Anonymous, or SigV2: nothing to chain chunk signatures from.
            raise S3Error(Code.AccessDenied, "Signed chunks need a SigV4-signed request.")
        self._reader = _Reader(source)
        self._chain = _Chain(auth) if signed and auth is not None else None
        self._declared = decoded_length
        expected = {name.strip().lower() for name in trailer_names}
        if mode == SIGNED_TRAILER:
            expected.add(TRAILER_SIGNATURE)
        self._expected_trailers = frozenset(expected)
        self.trailers: dict[str, str] = {}  # lowercased names, the signature included
        self.decoded = 0  # payload bytes yielded so far
        self._started = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._started:
            raise RuntimeError("an aws-chunked body can be decoded only once")
        self._started = True
        return self._decode()

    async def _decode(self) -> AsyncIterator[bytes]:
        while True:
            size, signature = await self._chunk_header()
            if size == 0:
                break
            async for piece in self._chunk_data(size, signature):
                yield piece
        if self._chain is not None:
            self._chain.check_chunk(EMPTY_SHA256, signature)
        await self._read_trailers()
        await self._check_end()

    async def _chunk_header(self) -> tuple[int, str]:
        line = await self._reader.line(_MAX_LINE)
        if line is None:  # the body ended where a chunk should start: no final chunk
            raise _incomplete()
        size_text, _, extension = line.partition(b";")
        if not _HEX_SIZE.fullmatch(size_text):
            raise _incomplete()
        size = int(size_text, 16)
        if self._declared is not None and self.decoded + size > self._declared:
            # Refuse before reading it: the payload is longer than the client declared.
            raise _length_mismatch(self._declared, self.decoded + size)
        return size, _chunk_signature(extension) if self._chain is not None else ""

    async def _chunk_data(self, size: int, signature: str) -> AsyncIterator[bytes]:
        digest = hashlib.sha256() if self._chain is not None else None
        left = size
        while left:
            piece = await self._reader.read(min(left, MAX_PIECE))
            if not piece:
                raise _incomplete()
            left -= len(piece)
            self.decoded += len(piece)
            if digest is not None:
                digest.update(piece)
            yield piece
        if self._chain is not None and digest is not None:
            self._chain.check_chunk(digest.hexdigest(), signature)
        if await self._reader.line(0) != b"":  # the CRLF that closes the chunk's data
            raise _incomplete()

    async def _read_trailers(self) -> None:
        """Trailer lines up to the empty line; the end of the body also ends them."""
        while (line := await self._reader.line(_MAX_LINE)) is not None and line:
            name, colon, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            # Only expected names, each once: so at most two lines are ever read.
            if not colon or name not in self._expected_trailers or name in self.trailers:
                raise S3Error(MALFORMED_TRAILER, MALFORMED_TRAILER_MESSAGE)
            self.trailers[name] = value.strip()
        if self._expected_trailers - self.trailers.keys():
            raise S3Error(MALFORMED_TRAILER, MALFORMED_TRAILER_MESSAGE)
        if self._chain is not None and TRAILER_SIGNATURE in self.trailers:
            signed = sorted((n, v) for n, v in self.trailers.items() if n != TRAILER_SIGNATURE)
            canonical = "".join(f"{n}:{v}\n" for n, v in signed).encode("latin-1")
            self._chain.check_trailer(canonical, self.trailers[TRAILER_SIGNATURE])

    async def _check_end(self) -> None:
        if self._declared is not None and self.decoded != self._declared:
            raise _length_mismatch(self._declared, self.decoded)
        if not await self._reader.at_end():
            raise S3Error(Code.InvalidRequest, "The request body continues after its final chunk.")


class RequestBody:
    """The payload of a PUT or UploadPart: decoded if aws-chunked, verified, streamed.

    Construct it before reading the body (it raises ``S3Error`` for malformed
    declarations), iterate it once, and only then use ``checksums``: iteration raises
    ``S3Error`` on any mismatch, after the bytes before it were yielded.
    """

    def __init__(
        self,
        source: Source,
        headers: Mapping[str, str],
        auth: AuthContext | None,
        *,
        also: Iterable[str] = (),
    ) -> None:
        payload_hash = auth.payload_hash if auth else headers.get("x-amz-content-sha256")
        self.mode = streaming_mode(payload_hash)
        self.expected = parse_expected(headers, payload_hash)
        streaming = self.mode is not None
        self.content_encoding = stored_content_encoding(
            headers.get("Content-Encoding"), streaming=streaming
        )
        self.length = decoded_length(headers) if streaming else _content_length(headers)
        self._source = source
        self._auth = auth
        self._verifier = BodyVerifier(self.expected, also)
        self.checksums: dict[str, str] = {}  # algorithm name -> base64, once verified

    async def __aiter__(self) -> AsyncIterator[bytes]:
        trailers: dict[str, str] = {}
        if self.mode is not None:
            decoder = ChunkedDecoder(
                self._source, self.mode, self._auth, self.length, self.expected.trailer_names
            )
            pieces: AsyncIterator[bytes] = aiter(decoder)
            trailers = decoder.trailers  # filled in by the time the pieces run out
        else:
            pieces = _plain(self._source, self.length)
        try:
            async for piece in pieces:
                self._verifier.update(piece)
                yield piece
        except (ConnectionError, PayloadEncodingError):
            # The client went away or broke the HTTP framing mid-body: an incomplete
            # body, not an internal error.
            raise _incomplete() from None
        self.checksums = self._verifier.finish(trailers)


XML_BODY_LIMIT = 4 * 1024 * 1024  # a Complete of 10,000 parts is about 1 MiB


async def read_whole(body: AsyncIterable[bytes], limit: int = XML_BODY_LIMIT) -> bytes:
    """A small (XML) request body, verified and read whole; MalformedXML past ``limit``."""
    pieces, size = [], 0
    async for piece in body:
        size += len(piece)
        if size > limit:
            raise S3Error(Code.MalformedXML, "The XML body is too large.")
        pieces.append(bytes(piece))
    return b"".join(pieces)


# --- the signature chain ---------------------------------------------------------------


class _Chain:
    """The running signature of a signed aws-chunked body, from the seed signature on."""

    def __init__(self, auth: AuthContext) -> None:
        self._auth = auth
        self._previous = auth.seed_signature

    def check_chunk(self, data_sha256: str, provided: str) -> None:
        a = self._auth
        parts = ("AWS4-HMAC-SHA256-PAYLOAD", a.amz_date, a.scope, self._previous)
        self._check("\n".join((*parts, EMPTY_SHA256, data_sha256)), provided)

    def check_trailer(self, canonical: bytes, provided: str) -> None:
        a = self._auth
        parts = ("AWS4-HMAC-SHA256-TRAILER", a.amz_date, a.scope, self._previous)
        self._check("\n".join((*parts, hashlib.sha256(canonical).hexdigest())), provided)

    def _check(self, to_sign: str, provided: str) -> None:
        expected = hmac.new(self._auth.signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), provided.lower().encode("latin-1")):
            raise S3Error(
                Code.SignatureDoesNotMatch,
                fields={
                    "AWSAccessKeyId": self._auth.access_key,
                    "StringToSign": to_sign,
                    "SignatureProvided": provided,
                    "StringToSignBytes": " ".join(f"{b:02x}" for b in to_sign.encode()),
                },
            )
        self._previous = expected


def _chunk_signature(extension: bytes) -> str:
    """The value of ';chunk-signature=<hex>'; a chunk of a signed body without one is cut short."""
    name, eq, value = extension.decode("latin-1").partition("=")
    if not eq or not value.strip() or ";" in value:
        raise _incomplete()
    # Another extension name: the signature check then fails, as S3's does.
    return value.strip() if name.strip() == "chunk-signature" else ""


# --- reading the source ----------------------------------------------------------------


class _Reader:
    """An async byte source with just the look-ahead the chunk grammar needs.

    Holds the source's current piece and an offset into it; only an unfinished header
    line (at most ``limit`` bytes) is ever joined with the next piece.
    """

    def __init__(self, source: Source) -> None:
        self._pieces = _pieces(source)
        self._buf = b""
        self._pos = 0

    async def line(self, limit: int) -> bytes | None:
        """The next line without its CRLF; None if the body ends cleanly before one."""
        while True:
            end = self._buf.find(b"\r\n", self._pos, self._pos + limit + 2)
            if end >= 0:
                line, self._pos = self._buf[self._pos : end], end + 2
                return line
            if len(self._buf) - self._pos > limit + 1:  # +1: a lone CR may start the CRLF
                raise _incomplete()
            if not await self._more():
                if self._pos == len(self._buf):
                    return None
                raise _incomplete()

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (at least one), or b'' at the end of the body."""
        if self._pos == len(self._buf) and not await self._more():
            return b""
        piece = self._buf[self._pos : self._pos + n]
        self._pos += len(piece)
        return piece

    async def at_end(self) -> bool:
        return self._pos == len(self._buf) and not await self._more()

    async def _more(self) -> bool:
        async for piece in self._pieces:
            if piece:
                rest = self._buf[self._pos :]
                self._buf = rest + bytes(piece) if rest else bytes(piece)
                self._pos = 0
                return True
        return False


class IdleLimited:
    """A request body that must keep arriving: no new bytes for ``seconds`` is S3's
    ``RequestTimeout``, so a client that stalls mid-upload does not hold its handler,
    its origin temp file and its connection for ever (nginx: ``client_body_timeout``)."""

    def __init__(self, source: Source, seconds: float) -> None:
        self._source = source
        self._seconds = seconds

    async def iter_any(self) -> AsyncIterator[bytes]:
        pieces = _pieces(self._source)
        while True:
            try:
                async with asyncio.timeout(self._seconds):
                    piece = await anext(pieces, None)
            except TimeoutError:
                raise S3Error(Code.RequestTimeout) from None
            if piece is None:
                return
            yield piece


def _pieces(source: Source) -> AsyncIterator[bytes]:
    iter_any = getattr(source, "iter_any", None)  # aiohttp StreamReader: whatever has arrived
    return aiter(iter_any() if iter_any is not None else source)


async def _plain(source: Source, length: int | None) -> AsyncIterator[bytes]:
    """A plain body, in pieces of at most MAX_PIECE; short of Content-Length is an error."""
    received = 0
    async for piece in _pieces(source):
        for start in range(0, len(piece), MAX_PIECE):
            chunk = bytes(piece[start : start + MAX_PIECE])
            received += len(chunk)
            yield chunk
    if length is not None and received != length:
        raise _length_mismatch(length, received)


def _content_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("Content-Length", "").strip()
    return int(value) if _DIGITS.fullmatch(value) else None


def _incomplete() -> S3Error:
    return S3Error(Code.IncompleteBody, "The request body terminated unexpectedly")


def _length_mismatch(expected: int, provided: int) -> S3Error:
    fields = {"NumberBytesExpected": str(expected), "NumberBytesProvided": str(provided)}
    return S3Error(Code.IncompleteBody, fields=fields)
