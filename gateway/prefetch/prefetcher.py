"""The streams of one process and the task that fetches ahead of each.

``observe`` is called by the reader for every object GET; it moves the
position of each stream whose order holds the key and wakes its task. A
task looks up the next keys' blocks (metadata, as a read would), takes on
blocks while the window has room and keeps at most ``concurrency`` of them in
flight through ``BlockSource.preload``. Everything it does runs inside
``priority.background()``, so client misses go to the origin first.

Bounded: at most ``max_streams`` streams of ``max_keys`` keys each; a stream
idle (no GET, no registration) for ``idle`` seconds is forgotten, checked
whenever the prefetcher is used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway import priority
from gateway.config import PrefetchConfig
from gateway.metrics import Metrics
from gateway.prefetch.order import Order, OrderError
from gateway.prefetch.stream import Stream

if TYPE_CHECKING:  # the reader is built after the prefetcher (it calls ``observe``)
    from gateway.blocks import BlockRef
    from gateway.reader import Reader

log = logging.getLogger(__name__)


@dataclass
class _Running:
    stream: Stream
    slots: asyncio.Semaphore
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    fetches: set[asyncio.Task[None]] = field(default_factory=set)


class Prefetcher:
    def __init__(
        self,
        config: PrefetchConfig,
        reader: Callable[[], Reader],
        metrics: Metrics,
        block_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._reader = reader
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
        running = _Running(Stream(order, active, self._clock()),
                           asyncio.Semaphore(self.config.concurrency))  # fmt: skip
        self._streams[order.stream] = running
        self._metrics.prefetch_streams.set(len(self._streams))
        if active:
            self._start(running)
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
            if not stream.active:
                stream.active = True
                self._start(running)
            running.wake.set()

    async def close(self) -> None:
        for running in list(self._streams.values()):
            self._stop(running)
        tasks = [t for r in self._streams.values() for t in (r.task, *r.fetches) if t]
        self._streams.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

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

    def _start(self, running: _Running) -> None:
        with priority.background():  # the task's context is a copy of this one
            running.task = asyncio.ensure_future(self._run(running))

    def _stop(self, running: _Running) -> None:
        for task in (running.task, *running.fetches):
            if task is not None:
                task.cancel()

    async def _run(self, running: _Running) -> None:
        while True:
            running.wake.clear()  # before advancing: a GET meanwhile wakes the next round
            await self._advance(running)
            await running.wake.wait()

    async def _advance(self, running: _Running) -> None:
        """Take on blocks of the next keys while the window has room."""
        stream = running.stream
        while True:
            if not stream.pending:
                if stream.next_key >= len(stream.keys) or not stream.room(self._block_size):
                    return  # a key of unknown size may bring up to a block before it is known
                await self._look_up(stream, stream.next_key)
                continue
            index, ref = stream.pending[0]
            if not stream.room(ref.length):
                return
            await running.slots.acquire()
            if not stream.pending or stream.pending[0][1] is not ref:  # the reader moved on
                running.slots.release()
                continue
            stream.pending.popleft()
            stream.take(index, ref.length)
            task = asyncio.ensure_future(self._fetch(running, ref))
            running.fetches.add(task)
            task.add_done_callback(running.fetches.discard)

    async def _look_up(self, stream: Stream, index: int) -> None:
        stream.next_key = index + 1
        try:
            refs = await self._reader().block_refs(stream.order.bucket, stream.keys[index], True)
        except Exception as exc:  # a missing or failing key must not stop the stream
            stream.errors += 1
            log.debug("prefetch of %s skipped: %r", stream.keys[index], exc)
            return
        if index > stream.position:  # else the reader got there first
            stream.pending.extend((index, ref) for ref in refs)

    async def _fetch(self, running: _Running, ref: BlockRef) -> None:
        stream = running.stream
        stream.in_flight_bytes += ref.length
        try:
            fetched = await self._reader().blocks.preload(ref)
            stream.fetched_bytes += fetched
            self._metrics.prefetch_bytes.inc(fetched)
        except Exception as exc:  # the reader will fetch it itself; the stream goes on
            stream.errors += 1
            log.debug("prefetch of block %s failed: %r", ref.block.digest, exc)
        finally:
            stream.in_flight_bytes -= ref.length
            running.slots.release()
