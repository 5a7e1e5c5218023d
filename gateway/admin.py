"""Admin endpoints under ``/_hoard/``: cache statistics and cache drops.

Every one of them needs a signed request from a configured credential, even
when anonymous S3 reads are allowed; health and readiness (in ``server.py``)
are the only open ones. Answers are JSON, errors are S3 XML-free JSON too:
these are for operators and tools, not S3 clients.
"""

from __future__ import annotations

from aiohttp import web

from gateway import errors
from gateway.metrics import Metrics
from gateway.reader import Reader
from gateway.s3.auth import Authenticator
from gateway.s3.errors import S3Error
from gateway.s3.front import request_view


class Admin:
    def __init__(self, reader: Reader, auth: Authenticator, metrics: Metrics) -> None:
        self._reader = reader
        self._auth = auth
        self._metrics = metrics

    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        try:
            principal = self._auth.authenticate(request_view(request))
        except S3Error as exc:
            return web.json_response(
                {"error": exc.code.name, "message": exc.message}, status=exc.status
            )
        if principal.anonymous:
            return web.json_response({"error": "AccessDenied"}, status=403)
        if path == "/_hoard/stats" and request.method == "GET":
            return web.json_response(self._reader.stats())
        if path == "/_hoard/cache" and request.method == "DELETE":
            return await self._drop(request)
        return web.json_response({"error": "NotFound"}, status=404)

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        bucket = request.query.get("bucket", "")
        prefix = request.query.get("prefix", "")
        if not bucket:
            return web.json_response({"error": "InvalidArgument", "message": "bucket is required"},
                                     status=400)  # fmt: skip
        try:
            dropped = await self._reader.drop(bucket, prefix)
        except errors.NoSuchBucket:
            return web.json_response({"error": "NoSuchBucket"}, status=404)
        return web.json_response({"bucket": bucket, "prefix": prefix, **dropped})
