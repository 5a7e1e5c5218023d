"""The SigV4 signing key: the one derivation both sides of Hoard make.

Hoard checks its clients' signatures (``s3/sigv4.py``) and signs its own
requests to S3 origins (``origins/s3_sign.py``). Both derive the day's key
from a secret with the same chain of four HMACs; it lives here, a leaf module,
because an origin must not import the S3 front (``scripts/check_imports.py``).
Each side keeps the keys it derived for the day: a derivation is four HMACs,
a fair share of a small request's signature work.

A key is used for one more HMAC per request (the signature itself); ``KeyedHmac``
hashes the key's two pads once, so each request's HMAC is two hash copies and
updates (RFC 2104's construction, spelled out) instead of OpenSSL setting up an HMAC
context from the key again: about 1 us of a header-signed hit's 20.
"""

from __future__ import annotations

import hashlib
import hmac

_BLOCK = 64  # SHA-256's block size, in bytes
_IPAD = bytes(b ^ 0x36 for b in range(256))  # translation tables: each key byte XOR the pad
_OPAD = bytes(b ^ 0x5C for b in range(256))


def derive_signing_key(secret: str, date: str, region: str) -> bytes:
    """The SigV4 key chain: "AWS4"+secret -> date -> region -> "s3" -> "aws4_request"."""
    # surrogateescape: a request's undecodable bytes arrive as surrogates; never crash on them.
    key = ("AWS4" + secret).encode("utf-8", "surrogateescape")
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.digest(key, part.encode("utf-8", "surrogateescape"), "sha256")
    return key


class KeyedHmac:
    """HMAC-SHA256 under one ``key`` (RFC 2104), its inner and outer pads hashed once."""

    __slots__ = ("_inner", "_outer", "key")

    def __init__(self, key: bytes) -> None:
        self.key = key
        block = (key if len(key) <= _BLOCK else hashlib.sha256(key).digest()).ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(block.translate(_IPAD))
        self._outer = hashlib.sha256(block.translate(_OPAD))

    def hexdigest(self, message: bytes) -> str:
        """``hmac.digest(key, message, "sha256").hex()``, from the pads' hashed states."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()
