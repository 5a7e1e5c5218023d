"""The node's prefetch: streams registered through any worker, followed by its leader.

Every worker keeps, per registered stream, the order's key positions (to
place a GET it serves) and writes each GET's position to the stream's slot
in the registry (``registry.py``). The leader worker (``gateway/node/leader.py``)
alone runs a ``Prefetcher`` over the node's streams: every ``TICK`` seconds,
and at once after a GET or a call it serves itself, it takes new and dropped
registrations, moves each stream to its last observed position, and
publishes each stream's status in its slot. A status read through another
worker waits (at most ``SETTLE`` seconds) until the leader has applied the
last GET, so what one client did is in what it reads next, whichever
workers the two requests reached.

A worker's death: the registry is in files, so nothing registered is lost.
If the leader dies, a sibling leads within ``leader.RETRY`` seconds and
starts every stream again from its last observed position; the fetches the
dead leader had in flight were fills of the node's disk tier, which the fill
claims let a sibling redo. A stream that stays idle for ``prefetch.idle`` is
dropped from the registry by the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from gateway.node.leader import Leadership
from gateway.prefetch.order import Order
from gateway.prefetch.prefetcher import Prefetcher
from gateway.prefetch.registry import Entry, Registry
from gateway.prefetch.stream import Stream

log = logging.getLogger(__name__)

TICK = 0.02  # seconds between the leader's rounds while streams are registered
IDLE_TICK = 0.1  # ... while none are (a sibling's first registration is seen this soon)
SETTLE = 1.0  # seconds a status through a sibling waits for the leader to catch up


class _Known:
    """A registered stream as this worker knows it: where each of its keys is."""

    def __init__(self, entry: Entry, order: Order) -> None:
        self.entry = entry
        self.places = Stream(order, active=False, now=0.0)  # only its key positions are used


class NodePrefetch:
    def __init__(self, registry: Registry, prefetcher: Prefetcher, leadership: Leadership) -> None:
        self._registry = registry
        self._prefetcher = prefetcher
        self._leadership = leadership
        self._known: dict[str, _Known] = {}
        self._generation = -1
        self._following: dict[str, int] = {}  # leader: stream → the serial it follows
        self._applied: dict[str, int] = {}  # leader: stream → the observed seq applied
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._registry.open()
        self._task = asyncio.get_running_loop().create_task(self._rounds())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._prefetcher.close()
        self._registry.close()

    # -- every worker --------------------------------------------------------------------

    def observe(self, bucket: str, key: str) -> None:
        """A GET of ``key`` in ``bucket`` served here: record it in every stream holding it."""
        if self._generation != self._registry.generation():
            self._sync()
        if not self._known:
            return
        leads = self._leadership.leads
        for stream, known in self._known.items():
            if known.entry.bucket != bucket:
                continue
            observed = self._registry.observed(known.entry)
            if observed is None:
                continue
            known.places.position = observed[1]
            index = known.places.index_of(key)
            if index is not None:
                self._registry.observe(known.entry, index)
                if leads:  # this GET's stream only: the others wait for the next round
                    self._follow(stream, known)

    def register(self, order: Order, active: bool = True) -> Entry:
        """Record a registration for the node (``OrderError`` beyond ``max_streams``)."""
        entry = self._registry.register(order, active)
        if self._leadership.leads:
            self._lead()
        return entry

    def drop(self, stream: str) -> bool:
        dropped = self._registry.drop(stream)
        if dropped and self._leadership.leads:
            self._lead()
        return dropped

    def bucket_of(self, stream: str) -> str | None:
        entry = self._registry.entries().get(stream)
        return None if entry is None else entry.bucket

    async def status(self, stream: str) -> dict[str, Any] | None:
        """The stream's status as the leader sees it, including every GET served before."""
        if self._leadership.leads:
            self._lead()
            return self._prefetcher.status(stream)
        entry = self._registry.entries().get(stream)
        if entry is None:
            return None
        deadline = time.monotonic() + SETTLE
        while True:
            observed = self._registry.observed(entry)
            published = self._registry.published(entry)
            caught_up = published is not None and observed is not None
            if (caught_up and published[0] >= observed[0]) or time.monotonic() > deadline:
                break
            await asyncio.sleep(TICK / 4)
        shown = published[1] if published is not None else _unfollowed(observed)
        return {"stream": stream, "bucket": entry.bucket, "keys": entry.keys,
                "window": entry.window, **shown}  # fmt: skip

    def _sync(self) -> None:
        """Re-read the registrations (their generation moved)."""
        self._generation = self._registry.generation()
        entries = self._registry.entries()
        for stream in [s for s, k in self._known.items() if entries.get(s) != k.entry]:
            del self._known[stream]
        for stream, entry in entries.items():
            if stream not in self._known:
                keys = self._registry.keys(entry)
                if keys is not None:
                    order = Order(stream, entry.bucket, keys, entry.window)
                    self._known[stream] = _Known(entry, order)

    # -- the leader ----------------------------------------------------------------------

    async def _rounds(self) -> None:
        while True:
            await asyncio.sleep(TICK if self._known or self._following else IDLE_TICK)
            try:
                if self._leadership.leads:
                    self._lead()
                elif self._following:  # no longer the leader (cannot happen while alive)
                    await self._prefetcher.close()
                    self._following.clear()
            except Exception:  # one bad round must not end prefetch for the node
                log.exception("prefetch: a round of the node's streams failed")

    def _lead(self) -> None:
        """Follow the registry: new and dropped streams, positions; publish statuses."""
        if self._generation != self._registry.generation():
            self._sync()
        prefetcher = self._prefetcher
        for stream in [s for s in self._following if s not in self._known]:
            prefetcher.drop(stream)
            del self._following[stream]
        for stream, known in list(self._known.items()):
            self._follow(stream, known)

    def _follow(self, stream: str, known: _Known) -> None:
        """Move ``stream`` to its last observed GET (registering it first if it is new
        or replaced), and publish its status; drop it from the registry if it expired."""
        entry, prefetcher = known.entry, self._prefetcher
        if self._following.get(stream) != entry.serial:
            prefetcher.register(known.places.order, active=entry.active)
            self._following[stream] = entry.serial
            self._applied[stream] = 0
        observed = self._registry.observed(entry)
        if observed is None:
            return
        seq, index, when = observed
        if seq != self._applied[stream]:
            prefetcher.move(stream, index, time.time() - when)
            self._applied[stream] = seq
        status = prefetcher.status(stream)
        if status is None:  # expired: idle for prefetch.idle
            self._registry.drop(stream, entry.serial)
            return
        self._registry.publish(entry, seq, status)


def _unfollowed(observed: tuple[int, int, float] | None) -> dict[str, Any]:
    """A stream's status while no leader follows it (one is being replaced)."""
    return {"position": observed[1] if observed else -1, "next_key": 0, "ahead_bytes": 0,
            "in_flight_bytes": 0, "lookups": 0, "fetched_bytes": 0, "errors": 0,
            "active": False, "idle_seconds": 0.0, "following": False}  # fmt: skip
