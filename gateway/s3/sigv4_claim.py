"""What a SigV4 request says about its own signature: both forms parsed into one ``Claim``.

A client signs in one of two places: the ``Authorization`` header, or the
``X-Amz-*`` parameters of a presigned URL. Both name the same things (who
signed, the day and region of the key's scope, the signed headers, the
signature, the request time, the payload hash; a URL also its lifetime), so
both are parsed here into one ``Claim``, and ``sigv4.py`` verifies one shape.

Parsing stands apart from verification because it is where S3's wire rules
and error messages live: which form is used when both are present (neither:
InvalidArgument), which parameters a presigned URL requires, the Credential's
five parts, the payload markers accepted, the headers that must be signed
(Host and every ``x-amz-*``). Nothing here knows a secret or the clock: a
claim is what the request asserts, checked for form only. ``sigv4.py`` then
looks up the key, compares the signature, and only then looks at the time.

The parsers of credentials and signed-header lists are memoised: they are
pure, and clients repeat the same values on every request.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from gateway.core.compiled import twin
from gateway.s3.errors import Code, S3Error
from gateway.s3.signing import (
    NO_DATE,
    RequestView,
    format_amz_date,
    parse_amz_date,
    parse_http_date,
    query_params,
)

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_PRESIGN_EXPIRES = 604800  # seven days, S3's limit for X-Amz-Expires
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_EXPIRES = re.compile(r"-?[0-9]{1,12}")
_PAYLOAD_MARKERS = (
    "UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, STREAMING-AWS4-HMAC-SHA256-PAYLOAD, "
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER, STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD, "
    "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER"
)
_PAYLOAD_MARKER_SET = frozenset(_PAYLOAD_MARKERS.split(", "))
PRESIGN_PARAMS = ("x-amz-algorithm", "x-amz-credential", "x-amz-signature")
_PRESIGN_REQUIRED = (*PRESIGN_PARAMS, "x-amz-date", "x-amz-signedheaders", "x-amz-expires")
_UNSUPPORTED = (
    "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."
)


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost a setattr each
class Claim:
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


def parse_claim(req: RequestView) -> Claim:
    """The request's claim, in whichever form it comes; raises ``S3Error`` as S3 would."""
    authorization = req.headers.get("Authorization", "").strip()
    params = query_params(req.raw_query) if req.raw_query else {}
    query_auth = any(n in params for n in PRESIGN_PARAMS) or "signature" in params
    if authorization and query_auth:
        raise S3Error(
            Code.InvalidArgument,
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
            "Signature query string parameter or the Authorization header should be specified",
            fields={"ArgumentName": "Authorization", "ArgumentValue": authorization},
        )
    if authorization:
        claim = _header_claim(req, authorization)
    elif any(n in params for n in PRESIGN_PARAMS):
        claim = _presigned_claim(req, params)
    elif query_auth:
        raise S3Error(Code.InvalidRequest, _UNSUPPORTED)  # SigV2 URL: sigv2.py's, not ours
    else:
        raise S3Error(Code.AccessDenied)
    _check_headers_signed(req, claim.signed_headers)
    return claim


def _header_claim(req: RequestView, authorization: str) -> Claim:
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
    return Claim(
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


def _presigned_claim(req: RequestView, params: dict[str, str]) -> Claim:
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
    return Claim(access_key, date, region, signed, sig, amz_date, timestamp, payload, expires)


def _parse_expires(value: str) -> int:
    if not _EXPIRES.fullmatch(value):
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
    """'AK/YYYYMMDD/region/s3/aws4_request' -> (AK, date, region): any region here; the
    verifier holds it to the one Hoard serves (``wrong_region``)."""
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


def scope(claim: Claim) -> str:
    return f"{claim.date}/{claim.region}/s3/aws4_request"


def _date_mismatch(date: str, amz_date: str) -> str:
    day = amz_date[:8]
    return f'Invalid credential date "{date}". This date is not the same as X-Amz-Date: "{day}".'


def wrong_region(claim: Claim, expected: str) -> S3Error:
    """S3's answer to a scope naming another region than the endpoint's (checked before
    the key is looked up: the region is part of the credential's form), with the
    region to use, which SDKs read to sign again (botocore's region redirector)."""
    detail = f"the region '{claim.region}' is wrong; expecting '{expected}'"
    error = _malformed(detail) if claim.expires is None else _credential_error(detail)
    return S3Error(error.code, error.message, fields={"Region": expected})


def _malformed(detail: str) -> S3Error:
    return S3Error(
        Code.AuthorizationHeaderMalformed, f"The authorization header is malformed; {detail}"
    )


def _query_error(message: str) -> S3Error:
    return S3Error(Code.AuthorizationQueryParametersError, message)


def _credential_error(detail: str) -> S3Error:
    return _query_error(f"Error parsing the X-Amz-Credential parameter; {detail}")


# The Python path, kept: tests compare it with the compiled one (``core/compiled.py``),
# which parses a well-formed header claim itself and hands every other request to it.
parse_claim_py = parse_claim
_compiled = twin("gateway.s3._sigv4_claim")
if _compiled is not None:
    parse_claim = _compiled.parse_claim
