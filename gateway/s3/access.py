"""Who may do what through ``/_hoard/``: one authorization rule for every admin entry point.

The S3 front decides with ``Principal.authorize``: a key limited by ``buckets``
may name only those buckets, and a ``readonly`` (or anonymous) caller may not
change anything. The admin endpoints (cache drops, warm jobs, pins, prefetch)
name buckets too, and apply the very same rule here, so a key's limits mean
the same on every port of entry. What the admin API changes is the cache, not
the origin, yet it spends the node's disk, pins and origin bandwidth on the
named bucket and reads its objects (a manifest): warming, pinning, dropping
and registering prefetch count as writes, status views as reads.

A job or stream in a bucket the caller may not use is answered as if it did
not exist (404), so its id cannot be probed; one the caller may see but not
change is 403 ``AccessDenied``.
"""

from __future__ import annotations

from aiohttp import web

from gateway.s3.auth import Principal
from gateway.s3.errors import S3Error


def json_error(status: int, code: str, message: str) -> web.Response:
    """An admin error: ``{"error", "message"}`` with the HTTP status."""
    return web.json_response({"error": code, "message": message}, status=status)


def denied(principal: Principal, bucket: str, mutating: bool) -> web.Response | None:
    """403 ``AccessDenied`` unless ``principal`` may do this to ``bucket``, else None."""
    try:
        principal.authorize(bucket, mutating)
    except S3Error as exc:
        verb = "change" if mutating else "read"
        return json_error(exc.status, exc.code.name, f"this key may not {verb} bucket {bucket!r}")
    return None
