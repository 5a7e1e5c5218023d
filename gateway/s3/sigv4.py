"""AWS Signature Version 4 verification of client requests, the way Amazon S3 does it.

Both forms, the ``Authorization`` header and the presigned URL (``X-Amz-*`` query
parameters), are parsed into one ``_Claim``: who signed, when, which headers, what
signature. One routine then rebuilds the canonical request from the request as
received and compares HMACs. The order of checks is S3's: parse, look up the key,
compare the signature, and only then look at the clock, so a caller without the
secret learns nothing about the server's time or the expiry of a URL.

S3 does not double-encode paths, and neither does this module: the canonical URI is
the path decoded and re-encoded with the AWS rule, with the path exactly as sent as a
fallback for clients that sign their own encoding.

NOT verified here: the payload. ``AuthContext.payload_hash`` is what the client claims
(a hex SHA-256, ``UNSIGNED-PAYLOAD`` or a ``STREAMING-*`` marker); the body reader
checks it, and the aws-chunked decoder checks chunk signatures with ``signing_key`` and
``seed_signature``. Neither are session tokens (there are no temporary credentials),
SigV4a, nor browser POST policies.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.s3.errors import Code, S3Error
from gateway.s3.signing import (
    NO_DATE,
    decode,
    format_amz_date,
    hex_bytes,
    iso,
    parse_amz_date,
    parse_http_date,
    query_params,
    uri_encode,
    utf8,
)
from gateway.sigv4_key import derive_signing_key

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_PRESIGN_EXPIRES = 604800  # seven days, S3's limit for X-Amz-Expires
_MAX_CACHED_KEYS = 1024
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_PAYLOAD_MARKERS = (
    "UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, "
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER, STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD, "
    "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER"
)
_PAYLOAD_MARKER_SET = frozenset(_PAYLOAD_MARKERS.split(", "))
_PRESIGN_PARAMS = ("x-amz-algorithm", "x-amz-credential", "x-amz-signature")
_PRESIGN_REQUIRED = (*_PRESIGN_PARAMS, "x-amz-date", "x-amz-signedheaders", "x-amz-expires")
_UNSUPPORTED = (
    "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."
)


@dataclass(frozen=True, slots=True)
class RequestView:
    """What verification needs of a request, independent of the HTTP framework."""

    method: str
    raw_path: str  # as sent on the request line, percent-encoding intact, no '?query'
    raw_query: str  # as sent, without '?'; '' if none
    headers: Mapping[str, str]  # case-insensitive; repeated headers via getall()


@dataclass(frozen=True, slots=True)
class AuthContext:
    """A verified signature: what later stages (payload, aws-chunked) need of it."""

    access_key: str
    region: str
    amz_date: str  # 'YYYYMMDDTHHMMSSZ'
    scope: str  # 'YYYYMMDD/region/s3/aws4_request'
    signing_key: bytes
    seed_signature: str
    payload_hash: str
    presigned: bool


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost a setattr each
class _Claim:
    """What a request says about its own signature, before anything is checked."""

    access_key: str
    date: str  # the scope's YYYYMMDD
    region: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str
    timestamp: float
    payload_hash: str
    expires: int | None  # presigned URLs only


def is_signed(req: RequestView) -> bool:
    """True when the request claims credentials, in any form S3 recognises."""
    if req.headers.get("Authorization", "").strip():
        return True
    names = query_params(req.raw_query)
    # SigV2 query auth counts as signed, never as anonymous: auth.py hands it to sigv2.py.
    return (
        any(n in names for n in _PRESIGN_PARAMS) or {"awsaccesskeyid", "signature"} <= names.keys()
    )


class SigV4Verifier:
    """Verifies SigV4 signatures against a table of access key -> secret key."""

    def __init__(
        self,
        secrets: Mapping[str, str],
        *,
        max_skew: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secrets = secrets
        self._max_skew = max_skew
        self._clock = clock
        self._keys: dict[tuple[str, str, str], bytes] = {}

    def verify(self, req: RequestView) -> AuthContext:
        """Check the request's signature; returns its context, raises ``S3Error``."""
        claim = _claim(req)
        secret = self._secrets.get(claim.access_key)
        if secret is None:
            fields = {"AWSAccessKeyId": claim.access_key}
            raise S3Error(Code.InvalidAccessKeyId, fields=fields)
        key = self.signing_key(secret, claim.date, claim.region)
        _check_signature(req, claim, key)
        self._check_time(claim)
        return AuthContext(
            access_key=claim.access_key,
            region=claim.region,
            amz_date=claim.amz_date,
            scope=_scope(claim),
            signing_key=key,
            seed_signature=claim.signature,
            payload_hash=claim.payload_hash,
            presigned=claim.expires is not None,
        )

    def signing_key(self, secret: str, date: str, region: str) -> bytes:
        """The derived key for one day and region, cached: four HMACs saved per request."""
        cache_key = (secret, date, region)
        key = self._keys.get(cache_key)
        if key is None:
            if len(self._keys) >= _MAX_CACHED_KEYS:
                self._keys.clear()  # keys roll over daily; a crude bound is enough
            key = self._keys[cache_key] = derive_signing_key(secret, date, region)
        return key

    def _check_time(self, claim: _Claim) -> None:
        now = self._clock()
        if claim.expires is None:
            if abs(now - claim.timestamp) > self._max_skew:
                raise S3Error(
                    Code.RequestTimeTooSkewed,
                    "The difference between the request time and the current time is too large.",
                    fields={
                        "RequestTime": claim.amz_date,
                        "ServerTime": iso(now),
                        "MaxAllowedSkewMilliseconds": str(int(self._max_skew * 1000)),
                    },
                )
            return
        if claim.timestamp - now > self._max_skew:
            fields = {"X-Amz-Date": claim.amz_date, "ServerTime": iso(now)}
            raise S3Error(Code.AccessDenied, "Request is not valid yet", fields=fields)
        # S3 never accepts X-Amz-Expires=0, not even within its first second.
        if claim.expires == 0 or now > claim.timestamp + claim.expires:
            expires_at = iso(claim.timestamp + claim.expires)
            fields = {"X-Amz-Expires": str(claim.expires), "Expires": expires_at}
            fields["ServerTime"] = iso(now)
            raise S3Error(Code.AccessDenied, "Request has expired", fields=fields)


# --- parsing: request -> _Claim -------------------------------------------------------


def _claim(req: RequestView) -> _Claim:
    authorization = req.headers.get("Authorization", "").strip()
    params = query_params(req.raw_query) if req.raw_query else {}
    query_auth = any(n in params for n in _PRESIGN_PARAMS) or "signature" in params
    if authorization and query_auth:
        raise S3Error(
            Code.InvalidArgument,
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
            "Signature query string parameter or the Authorization header should be specified",
            fields={"ArgumentName": "Authorization", "ArgumentValue": authorization},
        )
    if authorization:
        claim = _header_claim(req, authorization)
    elif any(n in params for n in _PRESIGN_PARAMS):
        claim = _presigned_claim(req, params)
    elif query_auth:
        raise S3Error(Code.InvalidRequest, _UNSUPPORTED)  # SigV2 URL: sigv2.py's, not ours
    else:
        raise S3Error(Code.AccessDenied)
    _check_headers_signed(req, claim.signed_headers)
    return claim


def _header_claim(req: RequestView, authorization: str) -> _Claim:
    scheme, _, rest = authorization.partition(" ")  # the header was stripped already
    if scheme != ALGORITHM:
        if scheme == "AWS" or scheme.startswith("AWS4-"):  # SigV2 (sigv2.py's), SigV4a...
            raise S3Error(Code.InvalidRequest, _UNSUPPORTED)
        fields = {"ArgumentName": "Authorization", "ArgumentValue": authorization}
        raise S3Error(Code.InvalidArgument, "Unsupported Authorization Type", fields=fields)
    parts = _auth_components(rest)
    access_key, date, region = _parse_credential(parts["Credential"], _malformed)
    timestamp = _request_time(req)
    amz_date = format_amz_date(timestamp)
    if date != amz_date[:8]:
        raise _malformed(_date_mismatch(date, amz_date))
    payload_hash = req.headers.get("x-amz-content-sha256")
    if payload_hash is None:
        raise S3Error(
            Code.InvalidRequest, "Missing required header for this request: x-amz-content-sha256"
        )
    if payload_hash not in _PAYLOAD_MARKER_SET and not _SHA256_HEX.fullmatch(payload_hash):
        message = f"x-amz-content-sha256 must be {_PAYLOAD_MARKERS} or a valid sha256 value."
        fields = {"ArgumentName": "x-amz-content-sha256", "ArgumentValue": payload_hash}
        raise S3Error(Code.InvalidArgument, message, fields=fields)
    signed = _signed_headers(parts["SignedHeaders"])
    signature = parts["Signature"].lower()  # S3 accepts the hex in either case
    return _Claim(
        access_key, date, region, signed, signature, amz_date, timestamp, payload_hash, None
    )


def _auth_components(rest: str) -> dict[str, str]:
    """Credential, SignedHeaders and Signature, separated by commas and/or spaces."""
    parts: dict[str, str] = {}
    # Split on commas and whitespace (str.split's whitespace is re's \s, both Py_UNICODE_ISSPACE).
    for item in rest.replace(",", " ").split():
        name, eq, value = item.partition("=")
        if not eq:
            if item:
                raise _malformed(f'the authorization component "{item}" is malformed.')
            continue
        parts[name] = value
    if not {"Credential", "SignedHeaders", "Signature"} <= parts.keys():
        raise _malformed(
            "the authorization header requires three components: "
            "Credential, SignedHeaders, and Signature."
        )
    return parts


def _presigned_claim(req: RequestView, params: dict[str, str]) -> _Claim:
    if not all(n in params for n in _PRESIGN_REQUIRED):
        raise _query_error(
            "Query-string authentication version 4 requires the X-Amz-Algorithm, "
            "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, "
            "and X-Amz-Expires parameters."
        )
    if params["x-amz-algorithm"] != ALGORITHM:
        raise _query_error(f'X-Amz-Algorithm only supports "{ALGORITHM}"')
    access_key, date, region = _parse_credential(params["x-amz-credential"], _credential_error)
    amz_date = params["x-amz-date"]
    timestamp = parse_amz_date(amz_date)
    if timestamp is None:
        raise _query_error("X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"")
    if date != amz_date[:8]:
        raise _query_error(_date_mismatch(date, amz_date))
    expires = _parse_expires(params["x-amz-expires"])
    signed = _signed_headers(params["x-amz-signedheaders"])
    # Unsigned unless the URL carries a hash, or the client signed the header that does.
    payload = params.get("x-amz-content-sha256")
    if payload is None and "x-amz-content-sha256" in signed:
        payload = req.headers.get("x-amz-content-sha256")
    payload = payload or UNSIGNED_PAYLOAD
    sig = params["x-amz-signature"].lower()
    return _Claim(access_key, date, region, signed, sig, amz_date, timestamp, payload, expires)


def _parse_expires(value: str) -> int:
    if not re.fullmatch(r"-?[0-9]{1,12}", value):
        raise _query_error("X-Amz-Expires should be a number")
    expires = int(value)
    if expires < 0:
        raise _query_error("X-Amz-Expires must be non-negative")
    if expires > MAX_PRESIGN_EXPIRES:
        raise _query_error(
            "X-Amz-Expires must be less than a week (in seconds); that is, "
            f"the given X-Amz-Expires must be less than {MAX_PRESIGN_EXPIRES} seconds"
        )
    return expires


@functools.lru_cache(maxsize=4096)  # pure: clients repeat credentials, dates and header lists
def _parse_credential(value: str, fail: Callable[[str], S3Error]) -> tuple[str, str, str]:
    """'AK/YYYYMMDD/region/s3/aws4_request' -> (AK, date, region); any region is accepted."""
    parts = value.split("/")
    if len(parts) != 5:
        raise fail(
            'the Credential is mal-formed; expecting "<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/'
            'aws4_request".'
        )
    access_key, date, region, service, terminal = parts
    if not access_key:
        raise fail("a non-empty Access Key (AKID) must be provided in the credential.")
    if not re.fullmatch(r"[0-9]{8}", date):
        raise fail(
            f'incorrect date format "{date}". This date in the credential must be in the '
            'format "yyyyMMdd".'
        )
    if service != "s3":
        raise fail(f'incorrect service "{service}". This endpoint belongs to "s3".')
    if terminal != "aws4_request":
        raise fail(f'incorrect terminal "{terminal}". This endpoint uses "aws4_request".')
    return access_key, date, region


@functools.lru_cache(maxsize=4096)  # pure: clients repeat credentials, dates and header lists
def _signed_headers(value: str) -> tuple[str, ...]:
    return tuple(n.strip().lower() for n in value.split(";") if n.strip())


def _check_headers_signed(req: RequestView, signed: tuple[str, ...]) -> None:
    """S3 insists on a signed Host (no replay to another bucket) and on every x-amz-* header."""
    unsigned = sorted({
        lower for name in req.headers
        if (lower := name.lower()).startswith("x-amz-") and lower not in signed
    })  # fmt: skip
    if "host" not in signed:
        unsigned.insert(0, "host")
    if unsigned:
        raise S3Error(
            Code.AccessDenied,
            "There were headers present in the request which were not signed",
            fields={"HeadersNotSigned": ", ".join(unsigned)},
        )


def _request_time(req: RequestView) -> float:
    """x-amz-date, else the HTTP Date header (RFC 7231 IMF-fixdate), as S3 accepts."""
    amz_date = req.headers.get("x-amz-date")
    if amz_date is not None:
        timestamp = parse_amz_date(amz_date)
    else:
        timestamp = parse_http_date(req.headers.get("Date", ""))
    if timestamp is None:
        raise S3Error(Code.AccessDenied, NO_DATE)
    return timestamp


# --- the canonical request and the comparison ------------------------------------------


def _check_signature(req: RequestView, claim: _Claim, key: bytes) -> None:
    query = _canonical_query(req.raw_query, presigned=claim.expires is not None)
    headers, complete = _canonical_headers(req, claim.signed_headers)
    provided = utf8(claim.signature)
    first: tuple[str, str] | None = None
    for uri in _candidate_uris(req.raw_path):
        request = "\n".join(
            [req.method, uri, query, headers, ";".join(claim.signed_headers), claim.payload_hash]
        )
        digest = hashlib.sha256(utf8(request)).hexdigest()
        to_sign = f"{ALGORITHM}\n{claim.amz_date}\n{_scope(claim)}\n{digest}"
        expected = utf8(hmac.digest(key, utf8(to_sign), "sha256").hex())  # one-shot: C only
        # A signed header the request lacks fails even if the client signed it as empty.
        if hmac.compare_digest(expected, provided) and complete:
            return
        first = first or (request, to_sign)
    request, to_sign = first or ("", "")  # never empty: there is always one candidate
    raise S3Error(
        Code.SignatureDoesNotMatch,
        fields={
            "AWSAccessKeyId": claim.access_key,
            "StringToSign": to_sign,
            "SignatureProvided": claim.signature,
            "StringToSignBytes": hex_bytes(to_sign),
            "CanonicalRequest": request,
            "CanonicalRequestBytes": hex_bytes(request),
        },
    )


@functools.lru_cache(maxsize=65_536)  # pure; a header-signed hit re-reads the same paths
def _candidate_uris(raw_path: str) -> tuple[str, ...]:
    """S3's form first (decode, then encode once); then the path exactly as sent."""
    raw_path = raw_path or "/"
    canonical = uri_encode(raw_path, safe="/")
    return (canonical,) if canonical == raw_path else (canonical, raw_path)


def _canonical_query(raw_query: str, *, presigned: bool) -> str:
    if not raw_query:
        return ""
    pairs = []
    for item in raw_query.split("&"):
        if not item:
            continue
        name, _, value = item.partition("=")
        if presigned and decode(name).lower() == "x-amz-signature":
            continue  # the signature cannot sign itself
        pairs.append((uri_encode(name, safe=""), uri_encode(value, safe="")))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _canonical_headers(req: RequestView, names: tuple[str, ...]) -> tuple[str, bool]:
    """The header block of the canonical request, and whether every signed header was there."""
    getall = getattr(req.headers, "getall", None)
    lines, complete = [], True
    for name in names:
        if getall is not None:
            values = getall(name, ())
        else:
            values = [v for v in [req.headers.get(name)] if v is not None]
        if len(values) == 1:  # the usual case: one value, no list to join
            lines.append(f"{name}:{' '.join(values[0].split())}\n")
            continue
        complete = complete and bool(values)
        # Trim and collapse inner whitespace; repeated headers are joined with ','.
        lines.append(name + ":" + ",".join(" ".join(v.split()) for v in values) + "\n")
    return "".join(lines), complete


# --- small helpers ---------------------------------------------------------------------


def _scope(claim: _Claim) -> str:
    return f"{claim.date}/{claim.region}/s3/aws4_request"


def _date_mismatch(date: str, amz_date: str) -> str:
    day = amz_date[:8]
    return f'Invalid credential date "{date}". This date is not the same as X-Amz-Date: "{day}".'


def _malformed(detail: str) -> S3Error:
    return S3Error(
        Code.AuthorizationHeaderMalformed, f"The authorization header is malformed; {detail}"
    )


def _query_error(message: str) -> S3Error:
    return S3Error(Code.AuthorizationQueryParametersError, message)


def _credential_error(detail: str) -> S3Error:
    return _query_error(f"Error parsing the X-Amz-Credential parameter; {detail}")
