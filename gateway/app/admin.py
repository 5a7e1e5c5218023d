"""Admin endpoints under ``/_hoard/``: cache statistics, cache drops, warm jobs, prefetch.

Every one of them needs a signed request from a configured credential, even
when anonymous S3 reads are allowed; health and readiness (in ``server.py``)
are the only open ones. Answers are JSON, errors are S3 XML-free JSON too:
these are for operators and tools, not S3 clients.

Authorization is the S3 front's rule, ``Principal.authorize``, applied to the
bucket(s) each call names: dropping a cache, warming (with or without pins) and
registering prefetch are writes, so a ``readonly`` key or one whose ``buckets``
leave the bucket out gets 403 ``AccessDenied`` and nothing is started. Job and
stream views show only what lies in buckets the key may use; anything else is
answered as if it did not exist. Node-wide views (stats, cluster) name no
bucket and no object and are open to every configured key; they are the
node's whichever worker answers (``gateway/node/``).

What a call meets on its way (a manifest key the origin refuses, an origin
that is down) is answered as the S3 front would answer it, in JSON: the S3
error's status and code, never a 500.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.blocks.source import BlockSource
from gateway.coherence.invalidator import Invalidator
from gateway.core import errors
from gateway.metadata.memory import MetadataCache
from gateway.obs.metrics import Metrics
from gateway.prefetch.api import PrefetchApi
from gateway.s3.access import denied
from gateway.s3.auth import Authenticator, Principal
from gateway.s3.errors import S3Error, from_domain
from gateway.s3.front import request_view
from gateway.warm.http import PATH as WARM_PATH
from gateway.warm.http import WarmHttp


class Admin:
    def __init__(
        self,
        changes: Invalidator,
        auth: Authenticator,
        metrics: Metrics,
        stats: Callable[[], dict[str, Any]],
        cluster: Callable[[], dict[str, Any]] | None = None,
        prefetch: PrefetchApi | None = None,
        warm: WarmHttp | None = None,
    ) -> None:
        """``changes`` drops a prefix; ``stats`` are the node's (summed over its workers)."""
        self._changes = changes
        self._auth = auth
        self._metrics = metrics
        self._cluster = cluster  # the membership snapshot, in a cluster
        self._prefetch = prefetch
        self._warm = warm
        self._stats = stats

    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        try:
            return await self._handle(request, path)
        except errors.HoardError as exc:
            return _error(from_domain(exc))
        except S3Error as exc:
            return _error(exc)

    async def _handle(self, request: web.Request, path: str) -> web.StreamResponse:
        principal = self._auth.authenticate(request_view(request))
        if principal.anonymous:
            return web.json_response({"error": "AccessDenied"}, status=403)
        if path == "/_hoard/stats" and request.method == "GET":
            return web.json_response(self._stats())
        if path == "/_hoard/cluster" and request.method == "GET":
            return web.json_response(self._cluster_view())
        if path == "/_hoard/cache" and request.method == "DELETE":
            return await self._drop(request, principal)
        if self._prefetch is not None and path.split("/")[2] == "prefetch":
            return await self._prefetch.handle(request, path, principal)
        if self._warm is not None and (path == WARM_PATH or path.startswith(WARM_PATH + "/")):
            return await self._warm.admin(request, path, principal)
        return web.json_response({"error": "NotFound"}, status=404)

    def _cluster_view(self) -> dict[str, Any]:
        """Members, health, last-seen (this node's view) and this node's cached bytes."""
        stats = self._stats()
        disk = stats.get("disk") or {}
        cached = {"memory": stats["memory"]["used_bytes"], "disk": disk.get("used_bytes", 0)}
        if self._cluster is None:
            return {"enabled": False, "live": [], "members": [], "cache_bytes": cached}
        return {"enabled": True, **self._cluster(), "cache_bytes": cached}

    async def _drop(self, request: web.Request, principal: Principal) -> web.StreamResponse:
        bucket = request.query.get("bucket", "")
        prefix = request.query.get("prefix", "")
        if not bucket:
            return web.json_response({"error": "InvalidArgument", "message": "bucket is required"},
                                     status=400)  # fmt: skip
        refused = denied(principal, bucket, mutating=True)
        if refused is not None:
            return refused
        try:
            dropped = await self._changes.drop(bucket, prefix)
        except errors.NoSuchBucket:
            return web.json_response({"error": "NoSuchBucket"}, status=404)
        return web.json_response({"bucket": bucket, "prefix": prefix, **dropped})


def worker_stats(blocks: BlockSource, metadata: MetadataCache) -> dict[str, Any]:
    """This worker's tiers: fill and size figures, for ``/_hoard/stats`` (``node/stats.py``
    sums the workers')."""
    memory, disk = blocks.memory, blocks.disk.stats() if blocks.disk else None
    return {
        "memory": {"used_bytes": memory.used, "capacity": memory.capacity,
                   "blocks": len(memory), "evictions": memory.evictions},
        "disk": dataclasses.asdict(disk) if disk is not None else None,
        "fills": {"started": blocks.fills.started, "coalesced": blocks.fills.joined},
        "metadata": metadata.stats(),
    }  # fmt: skip


def _error(exc: S3Error) -> web.Response:
    return web.json_response({"error": exc.code.name, "message": exc.message}, status=exc.status)
