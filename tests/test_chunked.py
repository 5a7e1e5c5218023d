"""aws-chunked bodies and PUT checksums, decoded from what real clients put on the wire.

(a) boto3 ``put_object`` against a recording server on loopback, over HTTP and HTTPS
    (botocore frames in aws-chunked only over TLS), with default checksum settings,
    ``when_required`` and each ``ChecksumAlgorithm``; each recorded request is verified
    with ``SigV4Verifier`` and decoded by ``RequestBody`` from sources split at awkward
    places, and must give back the payload byte for byte. Some run live: the server
    decodes ``request.content`` itself.
(b) Signed chunked bodies: the AWS documentation's two published examples, verbatim,
    and a test-only encoder written from the same pages for everything else.
(c) Every kind of tampering and malformed framing gives its S3 error code, never a
    crash or a hang.
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import hashlib
import hmac
import random
import ssl
import zlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from itertools import cycle
from pathlib import Path

import aiohttp
import boto3
import pytest
from aiohttp import web
from botocore.config import Config
from multidict import CIMultiDict

from gateway.s3 import chunked
from gateway.s3.checksums import ALGORITHMS, MALFORMED_TRAILER, parse_expected
from gateway.s3.chunked import MAX_PIECE, ChunkedDecoder, RequestBody, stored_content_encoding
from gateway.s3.errors import Code, S3Error
from gateway.s3.sigv4 import (
    AuthContext,
    RequestView,
    SigV4Verifier,
    derive_signing_key,
    is_signed,
)
from tests.certs import make_ca

KEY = "AKIDCHUNKEDTEST"
SECRET = "chunked/secret+KEY"
SIZES = [0, 1, 64 * 1024 + 3, 5 * 1024 * 1024 + 1]
# Every ChecksumAlgorithm botocore computes (MD5 it only sends when given: see below).
FLEXIBLE = [
    "CRC32",
    "CRC32C",
    "CRC64NVME",
    "SHA1",
    "SHA256",
    "SHA512",
    "XXHASH64",
    "XXHASH3",
    "XXHASH128",
]
SETTINGS: dict[str, tuple[dict, dict]] = {
    "default": ({}, {}),
    "when_required": ({"request_checksum_calculation": "when_required"}, {}),
    **{name: ({}, {"ChecksumAlgorithm": name}) for name in FLEXIBLE},
}
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

# The AWS documentation's examples ("Signature calculations for the Authorization header:
# transferring payload in multiple chunks" and "... including trailing headers").
DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_TIME = calendar.timegm((2013, 5, 24, 0, 0, 0))
DOC_DATE = "20130524T000000Z"
DOC_SCOPE = "20130524/us-east-1/s3/aws4_request"
DOC_SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
DOC_SIGNATURES = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
]
DOC_TRAILER_SEED = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
DOC_TRAILER_SIGNATURES = [
    "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
    "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
    "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
]
DOC_TRAILER_SIGNATURE = "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"
DOC_AUTH = (
    "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
    "SignedHeaders={},Signature={}"
)


def payload(size: int) -> bytes:
    return random.Random(size).randbytes(size)


async def pieces(data: bytes, sizes: Iterable[int] | None = None) -> AsyncIterator[bytes]:
    """The body as a client's packets might cut it: whole, or in pieces of ``sizes`` in turn."""
    if sizes is None:
        yield data
        return
    pos = 0
    for size in cycle(sizes):
        if pos >= len(data):
            return
        yield data[pos : pos + size]
        pos += size


def splits(length: int) -> list[list[int] | None]:
    """Whole; odd sizes that cut headers and CRLFs; one byte at a time when that is quick."""
    out: list[list[int] | None] = [None, [1, 2, 3, 5, 7, 11, 13, 4093, 65537]]
    if length <= 70_000:
        out.append([1])
    return out


async def collect(body: AsyncIterator[bytes] | RequestBody | ChunkedDecoder) -> bytes:
    out = []
    async for piece in body:
        assert 0 < len(piece) <= MAX_PIECE
        out.append(piece)
    return b"".join(out)


async def error_of(body: RequestBody | ChunkedDecoder) -> S3Error:
    with pytest.raises(S3Error) as caught:
        await asyncio.wait_for(collect(body), 10)  # a malformed body must never hang
    return caught.value


# --- (a) boto3 against a recording server ------------------------------------------------


@dataclass
class Recorded:
    method: str
    raw_path: str
    raw_query: str
    headers: CIMultiDict[str]
    body: bytes = b""  # raw, as received after HTTP framing
    decoded: bytes | None = None  # live mode: what RequestBody gave
    checksums: dict[str, str] = field(default_factory=dict)

    def view(self) -> RequestView:
        return RequestView(self.method, self.raw_path, self.raw_query, self.headers)


class Recorder:
    """An aiohttp server on loopback (plain and TLS) that records every PUT it gets."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.live = False  # decode request.content in the handler instead of recording it
        self.verifier = SigV4Verifier({KEY: SECRET})
        self.urls: dict[str, str] = {}

    async def handle(self, request: web.Request) -> web.Response:
        rec = Recorded(
            request.method,
            request.rel_url.raw_path,
            request.rel_url.raw_query_string,
            CIMultiDict(request.headers),
        )
        self.requests.append(rec)
        if not self.live:
            rec.body = await request.read()
            return web.Response(headers={"ETag": '"recorded"'})
        try:
            auth = self.verifier.verify(rec.view()) if is_signed(rec.view()) else None
            body = RequestBody(request.content, request.headers, auth)
            rec.decoded = await collect(body)
            rec.checksums = body.checksums
        except S3Error as exc:
            return web.Response(status=exc.status, text=exc.code.name)
        return web.Response(headers={"ETag": '"decoded"'})

    def client(self, scheme: str, cert: Path, **config: object):
        return boto3.client(
            "s3",
            endpoint_url=self.urls[scheme],
            region_name="us-east-1",
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            verify=str(cert),
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config),
        )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A CA file, and a certificate and key it issued for 127.0.0.1, so botocore takes
    its HTTPS code paths."""
    directory = tmp_path_factory.mktemp("tls")
    ca = make_ca(directory)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    ca.issue(cert_path, key_path)
    return ca.path, cert_path, key_path


@pytest.fixture
async def recorder(tls_files: tuple[Path, Path, Path]) -> AsyncIterator[Recorder]:
    rec = Recorder()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("PUT", "/{tail:.*}", rec.handle)
    # aiohttp would otherwise gunzip a 'Content-Encoding: gzip' body before the handler.
    runner = web.AppRunner(app, auto_decompress=False)
    await runner.setup()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(*tls_files[1:])
    for scheme, context in (("http", None), ("https", tls)):
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        rec.urls[scheme] = f"{scheme}://127.0.0.1:{port}"
    yield rec
    await runner.cleanup()


async def put(rec: Recorder, cert: Path, scheme: str, setting: str, data: bytes, **params):
    config, extra = SETTINGS[setting]
    client = rec.client(scheme, cert, **config)
    await asyncio.to_thread(client.put_object, Bucket="b", Key="k", Body=data, **extra, **params)
    return rec.requests.pop()


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_boto3_put_object_bodies_decode_byte_for_byte(
    recorder: Recorder, tls_files: tuple[Path, Path, Path], scheme: str, setting: str
) -> None:
    for size in SIZES:
        data = payload(size)
        rec = await put(recorder, tls_files[0], scheme, setting, data)
        auth = recorder.verifier.verify(rec.view())
        algorithm = parse_expected(rec.headers, auth.payload_hash).algorithm
        if setting in FLEXIBLE:
            assert algorithm is not None and algorithm.name == setting
        for split in splits(len(rec.body)):
            body = RequestBody(pieces(rec.body, split), rec.headers, auth)
            assert await collect(body) == data, (scheme, setting, size, split)
            assert body.content_encoding is None  # aws-chunked is transport, never stored
            if algorithm is not None:
                hasher = ALGORITHMS[algorithm.name].new()
                hasher.update(data)
                assert body.checksums[algorithm.name] == base64.b64encode(hasher.digest()).decode()


async def test_boto3_default_over_https_is_an_unsigned_trailer_body(
    recorder: Recorder, tls_files: tuple[Path, Path, Path]
) -> None:
    """The case behind the issue: boto3 >= 1.36, put_object, default settings, TLS."""
    rec = await put(recorder, tls_files[0], "https", "default", b"hello world")
    assert rec.headers["x-amz-content-sha256"] == chunked.UNSIGNED_TRAILER
    assert rec.headers["x-amz-trailer"] == "x-amz-checksum-crc32"
    assert rec.headers["Content-Encoding"] == "aws-chunked"
    assert rec.body == b"b\r\nhello world\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n"


@pytest.mark.parametrize("param", ["ChecksumMD5", "ContentMD5"])
@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_boto3_with_an_md5_given(
    recorder: Recorder, tls_files: tuple[Path, Path, Path], scheme: str, param: str
) -> None:
    """x-amz-checksum-md5 (botocore sends it, never computes it), and Content-MD5."""
    data = payload(70_000)
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    rec = await put(recorder, tls_files[0], scheme, "default", data, **{param: md5})
    body = RequestBody(pieces(rec.body, [1000]), rec.headers, recorder.verifier.verify(rec.view()))
    assert await collect(body) == data
    assert body.checksums["MD5"] == md5


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_boto3_other_content_encoding_survives(
    recorder: Recorder, tls_files: tuple[Path, Path, Path], scheme: str
) -> None:
    data = zlib.compress(payload(1000))
    rec = await put(recorder, tls_files[0], scheme, "default", data, ContentEncoding="gzip")
    body = RequestBody(pieces(rec.body), rec.headers, recorder.verifier.verify(rec.view()))
    assert await collect(body) == data  # as sent: S3 stores encoded bytes, never decodes them
    assert body.content_encoding == "gzip"


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_live_decoding_from_the_request_stream(
    recorder: Recorder, tls_files: tuple[Path, Path, Path], scheme: str
) -> None:
    recorder.live = True
    for size in SIZES:
        data = payload(size)
        rec = await put(recorder, tls_files[0], scheme, "default", data)
        assert rec.decoded == data
        assert (
            rec.checksums["CRC32"] == base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
        )


async def test_live_wrong_trailer_is_refused(recorder: Recorder) -> None:
    recorder.live = True
    body = b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    headers = {
        "x-amz-content-sha256": chunked.UNSIGNED_TRAILER,
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": "5",
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    async with (
        aiohttp.ClientSession() as session,
        session.put(recorder.urls["http"] + "/b/k", data=body, headers=headers) as response,
    ):
        assert (response.status, await response.text()) == (400, "BadDigest")


# --- (b) signed bodies: the AWS documentation's examples and an encoder from its text --


def doc_key() -> bytes:
    """kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), "s3"), "aws4_request")."""
    key = ("AWS4" + DOC_SECRET).encode()
    for part in ("20130524", "us-east-1", "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def encode_signed(
    data: bytes,
    chunk_size: int,
    key: bytes,
    seed: str,
    trailer: tuple[str, str] | None = None,
    *,
    amz_date: str = DOC_DATE,
    scope: str = DOC_SCOPE,
) -> bytes:
    """aws-chunked with chunk signatures, each chained from the previous (test-only).

    Chunk: hex(size) + ";chunk-signature=" + sig + CRLF + data + CRLF, then a 0-size one.
    With a trailer, the trailer lines and "x-amz-trailer-signature:" + sig follow the
    final chunk's header line, and an empty line ends the body.
    """
    out, previous = bytearray(), seed
    chunks = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)] + [b""]
    for chunk in chunks:
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-PAYLOAD",
                amz_date,
                scope,
                previous,
                EMPTY_SHA256,
                hashlib.sha256(chunk).hexdigest(),
            ]
        )
        previous = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        out += f"{len(chunk):x};chunk-signature={previous}\r\n".encode() + chunk
        if chunk:
            out += b"\r\n"
    if trailer is not None:
        name, value = trailer
        canonical = f"{name}:{value}\n"
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-TRAILER",
                amz_date,
                scope,
                previous,
                hashlib.sha256(canonical.encode()).hexdigest(),
            ]
        )
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        out += f"{name}:{value}\r\nx-amz-trailer-signature:{signature}\r\n".encode()
    return bytes(out + b"\r\n")


def doc_body(signatures: list[str], trailer_lines: bytes = b"") -> bytes:
    """The example bodies exactly as the AWS pages print them."""
    return (
        f"10000;chunk-signature={signatures[0]}\r\n".encode()
        + b"a" * 65536
        + f"\r\n400;chunk-signature={signatures[1]}\r\n".encode()
        + b"a" * 1024
        + f"\r\n0;chunk-signature={signatures[2]}\r\n".encode()
        + trailer_lines
        + b"\r\n"
    )


def doc_request(payload_hash: str, signed_headers: str, seed: str, **extra: str) -> RequestView:
    headers = CIMultiDict(
        {
            "Host": "s3.amazonaws.com",
            "x-amz-date": DOC_DATE,
            "x-amz-storage-class": "REDUCED_REDUNDANCY",
            "Authorization": DOC_AUTH.format(signed_headers, seed),
            "x-amz-content-sha256": payload_hash,
            "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": "66560",
            **extra,
        }
    )
    return RequestView("PUT", "/examplebucket/chunkObject.txt", "", headers)


DOC_VERIFIER = SigV4Verifier({"AKIAIOSFODNN7EXAMPLE": DOC_SECRET}, clock=lambda: DOC_TIME)


@pytest.mark.parametrize("split", splits(66_824))
async def test_aws_documentation_example_chunked_upload(split: list[int] | None) -> None:
    body = doc_body(DOC_SIGNATURES)
    assert len(body) == 66824  # the example's Content-Length
    assert encode_signed(b"a" * 66560, 65536, doc_key(), DOC_SEED) == body
    req = doc_request(
        chunked.SIGNED,
        "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
        "x-amz-decoded-content-length;x-amz-storage-class",
        DOC_SEED,
        **{"Content-Length": "66824"},
    )
    auth = DOC_VERIFIER.verify(req)
    assert auth.seed_signature == DOC_SEED
    assert await collect(RequestBody(pieces(body, split), req.headers, auth)) == b"a" * 66560


@pytest.mark.parametrize("split", splits(66_946))
async def test_aws_documentation_example_with_trailing_checksum(split: list[int] | None) -> None:
    trailer = (
        b"x-amz-checksum-crc32c:sOO8/Q==\r\n"
        + f"x-amz-trailer-signature:{DOC_TRAILER_SIGNATURE}\r\n".encode()
    )
    body = doc_body(DOC_TRAILER_SIGNATURES, trailer)
    assert len(body) == 66946
    crc = ("x-amz-checksum-crc32c", "sOO8/Q==")
    assert encode_signed(b"a" * 66560, 65536, doc_key(), DOC_TRAILER_SEED, crc) == body
    req = doc_request(
        chunked.SIGNED_TRAILER,
        "content-encoding;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;"
        "x-amz-storage-class;x-amz-trailer",
        DOC_TRAILER_SEED,
        **{"x-amz-trailer": "x-amz-checksum-crc32c"},
    )
    auth = DOC_VERIFIER.verify(req)
    body_reader = RequestBody(pieces(body, split), req.headers, auth)
    assert await collect(body_reader) == b"a" * 66560
    assert body_reader.checksums == {"CRC32C": "sOO8/Q=="}


def auth_for(mode: str, seed: str = "0" * 64) -> AuthContext:
    key = derive_signing_key(DOC_SECRET, "20130524", "us-east-1")
    return AuthContext(KEY, "us-east-1", DOC_DATE, DOC_SCOPE, key, seed, mode, False)


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


@pytest.mark.parametrize("size", [0, 1, 8192, 64 * 1024 + 3, 3 * 1024 * 1024 + 5])
@pytest.mark.parametrize("mode", [chunked.SIGNED, chunked.SIGNED_TRAILER])
async def test_signed_bodies_round_trip(mode: str, size: int) -> None:
    data = payload(size)
    auth = auth_for(mode)
    trailer = ("x-amz-checksum-crc32", crc32_b64(data)) if mode == chunked.SIGNED_TRAILER else None
    names = [trailer[0]] if trailer else []
    for chunk_size in (8192, 65536, 2 * 1024 * 1024):
        body = encode_signed(data, chunk_size, auth.signing_key, auth.seed_signature, trailer)
        for split in splits(len(body)):
            decoder = ChunkedDecoder(pieces(body, split), mode, auth, size, names)
            assert await collect(decoder) == data
            if trailer:
                assert decoder.trailers[trailer[0]] == trailer[1]


async def test_a_large_source_piece_is_handed_on_in_bounded_pieces() -> None:
    data = payload(3 * MAX_PIECE + 7)
    body = f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    decoder = ChunkedDecoder(pieces(body), chunked.UNSIGNED_TRAILER, None, len(data))
    assert await collect(decoder) == data  # collect() asserts every piece <= MAX_PIECE


# --- (c) tampering and malformed bodies ---------------------------------------------------


def signed_body(size: int = 3 * 8192, trailer: bool = False) -> tuple[bytes, AuthContext, bytes]:
    data = payload(size)
    mode = chunked.SIGNED_TRAILER if trailer else chunked.SIGNED
    auth = auth_for(mode, seed="ab" * 32)
    crc = ("x-amz-checksum-crc32", crc32_b64(data)) if trailer else None
    return encode_signed(data, 8192, auth.signing_key, auth.seed_signature, crc), auth, data


def decoder(body: bytes, auth: AuthContext, length: int, trailer: bool = False) -> ChunkedDecoder:
    names = ["x-amz-checksum-crc32"] if trailer else []
    return ChunkedDecoder(pieces(body, [1, 9, 4000]), auth.payload_hash, auth, length, names)


async def test_tampered_chunk_signature() -> None:
    body, auth, data = signed_body()
    at = body.index(b"chunk-signature=", 100) + len("chunk-signature=")
    flipped = body[:at] + (b"0" if body[at : at + 1] != b"0" else b"1") + body[at + 1 :]
    error = await error_of(decoder(flipped, auth, len(data)))
    assert error.code is Code.SignatureDoesNotMatch
    assert error.fields["StringToSign"].startswith("AWS4-HMAC-SHA256-PAYLOAD\n")


async def test_tampered_chunk_data() -> None:
    body, auth, data = signed_body()
    at = body.index(b"\r\n") + 100
    tampered = body[:at] + bytes([body[at] ^ 1]) + body[at + 1 :]
    assert (await error_of(decoder(tampered, auth, len(data)))).code is Code.SignatureDoesNotMatch


async def test_swapped_chunks_break_the_chain() -> None:
    body, auth, data = signed_body()
    record = (
        len(b"2000;chunk-signature=") + 64 + 2 + 8192 + 2
    )  # equal sizes: only the chain differs
    swapped = body[record : 2 * record] + body[:record] + body[2 * record :]
    assert (await error_of(decoder(swapped, auth, len(data)))).code is Code.SignatureDoesNotMatch


async def test_chunks_of_another_request_are_refused() -> None:
    body, auth, data = signed_body()
    other = auth_for(auth.payload_hash, seed="cd" * 32)
    assert (await error_of(decoder(body, other, len(data)))).code is Code.SignatureDoesNotMatch


async def test_dropped_final_chunk_signature_is_refused() -> None:
    body, auth, data = signed_body()
    at = body.rindex(b"0;chunk-signature=")
    unsigned_end = body[:at] + b"0\r\n\r\n"
    assert (await error_of(decoder(unsigned_end, auth, len(data)))).code is Code.IncompleteBody


async def test_tampered_signed_trailer() -> None:
    body, auth, data = signed_body(trailer=True)
    good = crc32_b64(data).encode()
    changed = body.replace(good, crc32_b64(data + b"x").encode())
    error = await error_of(decoder(changed, auth, len(data), trailer=True))
    assert error.code is Code.SignatureDoesNotMatch
    assert error.fields["StringToSign"].startswith("AWS4-HMAC-SHA256-TRAILER\n")
    at = body.index(b"x-amz-trailer-signature:") + len("x-amz-trailer-signature:")
    bad_signature = body[:at] + b"f" * 64 + body[at + 64 :]
    error = await error_of(decoder(bad_signature, auth, len(data), trailer=True))
    assert error.code is Code.SignatureDoesNotMatch


async def test_signed_trailer_without_its_signature() -> None:
    body, auth, data = signed_body(trailer=True)
    at = body.index(b"x-amz-trailer-signature:")
    error = await error_of(decoder(body[:at] + b"\r\n", auth, len(data), trailer=True))
    assert error.code is MALFORMED_TRAILER


def unsigned_body(data: bytes, trailer: str | None, chunk: int = 4096) -> bytes:
    out = b"".join(
        f"{len(data[i : i + chunk]):x}\r\n".encode() + data[i : i + chunk] + b"\r\n"
        for i in range(0, len(data), chunk)
    )
    return out + b"0\r\n" + (trailer.encode() + b"\r\n" if trailer else b"") + b"\r\n"


def unsigned_request(
    data: bytes, trailer: str | None, **headers: str
) -> tuple[bytes, CIMultiDict[str]]:
    base = {
        "x-amz-content-sha256": chunked.UNSIGNED_TRAILER,
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    return unsigned_body(data, trailer), CIMultiDict({**base, **headers})


async def test_wrong_trailer_checksum() -> None:
    data = payload(10_000)
    body, headers = unsigned_request(data, "x-amz-checksum-crc32:" + crc32_b64(b"other"))
    error = await error_of(RequestBody(pieces(body, [3]), headers, None))
    assert error.code is Code.BadDigest
    assert error.message == "The CRC32 you specified did not match the calculated checksum."


async def test_trailer_checksum_that_is_not_a_crc32() -> None:
    body, headers = unsigned_request(b"abc", "x-amz-checksum-crc32:not-base64!")
    error = await error_of(RequestBody(pieces(body), headers, None))
    assert error.code is Code.InvalidRequest
    assert error.message == "Value for x-amz-checksum-crc32 trailing header is invalid."


@pytest.mark.parametrize(
    "trailer", [None, "x-amz-checksum-sha1:AAAAAAAAAAAAAAAAAAAAAAAAAAA=", "no-colon"]
)
async def test_missing_or_unexpected_trailer(trailer: str | None) -> None:
    body, headers = unsigned_request(b"abc", trailer)
    assert (await error_of(RequestBody(pieces(body), headers, None))).code is MALFORMED_TRAILER


async def test_unsigned_trailer_body_without_a_trailer_is_fine() -> None:
    data = payload(5000)
    body, headers = unsigned_request(data, None)
    del headers["x-amz-trailer"]
    assert await collect(RequestBody(pieces(body, [1]), headers, None)) == data


async def test_wrong_content_md5() -> None:
    data = payload(1000)
    wrong = base64.b64encode(hashlib.md5(b"x").digest()).decode()
    headers = CIMultiDict({"Content-MD5": wrong, "Content-Length": "1000"})
    error = await error_of(RequestBody(pieces(data), headers, None))
    assert error.code is Code.BadDigest
    assert error.fields == {
        "CalculatedDigest": base64.b64encode(hashlib.md5(data).digest()).decode(),
        "ExpectedDigest": wrong,
    }
    right = base64.b64encode(hashlib.md5(data).digest()).decode()
    headers["Content-MD5"] = right
    body = RequestBody(pieces(data), headers, None)
    assert await collect(body) == data and body.checksums["MD5"] == right


@pytest.mark.parametrize("value", ["abc", "AAAA", base64.b64encode(b"x" * 15).decode()])
def test_content_md5_that_is_not_an_md5(value: str) -> None:
    with pytest.raises(S3Error) as caught:
        RequestBody(pieces(b""), {"Content-MD5": value}, None)
    assert caught.value.code is Code.InvalidDigest


async def test_wrong_checksum_header() -> None:
    data = payload(1000)
    wrong = base64.b64encode(hashlib.sha256(b"x").digest()).decode()
    error = await error_of(RequestBody(pieces(data), {"x-amz-checksum-sha256": wrong}, None))
    assert error.code is Code.BadDigest
    assert error.message == "The SHA256 you specified did not match the calculated checksum."


async def test_wrong_checksum_header_on_a_chunked_body() -> None:
    data = payload(1000)
    body, headers = unsigned_request(data, None, **{"x-amz-checksum-crc32c": "AAAAAA=="})
    del headers["x-amz-trailer"]
    error = await error_of(RequestBody(pieces(body), headers, None))
    assert error.message == "The CRC32C you specified did not match the calculated checksum."


async def test_wrong_signed_payload_hash() -> None:
    data = payload(1000)
    claimed = hashlib.sha256(b"x").hexdigest()
    error = await error_of(RequestBody(pieces(data), {"x-amz-content-sha256": claimed}, None))
    assert error.code is Code.XAmzContentSHA256Mismatch
    assert error.fields["S3ComputedContentSHA256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (
            {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-sha1": "A" * 27 + "="},
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
        ),
        (
            {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-trailer": "x-amz-checksum-crc32"},
            "Expecting a single x-amz-checksum- header",
        ),
        (
            {"x-amz-checksum-crc16": "AAAA"},
            "The algorithm type you specified in x-amz-checksum- header is invalid.",
        ),
        ({"x-amz-checksum-crc32": "AAAA"}, "Value for x-amz-checksum-crc32 header is invalid."),
        (
            {"x-amz-trailer": "x-amz-meta-foo"},
            "The value specified in the x-amz-trailer header is not supported",
        ),
        (
            {"x-amz-sdk-checksum-algorithm": "CRC32"},
            "x-amz-sdk-checksum-algorithm specified, but no corresponding x-amz-checksum-* "
            "or x-amz-trailer headers were found.",
        ),
        (
            {"x-amz-sdk-checksum-algorithm": "SHA1", "x-amz-checksum-crc32": "AAAAAA=="},
            "Value for x-amz-sdk-checksum-algorithm header is invalid.",
        ),
    ],
)
def test_malformed_checksum_declarations(headers: dict[str, str], message: str) -> None:
    with pytest.raises(S3Error) as caught:
        parse_expected(headers)
    assert (caught.value.code, caught.value.message) == (Code.InvalidRequest, message)


async def test_every_truncation_raises_and_none_hangs() -> None:
    data = payload(20_000)
    body, headers = unsigned_request(data, "x-amz-checksum-crc32:" + crc32_b64(data))
    for cut in range(len(body) - 2):  # without its last CRLF, the body is still whole
        if 60 < cut < len(body) - 80 and cut % 97:
            continue  # the middle of the data: a sample is enough
        reader = RequestBody(pieces(body[:cut], [1, 4096]), headers, None)
        assert (await error_of(reader)).code in (Code.IncompleteBody, MALFORMED_TRAILER), cut
    signed, auth, signed_data = signed_body(trailer=True)
    for cut in range(0, len(signed) - 2, 41):
        error = await error_of(decoder(signed[:cut], auth, len(signed_data), trailer=True))
        assert error.code in (Code.IncompleteBody, MALFORMED_TRAILER), cut


async def test_missing_final_chunk() -> None:
    body, auth, data = signed_body()
    cut = body[: body.rindex(b"0;chunk-signature=")]
    assert (await error_of(decoder(cut, auth, len(data)))).code is Code.IncompleteBody
    plain = unsigned_body(b"abc", None)[: -len(b"0\r\n\r\n")]
    reader = ChunkedDecoder(pieces(plain), chunked.UNSIGNED_TRAILER, None, 3)
    assert (await error_of(reader)).code is Code.IncompleteBody


@pytest.mark.parametrize("declared", [0, 9_999, 10_001, 20_000])
async def test_decoded_length_must_match(declared: int) -> None:
    data = payload(10_000)
    body, headers = unsigned_request(data, None, **{"x-amz-decoded-content-length": str(declared)})
    del headers["x-amz-trailer"]
    error = await error_of(RequestBody(pieces(body), headers, None))
    assert error.code is Code.IncompleteBody
    assert error.fields["NumberBytesExpected"] == str(declared)
    if declared < 10_000:  # refused at the chunk that overruns, before its bytes go on
        assert int(error.fields["NumberBytesProvided"]) > declared
    else:
        assert error.fields["NumberBytesProvided"] == "10000"


@pytest.mark.parametrize(
    "head",
    [
        b"zz\r\n",
        b"0x3\r\n",
        b" 3\r\n",
        b"-3\r\n",
        b"3 \r\n",
        b"\r\n",
        b"3\n",
        b"+3\r\n",
        b"3_0\r\n",
    ],
)
async def test_malformed_chunk_size_line(head: bytes) -> None:
    body = head + b"abc\r\n0\r\n\r\n"
    reader = ChunkedDecoder(pieces(body, [2]), chunked.UNSIGNED_TRAILER, None, 3)
    assert (await error_of(reader)).code is Code.IncompleteBody


@pytest.mark.parametrize(
    "body",
    [
        b"3\r\nabcd\r\n0\r\n\r\n",  # more data than the size says
        b"3;chunk-signature\r\nabc\r\n0\r\n\r\n",  # a signed chunk without its signature
        b"3\r\nab",  # cut inside the data
    ],
)
async def test_malformed_chunk_framing(body: bytes) -> None:
    mode = chunked.SIGNED if b"signature" in body else chunked.UNSIGNED_TRAILER
    reader = ChunkedDecoder(pieces(body, [1]), mode, auth_for(mode), 3)
    assert (await error_of(reader)).code is Code.IncompleteBody


async def test_data_after_the_final_chunk() -> None:
    body = unsigned_body(b"abc", None) + b"3\r\nxyz\r\n"
    reader = ChunkedDecoder(pieces(body), chunked.UNSIGNED_TRAILER, None, 3)
    assert (await error_of(reader)).code is Code.InvalidRequest


@pytest.mark.parametrize("piece", [1, 1 << 20])
async def test_an_endless_header_line_is_refused_without_buffering_it(piece: int) -> None:
    pulled = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal pulled
        while True:
            pulled += piece
            yield b"1" * piece

    reader = ChunkedDecoder(endless(), chunked.UNSIGNED_TRAILER, None, None)
    assert (await error_of(reader)).code is Code.IncompleteBody
    assert pulled <= max(piece, 8192)


def test_signed_modes_need_a_sigv4_context() -> None:
    with pytest.raises(S3Error) as caught:
        ChunkedDecoder(pieces(b""), chunked.SIGNED, None, 0)
    assert caught.value.code is Code.AccessDenied


def test_request_level_header_checks() -> None:
    with pytest.raises(S3Error) as caught:
        chunked.streaming_mode("STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD")
    assert caught.value.code is Code.NotImplemented
    assert chunked.streaming_mode("UNSIGNED-PAYLOAD") is None
    for value, code in (("", Code.MissingContentLength), ("x", Code.MissingContentLength)):
        with pytest.raises(S3Error) as caught:
            chunked.decoded_length({"x-amz-decoded-content-length": value})
        assert caught.value.code is code
    with pytest.raises(S3Error) as caught:
        chunked.decoded_length({"x-amz-decoded-content-length": "-1"})
    assert caught.value.code is Code.InvalidArgument


@pytest.mark.parametrize(
    ("header", "streaming", "stored"),
    [
        (None, True, None),
        ("aws-chunked", True, None),
        ("gzip,aws-chunked", True, "gzip"),
        ("aws-chunked, gzip", True, "gzip"),
        ("gzip, br", True, "gzip, br"),
        ("AWS-CHUNKED,br", True, "br"),
        ("gzip,aws-chunked", False, "gzip,aws-chunked"),  # a plain PUT stores what it says
    ],
)
def test_stored_content_encoding(header: str | None, streaming: bool, stored: str | None) -> None:
    assert stored_content_encoding(header, streaming=streaming) == stored
