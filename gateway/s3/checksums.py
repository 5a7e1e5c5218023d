"""The integrity checks a PUT body carries, and the one place that checks them.

A request may declare, in any mix S3 allows: ``Content-MD5``; one
``x-amz-checksum-<alg>`` value as a header, or named in ``x-amz-trailer`` to arrive
after an aws-chunked body; ``x-amz-sdk-checksum-algorithm`` (which only has to agree
with the others); and a hex SHA-256 of the payload in ``x-amz-content-sha256``, which
the SigV4 signature covers. ``parse_expected`` reads and validates all of them before
a byte of the body is read, so a malformed declaration fails fast; ``BodyVerifier`` is
then fed the decoded payload piece by piece and compares at the end.

The algorithms are data: ``ALGORITHMS`` maps S3's name to the header, the digest size
and a factory of incremental hashers: zlib for CRC32; hashlib for SHA1, SHA256, SHA512
and MD5; the AWS CRT for CRC32C and CRC64NVME (the code botocore uses, with hardware CRC
instructions); xxhash for XXHASH64, XXHASH3 and XXHASH128. That is every value of S3's
``ChecksumAlgorithm`` (the last five are recent additions).
Values are compared as decoded bytes, so any valid base64 spelling matches.

Order of the end checks, as OpenStack Swift's s3api (which mirrors S3) makes them: the
signed payload hash first (``XAmzContentSHA256Mismatch``), then the flexible checksum
(``BadDigest``), then Content-MD5 (``BadDigest``). Messages and fields are S3's.

NOT handled here: checksums sent as query parameters of a presigned URL (S3 ignores
them too), ``x-amz-checksum-type`` (FULL_OBJECT/COMPOSITE: a multipart concern), and
composite checksums of multipart objects.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import xxhash
from awscrt import checksums as crt
from multidict import CIMultiDict

from gateway.s3.errors import Code, S3Error

_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
# x-amz-checksum-* headers that name a mode or an algorithm, never carry a value.
_NOT_VALUES = frozenset({"x-amz-checksum-algorithm", "x-amz-checksum-type", "x-amz-checksum-mode"})

# NOTE: errors.py has no MalformedTrailerError (400) yet; until it has, the nearest code.
MALFORMED_TRAILER = Code.__members__.get("MalformedTrailerError", Code.InvalidRequest)
MALFORMED_TRAILER_MESSAGE = (
    "The request contained trailing data that was not well-formed "
    "or did not conform to our published schema."
)


class Hasher(Protocol):
    def update(self, data: bytes) -> None: ...
    def digest(self) -> bytes: ...


class _Crc:
    """An incremental CRC from a function f(data, previous) -> int, big-endian as S3 shows it."""

    def __init__(self, fn: Callable[[bytes, int], int], size: int) -> None:
        self._fn, self._size, self._value = fn, size, 0

    def update(self, data: bytes) -> None:
        self._value = self._fn(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._size, "big")


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One S3 checksum algorithm: 'CRC32' -> header x-amz-checksum-crc32, 4-byte digest."""

    name: str
    size: int
    new: Callable[[], Hasher]

    @property
    def header(self) -> str:
        return "x-amz-checksum-" + self.name.lower()


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("CRC32", 4, lambda: _Crc(zlib.crc32, 4)),
        Algorithm("CRC32C", 4, lambda: _Crc(crt.crc32c, 4)),
        Algorithm("CRC64NVME", 8, lambda: _Crc(crt.crc64nvme, 8)),
        Algorithm("SHA1", 20, hashlib.sha1),
        Algorithm("SHA256", 32, hashlib.sha256),
        # Newer: botocore computes the xxhashes with the CRT; the xxhash package agrees.
        Algorithm("SHA512", 64, hashlib.sha512),
        Algorithm("MD5", 16, hashlib.md5),  # also what Content-MD5 is checked with
        Algorithm("XXHASH64", 8, xxhash.xxh64),
        Algorithm("XXHASH3", 8, xxhash.xxh3_64),
        Algorithm("XXHASH128", 16, xxhash.xxh3_128),
    )
}
_BY_HEADER = {a.header: a for a in ALGORITHMS.values()}


def by_header(name: str) -> Algorithm | None:
    """The algorithm of an ``x-amz-checksum-<alg>`` header or trailer name, any case."""
    return _BY_HEADER.get(name.strip().lower())


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def decode_digest(value: str, size: int) -> bytes | None:
    """The raw digest of a base64 value, or None unless it is valid base64 of ``size`` bytes."""
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size else None


@dataclass(frozen=True, slots=True)
class Expected:
    """What a request says its payload hashes to, validated but not yet checked."""

    md5: bytes | None = None  # Content-MD5, decoded
    algorithm: Algorithm | None = None  # the one flexible checksum, from header or trailer
    value: bytes | None = None  # its digest when sent as a header; None when a trailer
    trailer: str | None = None  # 'x-amz-checksum-crc32' when x-amz-trailer names it
    sha256_hex: str | None = None  # the signed payload hash, lowercase

    @property
    def trailer_names(self) -> list[str]:
        """What the aws-chunked decoder should expect after the final chunk."""
        return [self.trailer] if self.trailer else []


def of_the_body(headers: Mapping[str, str], operation: str) -> Mapping[str, str]:
    """The headers that declare what ``operation``'s request body hashes to.

    A CompleteMultipartUpload's ``x-amz-checksum-<alg>`` (with ``x-amz-checksum-type``
    FULL_OBJECT or COMPOSITE) is the checksum of the object being completed, which
    the origin checks against its parts, not of the XML body: it is left out here
    (and still forwarded).
    """
    if operation != "CompleteMultipartUpload":
        return headers
    return CIMultiDict(
        (name, value)
        for name, value in headers.items()
        if not name.lower().startswith(("x-amz-checksum-", "x-amz-sdk-checksum-algorithm"))
    )


def parse_expected(headers: Mapping[str, str], payload_hash: str | None = None) -> Expected:
    """Read the checksums a request declares; raises ``S3Error`` for malformed ones.

    ``payload_hash`` is the verified ``AuthContext.payload_hash`` when there is one (a
    presigned URL may carry it in the query); otherwise the header is used.
    """
    if payload_hash is None:
        payload_hash = headers.get("x-amz-content-sha256")
    algorithm, value = _checksum_header(headers)
    trailer = _trailer_checksum(headers)
    if algorithm is not None and trailer is not None:
        raise S3Error(Code.InvalidRequest, "Expecting a single x-amz-checksum- header")
    if trailer is not None:
        algorithm = by_header(trailer)
    _check_sdk_algorithm(headers, algorithm)
    sha256_hex = (
        payload_hash.lower() if payload_hash and _SHA256_HEX.fullmatch(payload_hash) else None
    )
    return Expected(_content_md5(headers), algorithm, value, trailer, sha256_hex)


def _content_md5(headers: Mapping[str, str]) -> bytes | None:
    value = headers.get("Content-MD5")
    if value is None:
        return None
    digest = decode_digest(value, 16)
    if digest is None:
        raise S3Error(Code.InvalidDigest, fields={"Content-MD5": value})
    return digest


def _checksum_header(headers: Mapping[str, str]) -> tuple[Algorithm | None, bytes | None]:
    found = [
        (name.lower(), value)
        for name, value in headers.items()  # a multidict yields a repeated header twice
        if name.lower().startswith("x-amz-checksum-") and name.lower() not in _NOT_VALUES
    ]
    if not found:
        return None, None
    if any(by_header(name) is None for name, _ in found):
        raise S3Error(
            Code.InvalidRequest,
            "The algorithm type you specified in x-amz-checksum- header is invalid.",
        )
    if len(found) > 1:
        raise S3Error(
            Code.InvalidRequest,
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
        )
    name, value = found[0]
    algorithm = by_header(name)
    assert algorithm is not None  # checked above
    digest = decode_digest(value, algorithm.size)
    if digest is None:
        raise S3Error(Code.InvalidRequest, f"Value for {name} header is invalid.")
    return algorithm, digest


def _trailer_checksum(headers: Mapping[str, str]) -> str | None:
    names = [n.strip().lower() for n in headers.get("x-amz-trailer", "").split(",") if n.strip()]
    if any(by_header(n) is None for n in names):
        message = "The value specified in the x-amz-trailer header is not supported"
        raise S3Error(Code.InvalidRequest, message)
    if len(names) > 1:
        raise S3Error(
            Code.InvalidRequest,
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
        )
    return names[0] if names else None


def _check_sdk_algorithm(headers: Mapping[str, str], algorithm: Algorithm | None) -> None:
    """x-amz-sdk-checksum-algorithm says nothing by itself; it must agree with a value."""
    requested = headers.get("x-amz-sdk-checksum-algorithm")
    if requested is None:
        return
    if algorithm is None:
        raise S3Error(
            Code.InvalidRequest,
            "x-amz-sdk-checksum-algorithm specified, but no corresponding x-amz-checksum-* "
            "or x-amz-trailer headers were found.",
        )
    if requested.strip().upper() != algorithm.name:
        raise S3Error(
            Code.InvalidRequest, "Value for x-amz-sdk-checksum-algorithm header is invalid."
        )


class BodyVerifier:
    """Hashes the decoded payload as it passes and checks it against ``Expected`` at the end.

    ``also`` names further algorithms to compute (say "MD5" for an origin's ETag, or
    "CRC32" to hand the origin a checksum): ``finish`` returns every computed value,
    base64, by algorithm name. Only what is needed is computed.
    """

    def __init__(self, expected: Expected, also: Iterable[str] = ()) -> None:
        self.expected = expected
        self.length = 0  # bytes seen
        names = set(also)
        if expected.md5 is not None:
            names.add("MD5")
        if expected.algorithm is not None:
            names.add(expected.algorithm.name)
        if expected.sha256_hex is not None:
            names.add("SHA256")
        self._hashers: dict[str, Hasher] = {name: ALGORITHMS[name].new() for name in names}

    def update(self, data: bytes) -> None:
        self.length += len(data)
        for hasher in self._hashers.values():
            hasher.update(data)

    def finish(self, trailers: Mapping[str, str] | None = None) -> dict[str, str]:
        """Check everything; returns the computed checksums, raises ``S3Error``."""
        digests = {name: hasher.digest() for name, hasher in self._hashers.items()}
        self._check_payload_hash(digests)
        self._check_checksum(digests, trailers or {})
        self._check_md5(digests)
        return {name: b64(digest) for name, digest in digests.items()}

    def _check_payload_hash(self, digests: dict[str, bytes]) -> None:
        claimed = self.expected.sha256_hex
        if claimed is not None and digests["SHA256"].hex() != claimed:
            raise S3Error(
                Code.XAmzContentSHA256Mismatch,
                fields={
                    "ClientComputedContentSHA256": claimed,
                    "S3ComputedContentSHA256": digests["SHA256"].hex(),
                },
            )

    def _check_checksum(self, digests: dict[str, bytes], trailers: Mapping[str, str]) -> None:
        algorithm = self.expected.algorithm
        if algorithm is None:
            return
        claimed = self.expected.value
        if claimed is None:  # declared in x-amz-trailer: the decoder has read it by now
            claimed = self._trailer_value(algorithm, trailers)
        if digests[algorithm.name] != claimed:
            message = f"The {algorithm.name} you specified did not match the calculated checksum."
            raise S3Error(Code.BadDigest, message)

    def _trailer_value(self, algorithm: Algorithm, trailers: Mapping[str, str]) -> bytes:
        name = algorithm.header
        lowered = {k.lower(): v for k, v in trailers.items()}
        if name not in lowered:
            raise S3Error(MALFORMED_TRAILER, MALFORMED_TRAILER_MESSAGE)
        digest = decode_digest(lowered[name], algorithm.size)
        if digest is None:
            raise S3Error(Code.InvalidRequest, f"Value for {name} trailing header is invalid.")
        return digest

    def _check_md5(self, digests: dict[str, bytes]) -> None:
        claimed = self.expected.md5
        if claimed is not None and digests["MD5"] != claimed:
            fields = {"CalculatedDigest": b64(digests["MD5"]), "ExpectedDigest": b64(claimed)}
            raise S3Error(Code.BadDigest, fields=fields)
