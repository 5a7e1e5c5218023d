"""When to try an origin request again, and how long to wait first.

``retryable`` is the policy: an ``OriginUnavailable`` (5xx, SlowDown and
other throttling, timeouts, refused or reset connections, as the origins
translate them) may succeed on another try; an answer about the request
(missing key, access denied, precondition failed, bad range) will not.

``Backoff`` is full jitter ("Exponential Backoff And Jitter", AWS
Architecture Blog, 2015): the n-th retry waits a uniform random time in
``[0, min(max_delay, base_delay * 2**(n-1))]``, which spreads the retries of
many clients that failed together instead of bunching them at each step.

``RetryBudget`` is Finagle's: over a sliding window (10 s), retries may add at
most ``ratio`` of the requests made, plus ``min_per_second`` for low traffic.
Per-request attempt limits alone multiply load on an origin that is already
failing (5 tries each is 5x the load); a budget caps the extra at 20 %.

Not guaranteed: the window slides in tenths, so a burst at its edge may be
counted a tenth of the window longer or shorter than exact.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from gateway.core import errors

_WINDOW = 10.0  # seconds of history a budget looks at
_SLOTS = 10  # the window's resolution


def retryable(exc: BaseException) -> bool:
    """Whether another try of the same request might succeed."""
    return isinstance(exc, errors.OriginUnavailable)


class Backoff:
    """Full-jitter exponential backoff."""

    def __init__(
        self, base_delay: float, max_delay: float, rand: Callable[[], float] = random.random
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._rand = rand

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** min(retry - 1, 62))
        return self._rand() * ceiling


class _SlidingCount:
    """Events over the last ``window`` seconds, kept in ``_SLOTS`` per-slice counters."""

    def __init__(self, window: float, clock: Callable[[], float]) -> None:
        self._width = window / _SLOTS
        self._clock = clock
        self._slices = [-1] * _SLOTS  # which slice of time each counter holds
        self._counts = [0] * _SLOTS

    def add(self) -> None:
        now = int(self._clock() // self._width)
        slot = now % _SLOTS
        if self._slices[slot] != now:  # a counter from a slice that left the window
            self._slices[slot], self._counts[slot] = now, 0
        self._counts[slot] += 1

    def total(self) -> int:
        now = int(self._clock() // self._width)
        return sum(c for s, c in zip(self._slices, self._counts, strict=True) if now - s < _SLOTS)


class RetryBudget:
    """Retries allowed: ``ratio`` x requests + ``min_per_second`` x window, over the window."""

    def __init__(
        self,
        ratio: float,
        min_per_second: float,
        clock: Callable[[], float] = time.monotonic,
        window: float = _WINDOW,
    ) -> None:
        self.ratio = ratio
        self.reserve = min_per_second * window
        self._requests = _SlidingCount(window, clock)
        self._retries = _SlidingCount(window, clock)

    def record_request(self) -> None:
        """Count one request (its first try): each adds ``ratio`` of a retry to spend."""
        self._requests.add()

    def try_spend(self) -> bool:
        """Take one retry from the budget; False if it is spent."""
        allowed = self.ratio * self._requests.total() + self.reserve
        if self._retries.total() + 1 > allowed:
            return False
        self._retries.add()
        return True
