"""What the origin says of a bucket as a whole (its CORS rules), held for the mount's TTL.

A browser reading a bucket through Hoard sends ``Origin`` with every GET and
HEAD, and each answer needs the bucket's CORS rules; asking the origin each
time would put a GetBucketCors in front of every cached read. So a bucket's
configuration of one ``kind`` is asked once per TTL per worker: held per
(scope, kind) with the time it was asked, fresh until ``asked + ttl``, and a
miss runs as one flight per (scope, kind) (``singleflight.Group``), so a
storm of requests costs one origin call. The value is whatever ``fetch``
returns (parsed by the caller: this module knows no S3 XML).

A write of the bucket's configuration through Hoard is a bucket-level change:
the writer invalidates the whole bucket (a prefix invalidation), which reaches
``forget`` in this worker and, through the node's journal, in its siblings
before their next request (``source.forget_locally``); a flight that began
before it is detached and does not store what it read. ``clear`` is the
journal's "forget everything".

A fetch that fails (``HoardError``: the origin unreachable, say) is held for
``retry_after`` seconds (the mount's negative TTL) as what answers: a value
held from before is served again (stale-if-error), else the failure is raised
again without asking, so an origin outage costs one GetBucketCors per
``retry_after``, not one per request, and the reads it does not stop are not
slowed by it.

Not guaranteed: a change made at the origin behind Hoard's back shows after the TTL
(never with ``forever``). Held per worker, not in the node's store: a bucket's
configuration is one small answer, asked once per TTL by each worker. At most
``limit`` buckets are held, least recently asked dropped first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any

from gateway.cache.singleflight import Group
from gateway.core.errors import HoardError

ConfigKey = tuple[Hashable, str]  # (scope, kind)


class _Failed:
    """A fetch's failure, held in place of a value for ``retry_after``."""

    __slots__ = ("error",)

    def __init__(self, error: HoardError) -> None:
        self.error = error


class BucketConfigs:
    """Bucket-level answers of the origin, by (scope, kind), each fresh for its TTL."""

    def __init__(self, limit: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._limit = limit
        self._held: OrderedDict[ConfigKey, tuple[Any, float]] = OrderedDict()  # value, fresh until
        self._flights: Group[ConfigKey, Any] = Group()

    async def get(
        self, scope: Hashable, kind: str, ttl: float, retry_after: float,
        fetch: Callable[[], Awaitable[Any]],
    ) -> Any:  # fmt: skip
        """The ``kind`` configuration of ``scope``: held if fresh, else ``fetch``ed once
        for every caller asking meanwhile. ``retry_after``: how long a held value is
        served again when its refresh fails."""
        key = (scope, kind)
        held = self._held.get(key)
        if held is not None and self._clock() < held[1]:
            self._held.move_to_end(key)
            if isinstance(held[0], _Failed):
                raise held[0].error
            return held[0]
        return await self._flights.do(key, partial(self._load, key, ttl, retry_after, fetch))

    def forget(self, scope: Hashable) -> None:
        """Drop what is held of ``scope``; flights under way for it no longer store."""
        for key in [key for key in self._held if key[0] == scope]:
            del self._held[key]
        self._flights.detach_where(lambda key: key[0] == scope)

    def clear(self) -> None:
        """Drop everything held; flights under way no longer store."""
        self._held.clear()
        self._flights.detach_where(lambda key: True)

    async def aclose(self) -> None:
        """Cancel the fetches under way (server shutdown)."""
        await self._flights.aclose()

    async def _load(
        self, key: ConfigKey, ttl: float, retry_after: float, fetch: Callable[[], Awaitable[Any]]
    ) -> Any:
        asked = self._clock()  # fresh from the ask, as metadata is (``memory.py``)
        try:
            value = await fetch()
        except HoardError as exc:
            held = self._held.get(key)
            if held is None or isinstance(held[0], _Failed):
                self._hold(key, _Failed(exc), asked + retry_after)
                raise
            self._hold(key, held[0], asked + retry_after)  # stale-if-error
            return held[0]
        self._hold(key, value, asked + ttl)
        return value

    def _hold(self, key: ConfigKey, value: Any, fresh_until: float) -> None:
        if not self._flights.owns(key):  # a write came meanwhile: what was read is stale
            return
        self._held[key] = (value, fresh_until)
        self._held.move_to_end(key)
        while len(self._held) > self._limit:
            self._held.popitem(last=False)
