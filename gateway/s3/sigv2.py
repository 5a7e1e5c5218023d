"""AWS Signature Version 2 verification of client requests, the way Amazon S3 does it.

SigV2 is still what boto3's ``generate_presigned_url`` produces in us-east-1 by default
(``?AWSAccessKeyId=..&Signature=..&Expires=..``), and what clients configured with
``signature_version="s3"`` send (``Authorization: AWS AK:signature``). Both forms become
one ``_Claim``; the signature is ``base64(HMAC-SHA1(secret, StringToSign))`` with

    StringToSign = Verb \\n Content-MD5 \\n Content-Type \\n Date \\n AmzHeaders Resource

as "Signing and Authenticating REST Requests" (S3 developer guide) describes it. The
order of checks is the one ``sigv4`` uses: parse, look up the key, compare, and only
then look at the clock.

Supported: both forms; ``x-amz-date`` instead of ``Date`` (the Date line is then empty);
virtual-hosted buckets (``/bucket`` is prefixed to the resource); the sub-resources S3
and botocore sign, values decoded; x-amz-* headers, and for presigned URLs x-amz-*
query parameters (botocore moves signed headers there).

NOT verified: the payload and Content-MD5 (signed; the body reader checks them, if at
all); session tokens (``x-amz-security-token`` is signed like any x-amz-* header, never
checked). NOT supported: browser POST policies; SigV2 of other services; botocore's
``HmacV1Auth`` given an explicit x-amz-date header (it signs the Date line too, which S3
documents as empty). Query parameters other than sub-resources (``prefix``...) are not
covered by a SigV2 signature at all: that is SigV2, not a bug here.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gateway.s3 import signing
from gateway.s3.errors import Code, S3Error
from gateway.s3.routing import split_host
from gateway.s3.signing import RequestView

# Signed query parameters: S3's documented list, plus what botocore and the Java SDK sign.
_SUBRESOURCES = frozenset(
    {"accelerate", "acl", "analytics", "cors", "defaultObjectAcl", "delete", "inventory",
     "lifecycle", "location", "logging", "metrics", "notification", "object-lock",
     "partNumber", "policy", "replication", "requestPayment", "response-cache-control",
     "response-content-disposition", "response-content-encoding",
     "response-content-language", "response-content-type", "response-expires", "restore",
     "select", "select-type", "storageClass", "tagging", "torrent", "uploadId", "uploads",
     "versionId", "versioning", "versions", "website"}
)  # fmt: skip
_MAX_EXPIRES = 2**31 - 1  # S3 refuses SigV2 expiry times past 2038 as invalid dates
_EXPIRES = re.compile(r"[0-9]{1,10}")
_FOLD = re.compile(r"\s*\r?\n\s*")


@dataclass(frozen=True, slots=True)
class _Claim:
    """What a request says about its own signature, before anything is checked."""

    access_key: str
    signature: str
    date_line: str  # the Date line of the StringToSign: Date, '' or Expires
    date_sent: str  # Date, x-amz-date or Expires as sent, for error messages
    timestamp: float  # request time (header) or expiry time (presigned)
    presigned: bool


def is_sigv2(req: RequestView) -> bool:
    """True for ``Authorization: AWS ...``, or AWSAccessKeyId and Signature in the query."""
    authorization = req.headers.get("Authorization", "").strip()
    if authorization:
        return authorization.partition(" ")[0] == "AWS"
    params = signing.query_params(req.raw_query)
    return "signature" in params and "awsaccesskeyid" in params


class SigV2Verifier:
    """Verifies SigV2 signatures against a table of access key -> secret key."""

    def __init__(
        self,
        secrets: Mapping[str, str],
        *,
        max_skew: float = 900.0,
        clock: Callable[[], float] = time.time,
        domains: Sequence[str] = ("localhost",),
    ) -> None:
        self._secrets = secrets
        self._max_skew = max_skew
        self._clock = clock
        self._domains = list(domains)

    def verify(self, req: RequestView) -> str:
        """Check the request's signature; returns its access key, raises ``S3Error``."""
        claim = _claim(req)
        secret = self._secrets.get(claim.access_key)
        if secret is None:
            fields = {"AWSAccessKeyId": claim.access_key}
            raise S3Error(Code.InvalidAccessKeyId, fields=fields)
        bucket = split_host(req.headers.get("Host", ""), self._domains)
        _check_signature(req, claim, secret, bucket)
        self._check_time(claim)
        return claim.access_key

    def _check_time(self, claim: _Claim) -> None:
        now = self._clock()
        if claim.presigned:
            if now > claim.timestamp:  # valid up to and including its Expires second
                fields = {"Expires": signing.iso(claim.timestamp), "ServerTime": signing.iso(now)}
                raise S3Error(Code.AccessDenied, "Request has expired", fields=fields)
        elif abs(now - claim.timestamp) > self._max_skew:
            raise S3Error(
                Code.RequestTimeTooSkewed,
                "The difference between the request time and the current time is too large.",
                fields={
                    "RequestTime": claim.date_sent,
                    "ServerTime": signing.iso(now),
                    "MaxAllowedSkewMilliseconds": str(int(self._max_skew * 1000)),
                },
            )


# --- parsing: request -> _Claim -------------------------------------------------------


def _claim(req: RequestView) -> _Claim:
    authorization = req.headers.get("Authorization", "").strip()
    params = signing.query_params(req.raw_query)
    if not authorization:
        return _query_claim(params)
    if "signature" in params or "x-amz-algorithm" in params:
        raise S3Error(
            Code.InvalidArgument,
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
            "Signature query string parameter or the Authorization header should be specified",
            fields={"ArgumentName": "Authorization", "ArgumentValue": authorization},
        )
    return _header_claim(req, authorization)


def _header_claim(req: RequestView, authorization: str) -> _Claim:
    scheme, _, credentials = authorization.partition(" ")
    access_key, colon, signature = credentials.strip().partition(":")
    if scheme != "AWS" or not (access_key and colon and signature):
        # S3 answers 400 InvalidArgument to 'AWS HAHAHA' (ceph/s3-tests, run against AWS).
        raise S3Error(
            Code.InvalidArgument,
            "AWS authorization header is invalid.  Expected AwsAccessKeyId:signature",
            fields={"ArgumentName": "Authorization", "ArgumentValue": authorization},
        )
    amz_date = req.headers.get("x-amz-date")
    sent = amz_date if amz_date is not None else req.headers.get("Date", "")
    timestamp = _parse_date(sent)
    if timestamp is None:
        raise S3Error(Code.AccessDenied, signing.NO_DATE)
    # With x-amz-date present the Date line is empty: x-amz-date is among the amz headers.
    date_line = "" if amz_date is not None else sent
    return _Claim(access_key, signature, date_line, sent, timestamp, presigned=False)


def _query_claim(params: dict[str, str]) -> _Claim:
    if not {"awsaccesskeyid", "signature", "expires"} <= params.keys():
        raise S3Error(
            Code.AccessDenied,
            "Query-string authentication requires the Signature, Expires and "
            "AWSAccessKeyId parameters",
        )
    expires = params["expires"]
    if not _EXPIRES.fullmatch(expires) or int(expires) > _MAX_EXPIRES:
        message = f"Invalid date (should be seconds since epoch): {expires}"
        raise S3Error(Code.AccessDenied, message)
    access_key, signature = params["awsaccesskeyid"], params["signature"]
    return _Claim(access_key, signature, expires, expires, float(expires), presigned=True)


def _parse_date(value: str) -> float | None:
    """An RFC 7231 date (ISO 8601 basic also accepted); S3 refuses dates before 1970."""
    timestamp = signing.parse_amz_date(value)
    if timestamp is None:
        timestamp = signing.parse_http_date(value)
    return None if timestamp is None or timestamp < 0 else timestamp


# --- the string to sign and the comparison ---------------------------------------------


def _check_signature(req: RequestView, claim: _Claim, secret: str, bucket: str | None) -> None:
    provided = signing.utf8(claim.signature)
    candidates = _strings_to_sign(req, claim, bucket)
    for to_sign in candidates:
        digest = hmac.new(signing.utf8(secret), signing.utf8(to_sign), hashlib.sha1).digest()
        if hmac.compare_digest(base64.b64encode(digest), provided):
            return
    raise S3Error(
        Code.SignatureDoesNotMatch,
        fields={
            "AWSAccessKeyId": claim.access_key,
            "StringToSign": candidates[0],
            "SignatureProvided": claim.signature,
            "StringToSignBytes": signing.hex_bytes(candidates[0]),
        },
    )


def _strings_to_sign(req: RequestView, claim: _Claim, bucket: str | None) -> list[str]:
    positional = [
        req.method,
        req.headers.get("Content-MD5", ""),
        req.headers.get("Content-Type", ""),
        claim.date_line,
    ]
    head = "\n".join(positional) + "\n" + _amz_headers(req, claim.presigned)
    return [head + resource for resource in _resources(req, bucket)]


def _amz_headers(req: RequestView, presigned: bool) -> str:
    """x-amz-* lowercased and sorted, repeated values joined with ',', folds unfolded."""
    values: dict[str, list[str]] = {}
    for name, value in req.headers.items():  # a multidict yields every repeated value
        if name.lower().startswith("x-amz-"):
            values.setdefault(name.lower(), []).append(value)
    if presigned:  # botocore presigns x-amz-* headers by moving them into the query
        for name, _, value in _query_items(req.raw_query):
            if name.lower().startswith("x-amz-"):
                values.setdefault(name.lower(), []).append(value)
    return "".join(
        name + ":" + ",".join(_FOLD.sub(" ", v.strip()) for v in values[name]) + "\n"
        for name in sorted(values)
    )


def _resources(req: RequestView, bucket: str | None) -> list[str]:
    """The CanonicalizedResource: the path as sent, with the virtual-host bucket, if any.

    S3 and botocore sign a bucket-only path-style request as '/bucket/' although
    '/bucket' is sent; the path exactly as sent is the fallback.
    """
    path = req.raw_path or "/"
    if bucket is not None:
        path = "/" + bucket + path
    paths = [path + "/", path] if path.count("/") == 1 and path != "/" else [path]
    signed = sorted(
        (item for item in _query_items(req.raw_query) if item[0] in _SUBRESOURCES),
        key=lambda item: item[0],  # stable: repeated names keep their order
    )
    query = "&".join(name + eq + value for name, eq, value in signed)
    return [p + ("?" + query if query else "") for p in paths]


@functools.lru_cache(maxsize=64)  # pure, and asked twice per verification
def _query_items(raw_query: str) -> tuple[tuple[str, str, str], ...]:
    """(name, '=' or '', value), decoded; '+' stays '+', as S3 and botocore sign it."""
    items = []
    for item in raw_query.split("&"):
        if item:
            name, eq, value = item.partition("=")
            items.append((signing.decode(name), eq, signing.decode(value)))
    return tuple(items)
