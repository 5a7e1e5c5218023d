"""Tail latency or a stall: whether one slow read is worth a hedge, and a failed one a retry.

A hedge ("The Tail at Scale") pays off when one request is slow among others
that are not: the second request is likely to meet a faster path. When the
origin answers nobody, every read is slow at once, and each hedge (and each
retry of a timed-out try) is one more request queued at an origin that is
already not answering: 16 blocks read during a stall cost 96 origin GETs,
each block's GET hedged and both retried until the deadline.

``StallWatch`` tells the two apart without a clock. A read (``first_of``'s
race, for an opening GET or the next chunk of a body) that waited
``hedge_after`` for nothing is *overdue* from then until it ends; each answer
or body chunk from the origin is a *delivery*. An overdue read is *unanswered*
while no delivery came after it became overdue. Two or more unanswered reads
at once are a stall: the origin answered none of them, nor anyone else,
since they became overdue. Then no hedge starts and no timed-out try is
retried (the guard's ``_may_retry``), so a stalled origin sees each read once,
and the one read that went overdue first its hedge. A single slow read (the
others answered meanwhile, or there are no others) is tail latency and is
hedged and retried as before.

``HedgeBudget`` bounds what is left: like the retry budget (``retry.py``),
hedges over a sliding window may add at most ``HEDGE_RATIO`` of the requests
made, plus a small floor for low traffic, so an origin that is slow for many
reads while still answering some is pressed at most that much harder. A
hedge also takes a concurrency slot like any request (``guard.py``) and is
tried once (no retries of its own: the read it hedges is still running).

Not guaranteed: per worker process (sibling workers each have a watch, so a
node may start one hedge per worker into a stall); a delivery from a fast
request of another bucket counts as an answer (the watch is per origin).
Not safe across threads: each worker's loop has its own.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

from gateway.origins.retry import RetryBudget

HEDGE_RATIO = 0.1  # hedges may add this share of the requests over the window...
HEDGE_MIN_PER_SECOND = 0.5  # ...plus this many a second (5 over the 10 s window)


class StallWatch:
    """Reads overdue for their next byte, and whether the origin answered since."""

    def __init__(self) -> None:
        self.deliveries = 0  # answers and body chunks from the origin, ever
        self._overdue: dict[int, int] = {}  # read -> deliveries when it became overdue
        self._ids = itertools.count()

    def delivered(self) -> None:
        """The origin answered a request or sent a body chunk."""
        self.deliveries += 1

    @contextlib.contextmanager
    def overdue(self) -> Iterator[None]:
        """A read waits past ``hedge_after``: overdue until the block ends."""
        read = next(self._ids)
        self._overdue[read] = self.deliveries
        try:
            yield
        finally:
            del self._overdue[read]

    def stalled(self) -> bool:
        """Whether two or more overdue reads are unanswered: a stall, not a slow tail."""
        unanswered = 0
        for since in self._overdue.values():
            if since == self.deliveries:
                unanswered += 1
                if unanswered >= 2:
                    return True
        return False


class HedgeBudget:
    """Hedges allowed: ``HEDGE_RATIO`` x requests + a floor, over a sliding window."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._budget = RetryBudget(HEDGE_RATIO, HEDGE_MIN_PER_SECOND, clock)

    def record_request(self) -> None:
        """Count one request: each adds ``HEDGE_RATIO`` of a hedge to spend."""
        self._budget.record_request()

    def try_spend(self) -> bool:
        """Take one hedge from the budget; False if it is spent."""
        return self._budget.try_spend()
