"""Origin protection: one wrapper that every read request to an origin goes through.

``OriginGuard`` implements the Origin protocol around any origin (s3, posix),
one per configured origin, built in ``app/wiring.py``. For each request, in order:

1. the circuit breaker (``breaker.py``): open means fail fast with
   ``OriginUnavailable``, so misses stop waiting on a dead origin while cached
   blocks and stale metadata (stale-if-error) are still served;
2. a concurrency slot from the priority gate (``limits.py``): client requests
   queue ahead of background ones (``gateway.core.priority``: warm jobs, prefetch,
   read-ahead). A GET holds its slot until its body is read or closed;
3. a requests/s token, then the request itself;
4. on ``OriginUnavailable`` (5xx, SlowDown, timeouts, connection errors) a
   retry after a full-jitter backoff, while tries remain (``max_attempts`` in
   all), the retry budget allows and the breaker has not opened meanwhile
   (``retry.py``). The slot is given back during the backoff. All tries of a
   client's request end within ``retry.deadline`` (then ``OriginUnavailable``);
   background requests may queue longer.

Body chunks are paced by the bytes/s bucket as they are read. A GET's first
chunk is read inside its try, so a body that fails before its first byte is
retried like any failed request; a body that breaks after it is resumed from
the next byte, and a GET that stalls is hedged (``resume.py``), each resume a
retry by the rules above. A hedge takes a slot like any request, is tried
once, and is bounded (``stalls.py``): none while the origin answers none of
the reads waiting on it (a stall, not a slow tail: then no retry of a
timed-out try either), and at most a share of the requests otherwise.

Every request is observed here (``GuardEvents.call``: count, latency to the
answer, failure), so the origin metrics count what really went to the origin —
a hedge and a resume each count as a request, tries after a failure as retries
— whichever part of Hoard asked.

Writes are not guarded: everything but the read protocol (``forward``,
``put_object`` and the other posix writes) passes through to the wrapped
origin untouched, so the writer's protocol checks still see what the origin
can do. A body that cannot be replayed must not be retried here, and the
forwarder has its own rules (``s3_forward.py``).

Not guaranteed: limits are per worker process (a node with 4 workers may have
4 x ``max_concurrency`` requests in flight); a fill started at background
priority keeps it when a client joins it (see ``gateway.core.priority``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gateway.config.settings import PosixOriginConfig, S3OriginConfig
from gateway.core import errors, priority
from gateway.origins.base import BucketInfo, ListPage, ObjectInfo, ObjectStream, Origin
from gateway.origins.breaker import CircuitBreaker, State
from gateway.origins.limits import PriorityGate, TokenBucket
from gateway.origins.resume import Patience, ResumingStream, first_of, within
from gateway.origins.retry import Backoff, RetryBudget, retryable
from gateway.origins.stalls import HedgeBudget, StallWatch
from gateway.origins.writable import Capability


class GuardEvents(Protocol):
    """What the guard reports (``metric_events.OriginGuardMetrics`` implements it)."""

    def in_flight(self, priority: str, delta: int) -> None: ...
    def queued(self, priority: str, delta: int) -> None: ...
    def waited(self, priority: str, seconds: float) -> None: ...
    def throttled(self, limit: str) -> None: ...
    def retried(self, operation: str) -> None: ...
    def budget_exhausted(self, operation: str) -> None: ...
    def breaker(self, state: str) -> None: ...
    def resumed(self) -> None: ...
    def hedged(self, won: bool) -> None: ...
    def call(self, operation: str) -> AbstractContextManager[None]: ...


class OriginGuard:
    """An origin behind limits, retries and a circuit breaker (see the module docstring)."""

    def __init__(
        self,
        origin: Origin,
        config: S3OriginConfig | PosixOriginConfig,
        events: GuardEvents,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """``clock``, ``sleep`` and ``rand`` are replaceable for tests."""
        self.name = origin.name
        self.inner = origin
        # Writes go to the origin itself, unguarded: see ``writable.py``.
        self.capability = Capability.of(origin)
        self._events = events
        self._clock = clock
        self._sleep = sleep
        limits, retry = config.limits, config.retry
        self.gate = PriorityGate(limits.max_concurrency)
        # One second's worth may go out at once, and at least one request or chunk.
        self._requests = TokenBucket(
            limits.requests_per_second, max(1.0, limits.requests_per_second), clock
        )
        self._bytes = TokenBucket(limits.bytes_per_second, limits.bytes_per_second, clock)
        self._attempts = config.max_attempts
        self._backoff = Backoff(retry.base_delay, retry.max_delay, rand)
        self.budget = RetryBudget(retry.budget_ratio, retry.budget_min_per_second, clock)
        # Hedges for a slow tail, not for a stalled origin (stalls.py): a read overdue
        # for its next byte is watched, each answer and chunk tells the origin is alive.
        self.stalls = StallWatch()
        self.hedges = HedgeBudget(clock)
        self._patience = Patience(retry.hedge_after, retry.deadline, self._may_hedge,
                                  self.stalls.overdue)  # fmt: skip
        self.breaker = CircuitBreaker(
            config.breaker.failures,
            config.breaker.open_for,
            clock,
            on_change=lambda state: events.breaker(state.value),
        )

    # -- the Origin protocol ---------------------------------------------------------

    async def list_buckets(self) -> list[BucketInfo]:
        return await self._call("ListBuckets", self.inner.list_buckets)

    async def head_bucket(self, bucket: str) -> None:
        await self._call("HeadBucket", lambda: self.inner.head_bucket(bucket))

    async def bucket_region(self, bucket: str) -> str:
        return await self._call("GetBucketLocation", lambda: self.inner.bucket_region(bucket))

    async def head_object(self, bucket: str, key: str) -> ObjectInfo:
        return await self._call("HeadObject", lambda: self.inner.head_object(bucket, key))

    async def get_object(
        self,
        bucket: str,
        key: str,
        byte_range: tuple[int, int] | None = None,
        if_match: str | None = None,
    ) -> ObjectStream:
        async def open_stream() -> ObjectStream:
            return await self.inner.get_object(bucket, key, byte_range, if_match)

        def opening(attempts: int = self._attempts) -> Awaitable[ObjectStream]:
            return self._call("GetObject", open_stream, True, raced=True, attempts=attempts)

        def hedge() -> Awaitable[ObjectStream]:  # tried once: the read it hedges goes on
            return opening(attempts=1)

        stream = await first_of(opening(), hedge, self._opening(), _aclose, self._events.hedged)
        end, version = stream.end, stream.info.etag

        async def reopen(first: int) -> ObjectStream:
            async def rest() -> ObjectStream:
                return await self.inner.get_object(bucket, key, (first, end), version)

            return await self._call("GetObject", rest, holds_slot=True)

        return ResumingStream(stream, reopen, self._may_resume, self._patience, self._pace,
                              self._events.hedged, self._events.resumed)  # fmt: skip

    async def list_objects(
        self,
        bucket: str,
        prefix: str = "",
        delimiter: str = "",
        start_after: str = "",
        max_keys: int = 1000,
    ) -> ListPage:
        return await self._call(
            "ListObjectsV2",
            lambda: self.inner.list_objects(bucket, prefix, delimiter, start_after, max_keys),
        )

    async def close(self) -> None:
        await self.inner.close()

    # -- one request: breaker, then tries ---------------------------------------------

    async def _call(
        self,
        operation: str,
        request: Callable[[], Awaitable[Any]],
        holds_slot: bool = False,
        raced: bool = False,
        attempts: int | None = None,
    ) -> Any:
        """One origin request, observed here (count, latency, failure) whoever asked for it.
        ``raced``: a racer of ``first_of``, whose deadline bounds it (a second timer for
        the same deadline would cost every cold GET and never fire first). ``attempts``:
        tries in all (default ``max_attempts``)."""
        with self._events.call(operation):
            return await self._guarded(operation, request, holds_slot, raced,
                                       attempts or self._attempts)  # fmt: skip

    async def _guarded(
        self, operation: str, request: Callable[[], Awaitable[Any]], holds_slot: bool,
        raced: bool, attempts: int,
    ) -> Any:  # fmt: skip
        ticket = self.breaker.admit()
        if ticket is None:
            raise errors.OriginUnavailable(
                f"origin {self.name} is failing: circuit breaker open, "
                f"next try in {self.breaker.retry_in:.1f}s"
            )
        self.budget.record_request()
        self.hedges.record_request()
        ok: bool | None = None
        try:
            tries = self._tries(operation, request, holds_slot, attempts)
            # Every try, every backoff within the deadline.
            result = await (tries if raced else within(self._opening().deadline, tries))
            ok = True
            return result
        except errors.HoardError as exc:
            ok = not retryable(exc)  # an answer about the request: the origin is up
            raise
        finally:
            self.breaker.record(ticket, ok)

    async def _tries(
        self, operation: str, request: Callable[[], Awaitable[Any]], holds_slot: bool,
        attempts: int,
    ) -> Any:  # fmt: skip
        tries = 1
        while True:
            try:
                return await self._attempt(request, holds_slot)
            except errors.HoardError as exc:
                if tries >= attempts or not self._may_retry(exc, operation, tries):
                    raise
                await self._sleep(self._backoff.delay(tries))
                if self.breaker.state is State.OPEN:
                    raise  # other requests found the origin down meanwhile: fail fast
            tries += 1

    def _may_retry(self, exc: errors.HoardError, operation: str, tries: int) -> bool:
        if not retryable(exc) or tries >= self._attempts:
            return False
        if self.breaker.state is State.OPEN:
            return False
        if self.stalls.stalled():  # another try would only wait in the same queue
            return False
        if not self.budget.try_spend():
            self._events.budget_exhausted(operation)
            return False
        self._events.retried(operation)
        return True

    def _may_hedge(self) -> bool:
        """Whether a read overdue for its next byte gets a hedge (``stalls.py``): not
        while requests queue for a slot (a hedge would only queue), not while the origin
        answers none of the reads waiting on it, and within the hedge budget."""
        return not self.gate.queued and not self.stalls.stalled() and self.hedges.try_spend()

    def _opening(self) -> Patience:
        """The patience of a request until its answer: a background request (warm,
        prefetch, read-ahead) may queue for a slot as long as clients go first."""
        if priority.current() is priority.Priority.CLIENT:
            return self._patience
        return dataclasses.replace(self._patience, deadline=math.inf)

    async def _pace(self, size: int) -> None:
        """Hold a body chunk of ``size`` bytes back as the bytes/s limit says."""
        delay = self._bytes.reserve(size)
        if delay > 0:
            self._events.throttled("bytes")
            await self._sleep(delay)

    async def _may_resume(self, exc: errors.HoardError, tries: int) -> bool:
        """Whether a GET body that broke after ``tries`` tries may go on (after the backoff)."""
        if not self._may_retry(exc, "GetObject", tries):
            return False
        await self._sleep(self._backoff.delay(tries))
        return self.breaker.state is not State.OPEN

    async def _attempt(self, request: Callable[[], Awaitable[Any]], holds_slot: bool) -> Any:
        release = await self._take_slot()
        try:
            result = await request()
        except errors.HoardError as exc:
            release()
            if not retryable(exc):  # an answer about the request: the origin is alive
                self.stalls.delivered()
            raise
        except BaseException:
            release()
            raise
        self.stalls.delivered()
        if not holds_slot:
            release()
            return result
        stream = GuardedStream(result, release, self.stalls.delivered)
        try:
            await stream.prime()  # inside the try: a body that fails at once is retried
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def _take_slot(self) -> Callable[[], None]:
        """Wait for a concurrency slot and a request token; returns the slot's release."""
        current = priority.current()
        level = current.name.lower()
        started = self._clock()
        if not self.gate.try_acquire():
            self._events.throttled("concurrency")
            self._events.queued(level, 1)
            try:
                await self.gate.wait(current)
            finally:
                self._events.queued(level, -1)
        self._events.waited(level, self._clock() - started)
        self._events.in_flight(level, 1)
        release = _Once(lambda: self._give_back(level))
        try:
            delay = self._requests.reserve(1)
            if delay > 0:
                self._events.throttled("requests")
                await self._sleep(delay)
        except BaseException:
            release()
            raise
        return release

    def _give_back(self, level: str) -> None:
        self.gate.release()
        self._events.in_flight(level, -1)


async def _aclose(stream: ObjectStream) -> None:
    await stream.aclose()


class _Once:
    """A callable that runs ``action`` on its first call only (a slot is released once)."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Callable[[], None] | None = action

    def __call__(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()


class GuardedStream:
    """A GET's body, holding its slot until read or closed (paced by the ``ResumingStream``
    around it, so that time held back by the bytes/s limit is not taken for a stall)."""

    def __init__(
        self, inner: ObjectStream, release: Callable[[], None], delivered: Callable[[], None]
    ) -> None:
        self.info = inner.info
        self._delivered = delivered  # each chunk tells the stall watch the origin is alive
        self.start = inner.start
        self.end = inner.end
        self._inner = inner
        self._release = release
        self._chunks: AsyncIterator[bytes] | None = None
        self._first: bytes | None = None  # read by prime(), not yet delivered
        self._ended = False

    def chunks(self) -> AsyncIterator[bytes]:
        # Its own iterator, not an async generator: see S3ObjectStream.chunks.
        return self

    def __aiter__(self) -> GuardedStream:
        return self

    def at_hand(self) -> bool:
        """Whether the next chunk or the end is here (``resume.HeldStream``): the one
        ``prime`` read, or the end of a body whose origin stream says it all arrived."""
        if self._first is not None or self._ended:
            return True
        arrived = getattr(self._inner, "arrived", None)  # S3ObjectStream's; others: unknown
        return arrived is not None and bool(arrived())

    async def prime(self) -> None:
        """Read the first chunk now, so that a failure before any byte is the request's."""
        self._chunks = aiter(self._inner.chunks())
        self._first = await self._next()

    async def _next(self) -> bytes | None:
        assert self._chunks is not None
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            self._ended = True
            self._release()  # the whole body is read: no longer in flight
            return None
        self._delivered()
        return chunk

    async def __anext__(self) -> bytes:
        if self._chunks is None:
            await self.prime()
        chunk, self._first = self._first, None
        if chunk is None and not self._ended:
            chunk = await self._next()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        try:
            closer = getattr(self._chunks, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()  # an async generator's own cleanup (posix)
            await self._inner.aclose()
        finally:
            self._release()

    async def __aenter__(self) -> GuardedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
