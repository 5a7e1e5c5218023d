"""The prefetch endpoints, and the peer messages that carry registrations across a cluster.

- ``POST /_hoard/prefetch`` with an order (see ``order.py``) → 200 and the
  stream's status; 400 with ``{"error", "message"}`` when a bound is broken.
- ``GET /_hoard/prefetch/{id}`` → position, window, bytes ahead and in flight, lookups in flight.
- ``DELETE /_hoard/prefetch/{id}`` → 200 ``{"stream", "dropped": true}``.

Each call is checked against the key's ``buckets``/``readonly`` limits with the
rule of ``gateway/access.py``: registering and dropping are writes on the
stream's bucket (a registration may not replace another bucket's stream of the
same id), a stream in a bucket the key may not use is not found (404
``NoSuchStream``, on a registration reusing its id too: a 403 would tell it exists).

In a cluster, a registration or a drop accepted here is passed to every other
live node (signed peer messages ``prefetch`` and ``prefetch-drop``); there
the stream waits, inactive, for its first GET (see the package docstring).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.config.settings import PrefetchConfig
from gateway.core import errors
from gateway.prefetch.node import NodePrefetch
from gateway.prefetch.order import Order, OrderError, manifest_keys, parse_request
from gateway.read.manifests import read_manifest
from gateway.s3.access import denied, json_error
from gateway.s3.auth import Principal

if TYPE_CHECKING:
    from gateway.read.reader import Reader

log = logging.getLogger(__name__)

PATH = "/_hoard/prefetch"
MAX_ORDER_BYTES = 64 * 1024**2  # a registration's body, or its manifest; bigger: split the epoch
PEER_REGISTER, PEER_DROP = "prefetch", "prefetch-drop"

Announce = Callable[[str, bytes], Awaitable[None]]


class PrefetchApi:
    def __init__(
        self,
        node: NodePrefetch,
        reader: Reader,
        config: PrefetchConfig,
        announce: Announce | None = None,
    ) -> None:
        self._node = node
        self._reader = reader
        self._config = config
        self._announce = announce  # tells the other live nodes, in a cluster

    async def handle(
        self, request: web.Request, path: str, principal: Principal
    ) -> web.StreamResponse:
        """Answer a signed request under ``/_hoard/prefetch`` by ``principal``."""
        try:
            if path == PATH and request.method == "POST":
                return await self._register(request, principal)
            stream_id = path.removeprefix(PATH + "/")
            if path.startswith(PATH + "/") and request.method in ("GET", "DELETE"):
                found = await self._node.status(stream_id)
                if found is None or not principal.may_use(found["bucket"]):
                    return _no_stream(stream_id)
                if request.method == "GET":
                    return web.json_response(found)
                return denied(principal, found["bucket"], True) or await self._drop(stream_id)
        except OrderError as exc:
            return json_error(400, exc.code, exc.message)
        return json_error(404, "NotFound", f"no endpoint {request.method} {path}")

    async def _register(self, request: web.Request, principal: Principal) -> web.StreamResponse:
        body = await _read_bounded(request)
        try:
            asked = parse_request(json.loads(body), self._config)
        except ValueError as exc:
            if isinstance(exc, OrderError):
                raise
            raise OrderError("InvalidRequest", f"the body is not JSON: {exc}") from None
        refused = denied(principal, asked.bucket, mutating=True)
        if refused is not None:
            return refused
        replaced = self._node.bucket_of(asked.stream)
        if replaced is not None and replaced != asked.bucket:
            if not principal.may_use(replaced):  # not found, as GET and DELETE say
                return _no_stream(asked.stream)
            refused = denied(principal, replaced, mutating=True)
            if refused is not None:
                return refused
        keys = asked.keys
        if keys is None:
            assert asked.manifest is not None
            keys = manifest_keys(await self._manifest(asked.bucket, asked.manifest), self._config)
        order = Order(asked.stream, asked.bucket, keys, asked.window)
        self._node.register(order)
        if self._announce is not None:
            await self._announce(PEER_REGISTER, json.dumps(order.as_json()).encode())
        return web.json_response(await self._node.status(order.stream) or {})

    async def _drop(self, stream_id: str) -> web.StreamResponse:
        dropped = self._node.drop(stream_id)
        if self._announce is not None:
            await self._announce(PEER_DROP, json.dumps({"stream": stream_id}).encode())
        return web.json_response({"stream": stream_id, "dropped": True}) if dropped else (
            _no_stream(stream_id))  # fmt: skip

    async def _manifest(self, bucket: str, key: str) -> str:
        try:
            data = await read_manifest(self._reader, bucket, key, MAX_ORDER_BYTES)
        except errors.NotFound as exc:
            raise OrderError("NoSuchManifest", f"manifest {bucket}/{key}: {exc}") from None
        except ValueError:
            raise OrderError(
                "ManifestTooLarge", f"a manifest may hold {MAX_ORDER_BYTES} bytes"
            ) from None
        return data.decode("utf-8", "replace")

    async def on_peer(self, name: str, body: bytes) -> None:
        """A registration or drop another node accepted (a signed peer message)."""
        data = json.loads(body)
        if name == PEER_REGISTER:
            keys = tuple(data["keys"])
            order = Order(data["stream"], data["bucket"], keys, int(data["window"]))
            self._node.register(order, active=False)
        elif name == PEER_DROP:
            self._node.drop(data["stream"])


async def _read_bounded(request: web.Request) -> bytes:
    parts, size = [], 0
    async for chunk in request.content.iter_chunked(1024 * 1024):
        size += len(chunk)
        if size > MAX_ORDER_BYTES:
            raise OrderError("OrderTooLarge",
                             f"a registration may hold {MAX_ORDER_BYTES} bytes: use a manifest "
                             "or register the epoch in parts")  # fmt: skip
        parts.append(chunk)
    return b"".join(parts)


def _no_stream(stream_id: str) -> web.Response:
    return json_error(
        404, "NoSuchStream", f"no prefetch stream {stream_id!r} (expired or never registered)"
    )
