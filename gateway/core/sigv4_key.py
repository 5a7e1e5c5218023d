"""The SigV4 signing key: the one derivation both sides of Hoard make.

Hoard checks its clients' signatures (``s3/sigv4.py``) and signs its own
requests to S3 origins (``origins/s3_sign.py``). Both derive the day's key
from a secret with the same chain of four HMACs; it lives here, a leaf module,
because an origin must not import the S3 front (``scripts/check_imports.py``).
Each side keeps the keys it derived for the day: a derivation is four HMACs,
a fair share of a small request's signature work.
"""

from __future__ import annotations

import hmac


def derive_signing_key(secret: str, date: str, region: str) -> bytes:
    """The SigV4 key chain: "AWS4"+secret -> date -> region -> "s3" -> "aws4_request"."""
    # surrogateescape: a request's undecodable bytes arrive as surrogates; never crash on them.
    key = ("AWS4" + secret).encode("utf-8", "surrogateescape")
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.digest(key, part.encode("utf-8", "surrogateescape"), "sha256")
    return key
