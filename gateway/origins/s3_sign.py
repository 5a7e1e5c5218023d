"""SigV4 signatures of requests to an S3 origin, made as botocore's ``S3SigV4Auth`` makes them.

Every origin request is signed, and a cold small object costs one origin GET:
botocore's signer, which builds an ``AWSRequest``, splits and re-joins its URL
and derives the day's key with four HMACs for every request, cost about as
much CPU as the rest of the GET's client side (measured: ~0.2-0.5 ms a
signature on the loopback benchmark's machine). This module makes the same
headers from strings, with the derived key kept for the day and region.

What it signs is what botocore signs for S3, header auth: the method; the
path as it is in the URL (S3 paths are not normalised, and ``origin_url``
encoded it once already); the query's ``name=value`` pairs, sorted, as they
are in the URL (``name`` alone signs as ``name=``); every header but the
ones botocore leaves out (``SIGNED_HEADERS_BLACKLIST``), names lower-cased,
values trimmed with inner runs of whitespace collapsed, sorted by name; the
payload's hash (an empty body's, or ``UNSIGNED-PAYLOAD`` for a streamed one).
It adds ``X-Amz-Date`` (or re-dates a ``Date`` header, as botocore does), ``X-Amz-Content-SHA256``, ``X-Amz-Security-Token``
(temporary credentials) and ``Authorization``. ``tests/test_s3_sign.py``
holds it to botocore's output on the shapes of request Hoard sends.

Not covered: query-string (presigned) signatures, SigV4A, chunked payload
signatures; Hoard sends none of these to an origin.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from email.utils import formatdate
from urllib.parse import urlsplit

from botocore.auth import SIGNED_HEADERS_BLACKLIST
from botocore.credentials import ReadOnlyCredentials

from gateway.core.sigv4_key import derive_signing_key

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_UNSIGNED_HEADERS = frozenset(SIGNED_HEADERS_BLACKLIST)
# What add_auth replaces: a header of the same name already there is dropped first.
_MADE = frozenset({"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"})
_KEYS_KEPT = 16  # derived keys: one per day, region and secret in use; a crude bound


class Signer:
    """Signs origin requests for one region, keeping each day's derived key."""

    def __init__(self, region: str) -> None:
        self._region = region
        self._keys: dict[tuple[str, str], bytes] = {}

    def sign(
        self,
        credentials: ReadOnlyCredentials,
        method: str,
        url: str,
        headers: dict[str, str],
        payload_hash: str = EMPTY_SHA256,
        now: float | None = None,
    ) -> dict[str, str]:
        """``headers`` (which name the ``Host``, as every caller here does; else the
        URL's) with the signature's headers added, as a new dict."""
        when = time.time() if now is None else now
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
        day = stamp[:8]
        out = {name: value for name, value in headers.items() if name.lower() not in _MADE}
        if any(name.lower() == "date" for name in out):  # botocore then signs Date, re-dated
            out = {name: value for name, value in out.items() if name.lower() != "date"}
            out["Date"] = formatdate(int(when))
        else:
            out["X-Amz-Date"] = stamp
        out["X-Amz-Content-SHA256"] = payload_hash
        if credentials.token:
            out["X-Amz-Security-Token"] = credentials.token
        parts = urlsplit(url)
        if not any(name.lower() == "host" for name in out):
            out["Host"] = parts.netloc
        signed = sorted(
            (name.lower(), " ".join(value.split()))
            for name, value in out.items()
            if name.lower() not in _UNSIGNED_HEADERS
        )
        names = ";".join(name for name, _ in signed)
        canonical = "\n".join((
            method,
            parts.path or "/",
            _canonical_query(parts.query),
            "".join(f"{name}:{value}\n" for name, value in signed),
            names,
            payload_hash,
        ))  # fmt: skip
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = "\n".join((
            "AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()
        ))  # fmt: skip
        key = self._key(credentials.secret_key, day)
        signature = hmac.digest(key, to_sign.encode(), "sha256").hex()
        out["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={names}, Signature={signature}"
        )
        return out

    def _key(self, secret: str, day: str) -> bytes:
        key = self._keys.get((secret, day))
        if key is None:
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            key = self._keys[(secret, day)] = derive_signing_key(secret, day, self._region)
        return key


def _canonical_query(query: str) -> str:
    """The URL's query as botocore signs it for S3: pairs sorted, encoded as sent."""
    if not query:
        return ""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
    return "&".join(f"{name}={value}" for name, value in pairs)
