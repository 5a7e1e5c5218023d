"""AWS Signature Version 4 verification of client requests, the way Amazon S3 does it.

Both forms, the ``Authorization`` header and the presigned URL (``X-Amz-*`` query
parameters), are parsed into one ``Claim`` (``sigv4_claim.py``: who signed, when,
which headers, what signature; S3's rules of form and its error messages). This
module then rebuilds the canonical request from the request as received and
compares HMACs. The order of checks is S3's: parse, look up the key,
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

from gateway.core.compiled import twin
from gateway.core.sigv4_key import KeyedHmac, derive_signing_key
from gateway.s3.errors import Code, S3Error
from gateway.s3.signing import RequestView, decode, hex_bytes, iso, query_params, uri_encode, utf8
from gateway.s3.sigv4_claim import (
    ALGORITHM,
    PRESIGN_PARAMS,
    Claim,
    parse_claim,
    scope,
    wrong_region,
)

# A scope naming no region: what Tigris and R2 document and their clients sign with.
ANY_REGION = "auto"

_MAX_CACHED_KEYS = 1024


@dataclass(slots=True)  # not frozen: built per request (frozen fields cost a setattr each)
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


def is_signed(req: RequestView) -> bool:
    """True when the request claims credentials, in any form S3 recognises."""
    if req.headers.get("Authorization", "").strip():
        return True
    names = query_params(req.raw_query)
    # SigV2 query auth counts as signed, never as anonymous: auth.py hands it to sigv2.py.
    return not names.keys().isdisjoint(PRESIGN_PARAMS) or (
        "signature" in names and "awsaccesskeyid" in names
    )


class SigV4Verifier:
    """Verifies SigV4 signatures against a table of access key -> secret key."""

    def __init__(
        self,
        secrets: Mapping[str, str],
        *,
        region: str | None = None,
        max_skew: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secrets = secrets
        self._region = region  # the one a scope must name; None: any
        self._max_skew = max_skew
        self._clock = clock
        self._keys: dict[tuple[str, str, str], KeyedHmac] = {}

    @property
    def max_skew(self) -> float:
        """How far a header-signed request's time may be from the clock's, in seconds."""
        return self._max_skew

    def verify(self, req: RequestView) -> AuthContext:
        """Check the request's signature; returns its context, raises ``S3Error``."""
        claim, signer = self.claimed(req)
        return AuthContext(
            access_key=claim.access_key,
            region=claim.region,
            amz_date=claim.amz_date,
            scope=scope(claim),
            signing_key=signer.key,
            seed_signature=claim.signature,
            payload_hash=claim.payload_hash,
            presigned=claim.expires is not None,
        )

    def claimed(self, req: RequestView) -> tuple[Claim, KeyedHmac]:
        """The request's claim, its signature checked, and the HMAC of the key it was
        checked with; raises ``S3Error``."""
        claim = parse_claim(req)
        if self._region is not None and claim.region not in (self._region, ANY_REGION):
            raise wrong_region(claim, self._region)
        secret = self._secrets.get(claim.access_key)
        if secret is None:
            fields = {"AWSAccessKeyId": claim.access_key}
            raise S3Error(Code.InvalidAccessKeyId, fields=fields)
        signer = self._signer(secret, claim.date, claim.region)
        _check_signature(req, claim, signer)
        self._check_time(claim)
        return claim, signer

    def signing_key(self, secret: str, date: str, region: str) -> bytes:
        """The derived key for one day and region, cached: four HMACs saved per request."""
        return self._signer(secret, date, region).key

    def _signer(self, secret: str, date: str, region: str) -> KeyedHmac:
        """The HMAC of the derived key for one day and region, derived once and kept."""
        cache_key = (secret, date, region)
        signer = self._keys.get(cache_key)
        if signer is None:
            if len(self._keys) >= _MAX_CACHED_KEYS:
                self._keys.clear()  # keys roll over daily; a crude bound is enough
            signer = KeyedHmac(derive_signing_key(secret, date, region))
            self._keys[cache_key] = signer
        return signer

    def _check_time(self, claim: Claim) -> None:
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


# --- the canonical request and the comparison ------------------------------------------


def _check_signature(req: RequestView, claim: Claim, signer: KeyedHmac) -> None:
    query = _canonical_query(req.raw_query, presigned=claim.expires is not None)
    headers, complete = _canonical_headers(req, claim.signed_headers)
    provided = utf8(claim.signature)
    first: tuple[str, str] | None = None
    for uri in _candidate_uris(req.raw_path):
        request = "\n".join(
            [req.method, uri, query, headers, ";".join(claim.signed_headers), claim.payload_hash]
        )
        digest = hashlib.sha256(utf8(request)).hexdigest()
        to_sign = f"{ALGORITHM}\n{claim.amz_date}\n{scope(claim)}\n{digest}"
        expected = utf8(signer.hexdigest(utf8(to_sign)))
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


# Pure; a header-signed hit re-reads the same paths. A hot set only (~0.2 KB a path, a
# miss ~2 us): at 65,536 every fresh key's path was kept, ~13 MB a worker (issue 34).
CANDIDATES_KEPT = 4096


@functools.lru_cache(maxsize=CANDIDATES_KEPT)
def _candidate_uris(raw_path: str) -> tuple[str, ...]:
    """S3's form first (decode, then encode once); then the path exactly as sent."""
    raw_path = raw_path or "/"
    canonical = uri_encode(raw_path, safe="/")
    return (canonical,) if canonical == raw_path else (canonical, raw_path)


# A query part already in canonical form: unreserved characters, and escapes (upper-case
# hex) of bytes that are not unreserved. Decoded and encoded again, such a part is itself.
_KEPT_ESCAPE = r"%(?:[01][0-9A-F]|2[0-9ABCF]|3[A-F]|40|5[B-E]|60|7[B-DF]|[89A-F][0-9A-F])"
_CANONICAL_PART = rf"(?:[A-Za-z0-9_.~-]++|{_KEPT_ESCAPE})*+"  # possessive: runs, no backtracking
_CANONICAL_QUERY = re.compile(rf"{_CANONICAL_PART}(?:={_CANONICAL_PART})?"
                              rf"(?:&{_CANONICAL_PART}(?:={_CANONICAL_PART})?)*")  # fmt: skip


def _canonical_query(raw_query: str, *, presigned: bool) -> str:
    if not raw_query:
        return ""
    # Most queries (every presigned URL's) are canonical already: only sorted.
    canonical = _CANONICAL_QUERY.fullmatch(raw_query) is not None
    pairs = []
    for item in raw_query.split("&"):
        if not item:
            continue
        name, _, value = item.partition("=")
        # A canonical name spelling x-amz-signature has no escape: its letters are plain.
        if presigned and (name if canonical else decode(name)).lower() == "x-amz-signature":
            continue  # the signature cannot sign itself
        if not canonical:
            name, value = uri_encode(name, safe=""), uri_encode(value, safe="")
        pairs.append((name, value))
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


# The Python path, kept: tests compare it with the compiled one (``core/compiled.py``),
# which checks a signature that matches on its first candidate and hands the rest to it.
_check_signature_py = _check_signature
_compiled = twin("gateway.s3._sigv4")
if _compiled is not None:
    _check_signature = _compiled._check_signature
