"""A circuit breaker: stop sending requests to an origin that keeps failing.

Closed, it lets everything through and counts failed requests in a row
(``failures`` of them open it). Open, it refuses every request at once for
``open_for`` seconds: callers fail fast instead of piling up behind timeouts,
and the origin gets room to recover. Then it is half-open: exactly one
request (the probe) goes through; its success closes the breaker, its
failure opens it for another ``open_for``.

A failure is what the caller says it is (the guard counts a request that
still failed after its retries with ``OriginUnavailable``); an answer such as
"no such key" is a success here, since the origin answered.

Each admitted request carries a ``Ticket``. Only the probe's outcome decides
in half-open: a slow request admitted while the breaker was still closed
cannot close (or re-open) it later.

Not guaranteed: one breaker per worker process; workers of a node learn
separately that an origin is down. Time is read from an injected clock, and
the open -> half-open step happens when the next request asks, not on a timer.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Ticket(enum.Enum):
    """What an admitted request is to the breaker."""

    NORMAL = "normal"
    PROBE = "probe"  # the one request of a half-open breaker


class CircuitBreaker:
    """``failures`` consecutive failures open it for ``open_for`` seconds; 0 never opens."""

    def __init__(
        self,
        failures: int,
        open_for: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[State], None] = lambda state: None,
    ) -> None:
        self.threshold = failures
        self.open_for = open_for
        self._clock = clock
        self._on_change = on_change
        self._state = State.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False

    @property
    def state(self) -> State:
        if self._state is State.OPEN and self._clock() - self._opened_at >= self.open_for:
            self._move(State.HALF_OPEN)
        return self._state

    @property
    def retry_in(self) -> float:
        """Seconds until an open breaker lets a probe through."""
        return max(0.0, self._opened_at + self.open_for - self._clock())

    def admit(self) -> Ticket | None:
        """A ticket for a request that may go to the origin now, or None: fail fast."""
        state = self.state
        if state is State.CLOSED:
            return Ticket.NORMAL
        if state is State.HALF_OPEN and not self._probing:
            self._probing = True
            return Ticket.PROBE
        return None

    def record(self, ticket: Ticket, ok: bool | None) -> None:
        """The outcome of an admitted request: True, False (failed), None (abandoned)."""
        if ticket is Ticket.PROBE:
            self._probing = False
            if ok is True and self._state is State.HALF_OPEN:
                self._move(State.CLOSED)
            elif ok is False and self._state is State.HALF_OPEN:
                self._open()
            return
        if self._state is not State.CLOSED or ok is None:
            return  # admitted before the breaker opened: the probe decides now
        if ok:
            self._failures = 0
            return
        self._failures += 1
        if self.threshold and self._failures >= self.threshold:
            self._open()

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._move(State.OPEN)

    def _move(self, state: State) -> None:
        self._failures = 0
        if state is not self._state:
            self._state = state
            self._on_change(state)
