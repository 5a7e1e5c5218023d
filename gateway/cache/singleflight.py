"""Coalescing of concurrent work on the same key, for values and for byte streams.

``Group`` is groupcache's singleflight for asyncio: the first caller for a key
starts the work as a task owned by the group, later callers wait on the same
task. Waiters are shielded: a waiter that is cancelled (its client went away)
does not cancel the work the others are waiting for. The metadata cache's
flights are a ``Group`` (``metadata/memory.py``), detached on invalidation.

``Flight`` is the streaming variant for block fills: the bytes of a block are
appended as they arrive from the origin and every waiter reads from its own
offset as soon as bytes are there, instead of waiting for the whole block.
That is what lets 64 cold readers of one shard all start receiving after the
first origin round trip, with one origin request.

Not guaranteed: coalescing is per process and per event loop (workers of a
node coordinate through the disk tier's fill locks, not here); a ``Flight``
holds its block in memory until it finishes, so the number of concurrent
flights must be bounded by the caller.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from gateway.core.tasks import TaskSet

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Group(Generic[K, V]):
    """One in-flight call per key; every concurrent caller gets its result.

    A key can be *detached* (``detach_where``): its call runs on and its
    waiters get its result, but the next caller starts a new call, and the
    detached one can tell (``owns`` is false) that what it read must not be
    stored — a write invalidated the key while it was asking.
    """

    def __init__(self) -> None:
        self._calls: dict[K, asyncio.Future[V]] = {}
        self._running = TaskSet()  # strong references, detached ones too

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, key: object) -> bool:
        return key in self._calls

    async def do(self, key: K, work: Callable[[], Awaitable[V]]) -> V:
        """Run ``work`` for ``key`` unless it is already running; wait for its result."""
        return await asyncio.shield(self.start(key, work))

    def start(self, key: K, work: Callable[[], Awaitable[V]]) -> asyncio.Future[V]:
        """The call running for ``key``, started with ``work`` if there is none."""
        task = self._calls.get(key)
        if task is None:
            task = self._running.spawn(self._run(key, work))
            self._calls[key] = task
            task.add_done_callback(_retrieved)
        return task

    def owns(self, key: K) -> bool:
        """Whether the running task is ``key``'s call, still attached."""
        return self._calls.get(key) is asyncio.current_task()

    def detach(self, key: K) -> None:
        self._calls.pop(key, None)

    def detach_where(self, matches: Callable[[K], bool]) -> None:
        for key in [key for key in self._calls if matches(key)]:
            del self._calls[key]

    async def aclose(self) -> None:
        """Cancel every running call, detached ones included, and wait for them."""
        await self._running.cancel()

    async def _run(self, key: K, work: Callable[[], Awaitable[V]]) -> V:
        try:
            return await work()
        finally:
            if self.owns(key):
                del self._calls[key]


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a call all of whose callers left must not warn


class Flight:
    """The bytes of one block as they arrive; readers follow at their own pace.

    Arrived chunks are kept as the immutable ``bytes`` the origin delivered,
    and readers get ``memoryview`` slices of them: a hundred readers of one
    block share one copy of it instead of making a hundred.
    """

    def __init__(self, length: int) -> None:
        self.length = length
        self.received = 0
        self.waiters = 0
        self._chunks: list[bytes] = []
        self._starts: list[int] = []  # offset of each chunk in the block
        self._changed = asyncio.Event()
        self._done = False
        self._error: BaseException | None = None
        # A fill a metadata miss opened (``BlockSource.adopt``) is read next by the request
        # whose miss it was: that first join is the fill's own reader, not a coalesced one.
        self.adopter_to_come = False

    @property
    def done(self) -> bool:
        return self._done

    def data(self) -> bytes:
        """The whole block so far, as one bytes object (for the memory tier)."""
        return b"".join(self._chunks)

    def append(self, data: bytes) -> None:
        if not data:
            return
        self._starts.append(self.received)
        self._chunks.append(bytes(data))
        self.received += len(data)
        self._wake()

    def finish(self) -> None:
        if self.received != self.length:
            self.fail(ValueError(f"fill ended at {self.received} of {self.length} bytes"))
            return
        self._done = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _slices(self, position: int, end: int) -> list[memoryview]:
        """Views of the arrived bytes in [position, min(end, received))."""
        index = bisect.bisect_right(self._starts, position) - 1
        views = []
        while index < len(self._chunks) and position < end:
            chunk, start = self._chunks[index], self._starts[index]
            stop = min(len(chunk), end - start)
            if position - start < stop:
                views.append(memoryview(chunk)[position - start : stop])
                position = start + stop
            index += 1
        return views

    async def read(self, offset: int = 0, length: int | None = None) -> AsyncIterator[memoryview]:
        """Yield views of [offset, offset+length) as the bytes arrive; raise a failed fill."""
        end = self.length if length is None else offset + length
        position = offset
        self.waiters += 1
        try:
            while position < end:
                if self.received > position:
                    for view in self._slices(position, end):
                        position += len(view)
                        yield view
                    continue
                if self._error is not None:
                    raise self._error
                if self._done:
                    raise ValueError("fill finished short of the requested range")
                await self._changed.wait()
        finally:
            self.waiters -= 1


_ENDED_KEPT = 4096  # fills whose end FlightGroup.ran_since remembers


class FlightGroup(Generic[K]):
    """Starts at most one fill per key; the fill runs as a task owned by the group."""

    def __init__(self) -> None:
        self._flights: dict[K, Flight] = {}
        self._tasks = TaskSet()
        self._running: dict[K, asyncio.Future[None]] = {}  # the fill task of each flight
        self.started = 0  # fills started (one origin fetch each)
        self.joined = 0  # readers that joined a fill already running (coalesced)
        # When the last fills ended (monotonic), so that a caller can tell a fill that
        # ran while it looked elsewhere from a block that was there before (ran_since).
        self._ended: OrderedDict[K, float] = OrderedDict()

    def get(self, key: K) -> Flight | None:
        return self._flights.get(key)

    def ran_since(self, key: K, since: float) -> bool:
        """Whether a fill of ``key`` is running, or ended after ``since``
        (``time.monotonic()``; the last ``_ENDED_KEPT`` fills are remembered)."""
        if key in self._flights:
            return True
        ended = self._ended.get(key)
        return ended is not None and ended > since

    def join_or_start(
        self, key: K, length: int, fill: Callable[[Flight], Awaitable[None]]
    ) -> tuple[Flight, bool]:
        """The flight for ``key`` and whether this call started it."""
        flight = self._flights.get(key)
        if flight is not None:
            self.joined += 1
            return flight, False
        flight = Flight(length)
        self._flights[key] = flight
        self.started += 1
        task = self._tasks.spawn(self._run(key, flight, fill))
        self._running[key] = task
        task.add_done_callback(lambda t: self._forget_task(key, t))
        return flight, True

    async def settled(self, key: K) -> None:
        """Wait until the fill of ``key`` (if any) has returned, not only sent its last byte.

        A fill's work goes on after ``Flight.finish`` (a disk tier commits the
        block then); a caller that needs the block stored waits for this. Its
        own cancellation does not cancel the fill.
        """
        task = self._running.get(key)
        if task is not None:
            await asyncio.wait([task])

    def _forget_task(self, key: K, task: asyncio.Future[None]) -> None:
        if self._running.get(key) is task:
            del self._running[key]

    async def _run(self, key: K, flight: Flight, fill: Callable[[Flight], Awaitable[None]]) -> None:
        try:
            await fill(flight)
            if not flight.done:
                flight.finish()
        except BaseException as exc:  # the fill's failure belongs to its waiters
            flight.fail(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
            self._ended[key] = time.monotonic()
            self._ended.move_to_end(key)
            if len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)

    async def close(self) -> None:
        await self._tasks.cancel()
