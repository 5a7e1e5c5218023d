"""CORS preflights: what of an OPTIONS request Hoard checks and passes on.

A browser's preflight is never signed, so no caller's limits can apply to it: Hoard
answers it as S3 does, from the bucket's CORS rules at the origin, and lets nothing
else of the request through. S3 takes a preflight only with an ``Origin`` and an
``Access-Control-Request-Method`` header and refuses it otherwise (400 BadRequest);
Hoard refuses it the same way before anything reaches the origin. What travels on is
those two headers and ``Access-Control-Request-Headers``: no query (an OPTIONS with
``?acl`` is still only a preflight) and no other client header, since the forward
goes out under Hoard's own credentials.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.s3.errors import Code, S3Error

_PASSED_ON = ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers")


def checked_preflight(headers: Mapping[str, str]) -> None:
    """Refuse a preflight S3 would refuse, with S3's messages."""
    if not headers.get("Origin"):
        raise S3Error(Code.BadRequest, "Insufficient information. Origin request header needed.")
    if not headers.get("Access-Control-Request-Method"):
        raise S3Error(Code.BadRequest, "Invalid Access-Control-Request-Method: null")


def preflight_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The only client headers a preflight carries to the origin."""
    return {name: headers[name] for name in _PASSED_ON if name in headers}
