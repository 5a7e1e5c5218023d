"""The streams the node's leader worker follows, and the work fetching ahead of each.

``observe`` is called for every object GET (``move`` for one another worker
of the node served: ``node.py``); it moves the position of each stream whose
order holds the key. Each stream starts work
in its order while the window has room and it has a free slot, whenever
either may have changed (a GET, a registration, a piece of work ending): the
blocks of keys already looked up first (they are nearer the reader), then
lookups of the next keys (metadata, as a read would: a cold one is a ranged
GET of block 0, which that same request fills, so block 0 is never fetched
twice). Lookups and block fetches share the stream's ``concurrency`` slots,
so at most that many of its origin requests are in flight, and many keys are
looked up at once: against a store 20 ms away, one lookup at a time would
cover 50 keys/s, fewer than a reader of small objects consumes. The work is
accounted for (window, slot, status) when it is started, not when its task
first runs, so a status never shows a stream idle that is about to start
something. Everything runs inside ``priority.background()``, so client
misses go to the origin first.

Bounded: at most ``max_streams`` streams of ``max_keys`` keys each; a stream
idle (no GET, no registration) for ``idle`` seconds is forgotten, checked
whenever the prefetcher is used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.config.settings import PrefetchConfig
from gateway.core import priority
from gateway.core.tasks import TaskSet
from gateway.obs.metrics import Metrics
from gateway.prefetch.order import Order, OrderError
from gateway.prefetch.stream import Stream

if TYPE_CHECKING:
    from gateway.blocks.source import BlockSource
    from gateway.pieces import BlockRef

# ``Reader.block_refs``: every block of a key, its metadata looked up as a read would
# (a cold lookup is the GET that fills block 0, admitted to disk as the flag says).
BlockRefs = Callable[[str, str, bool | None], Awaitable[list["BlockRef"]]]

log = logging.getLogger(__name__)


@dataclass
class _Running:
    stream: Stream
    busy: int = 0  # slots in use: lookups and block fetches in flight
    stopped: bool = False
    tasks: TaskSet = field(default_factory=TaskSet)


class Prefetcher:
    def __init__(
        self,
        config: PrefetchConfig,
        block_refs: BlockRefs,
        blocks: BlockSource,
        metrics: Metrics,
        block_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._block_refs = block_refs
        self._blocks = blocks
        self._metrics = metrics
        self._block_size = block_size
        self._clock = clock
        self._streams: dict[str, _Running] = {}

    def register(self, order: Order, active: bool = True) -> Stream:
        """Start (or replace: a new epoch) the stream ``order.stream``.

        ``active`` starts fetching now; otherwise at the stream's first GET
        here (a registration another node passed on). Raises ``OrderError``
        beyond ``max_streams``.
        """
        self._expire()
        old = self._streams.get(order.stream)
        if old is None and len(self._streams) >= self.config.max_streams:
            raise OrderError("TooManyStreams",
                             f"{len(self._streams)} streams are registered; this gateway takes "
                             f"at most {self.config.max_streams} (prefetch.max_streams)")  # fmt: skip
        if old is not None:
            self._stop(old)
        running = _Running(Stream(order, active, self._clock()))
        self._streams[order.stream] = running
        self._metrics.prefetch_streams.set(len(self._streams))
        self._pump(running)
        return running.stream

    def drop(self, stream_id: str) -> bool:
        self._expire()
        running = self._streams.pop(stream_id, None)
        if running is None:
            return False
        self._stop(running)
        self._metrics.prefetch_streams.set(len(self._streams))
        return True

    def status(self, stream_id: str) -> dict[str, Any] | None:
        self._expire()
        running = self._streams.get(stream_id)
        return None if running is None else running.stream.status(self._clock())

    def observe(self, bucket: str, key: str) -> None:
        """A GET of ``key`` in ``bucket``: move every stream whose order holds it."""
        if not self._streams:
            return
        self._expire()
        now = self._clock()
        for running in self._streams.values():
            stream = running.stream
            if stream.order.bucket != bucket:
                continue
            index = stream.index_of(key)
            if index is None:
                continue
            stream.move(index, now)
            stream.active = True
            self._pump(running)

    def move(self, stream_id: str, index: int, ago: float = 0.0) -> None:
        """The reader of ``stream_id`` asked for the key at ``index``, ``ago`` seconds ago
        (a GET another worker of the node served: see ``node.py``)."""
        running = self._streams.get(stream_id)
        if running is None:
            return
        running.stream.move(index, self._clock() - max(0.0, ago))
        running.stream.active = True
        self._pump(running)

    async def close(self) -> None:
        for running in list(self._streams.values()):
            self._stop(running)
        stopping, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(running.tasks.cancel() for running in stopping))

    # -- inside ------------------------------------------------------------------------

    def _expire(self) -> None:
        now = self._clock()
        idle = [sid for sid, r in self._streams.items()
                if now - r.stream.last_used > self.config.idle]  # fmt: skip
        for stream_id in idle:
            log.info("prefetch stream %s expired after %.0fs idle", stream_id, self.config.idle)
            self._stop(self._streams.pop(stream_id))
        if idle:
            self._metrics.prefetch_streams.set(len(self._streams))

    def _stop(self, running: _Running) -> None:
        running.stopped = True
        running.tasks.stop()

    def _pump(self, running: _Running) -> None:
        """Start lookups and block fetches, nearest first, while slots and window allow."""
        stream = running.stream
        while not running.stopped and stream.active and running.busy < self.config.concurrency:
            work = self._next_work(stream)
            if work is None:
                return
            running.busy += 1
            self._account(stream, work)
            with priority.background():  # the task's context is a copy of this one
                running.tasks.spawn(self._do(running, work))

    def _next_work(self, stream: Stream) -> tuple[int, BlockRef | None] | None:
        """(key index, block) to fetch next, (key index, None) to look up, or None."""
        if stream.pending:
            index, ref = stream.pending[0]
            return (index, ref) if stream.room(ref.length) else None
        if stream.next_key < len(stream.keys) and stream.room(self._block_size):
            return stream.next_key, None
        return None

    def _account(self, stream: Stream, work: tuple[int, BlockRef | None]) -> None:
        """Count ``work`` as started: against the window, and in the stream's status."""
        index, ref = work
        if ref is None:
            stream.reserve(index, self._block_size)  # a lookup brings up to block 0
            return
        stream.pending.pop(0)
        stream.take(index, ref.length)
        stream.in_flight_bytes += ref.length

    async def _do(self, running: _Running, work: tuple[int, BlockRef | None]) -> None:
        index, ref = work
        try:
            if ref is None:
                await self._look_up(running.stream, index)
            else:
                await self._fetch(running.stream, ref)
        finally:
            running.busy -= 1
            self._pump(running)  # before this task ends: the freed slot is used at once

    async def _look_up(self, stream: Stream, index: int) -> None:
        looked = time.monotonic()
        try:
            refs = await self._block_refs(stream.order.bucket, stream.keys[index], True)
        except Exception as exc:  # a missing or failing key must not stop the stream
            stream.found(index, 0, [])
            stream.errors += 1
            log.debug("prefetch of %s skipped: %r", stream.keys[index], exc)
            return
        # A fill of block 0 that ran since the lookup began is the one this lookup's
        # GET started (or a reader's), landed or not, and counts as fetched.
        filling = bool(refs) and self._blocks.fills.ran_since(refs[0].block, looked)
        if stream.found(index, refs[0].length if refs else 0, refs[1:]) and refs:
            stream.in_flight_bytes += refs[0].length
            await self._fetch(stream, refs[0], filling)  # under this lookup's slot

    async def _fetch(self, stream: Stream, ref: BlockRef, filling: bool = False) -> None:
        """Get ``ref``'s block cached (counted in flight by the caller); ``filling``:
        its fill was running already."""
        try:
            fetched = await self._blocks.preload(ref)
            fetched = ref.length if filling else fetched
            stream.fetched_bytes += fetched
            self._metrics.prefetch_bytes.inc(fetched)
        except Exception as exc:  # the reader will fetch it itself; the stream goes on
            stream.errors += 1
            log.debug("prefetch of block %s failed: %r", ref.block.digest, exc)
        finally:
            stream.in_flight_bytes -= ref.length
