"""Limits on how hard Hoard presses an origin: a token bucket and a priority gate.

``TokenBucket`` paces requests/s or bytes/s by *reservation* (as Go's
``rate.Limiter.ReserveN``): a caller takes what it needs at once, going into
debt if the bucket is short, and is told how long to wait before using it.
It never sleeps itself and reads time from an injected clock, so tests drive
it with a fake clock. A reservation may exceed the burst (a 1 MiB chunk
against a 100 KiB/s limit): it just waits longer, and so do the callers
after it.

``PriorityGate`` is a semaphore whose waiters are admitted lowest priority
value first (``Priority.CLIENT`` before ``Priority.BACKGROUND``), in arrival
order within one priority. A released slot is handed straight to the next
waiter, so a newcomer cannot barge past the queue.

aiolimiter was considered for the buckets: it sleeps inside ``acquire``
(on the loop's clock), refuses amounts above its capacity and has no
priorities, so these few lines are written out here instead.

Not guaranteed:
- A caller that gives up after reserving (cancelled while it waits) does not
  return its tokens: the next callers wait for them anyway.
- Priority orders the gate's queue only. Once admitted, a background request
  and a client request share the token buckets in reservation order.
- Neither is safe across threads or event loops; each worker has its own.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` units per second with up to ``burst`` saved up; ``rate`` 0 is unlimited."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst  # starts full: the first burst goes out at once
        self._stamp = clock()

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def reserve(self, amount: float) -> float:
        """Take ``amount`` units now; the seconds to wait before using them (0: go)."""
        if self.unlimited:
            return 0.0
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= amount
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


class PriorityGate:
    """At most ``limit`` holders; waiters admitted by (priority, arrival)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap
        self._arrivals = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits for it (no barging past the queue)."""
        if self.held < self.limit and not self._waiters:
            self.held += 1
            return True
        return False

    async def wait(self, priority: int) -> None:
        """Queue for a slot at ``priority`` (lower goes first); return holding it."""
        if self.try_acquire():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (priority, next(self._arrivals), future)
        heapq.heappush(self._waiters, entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed over just as we gave up: pass it on
            else:
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter in line, else to the pool."""
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)  # the slot changes hands; ``held`` stays
                return
        self.held -= 1
