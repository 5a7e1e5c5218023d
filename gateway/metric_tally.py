"""Per-request counts added up in plain Python, handed to their series once per loop turn.

A cached small-object hit moved six series: the request counter, the latency
histogram, the body bytes, the bytes by tier, the hit counter and the metadata
lookup. Each ``inc`` of prometheus_client checks the series, takes a lock (with
workers: writes a shared memory-mapped file): about a sixth of the Python a hit
cost. A cold one moved nine more, for its origin request (count, latency,
slot held, queue wait, bytes: ``Metrics.add``, ``Metrics.observe``). Counted
here, a request adds to a dict; the totals reach the series at the
end of the event loop's turn (one ``inc`` per series per turn, however many
requests the turn answered), and before every scrape (``Metrics.render``).

What a series misses is therefore at most what the current turn answered, and
only until the turn ends: a scrape of the same worker never misses it (a scrape
is answered in a later turn, and flushes first); a scrape of a sibling worker
could, for the microseconds between an answer being written and the end of its
turn, as it could before between the write and the count.

Used only on the event loop's thread (the per-request accounting runs there);
without a running loop (a script, a test outside a loop), each count goes to
its series at once.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Tally:
    """Counts and observations of per-request series, flushed at the end of a loop turn."""

    __slots__ = ("_counts", "_observed", "_scheduled")

    def __init__(self) -> None:
        self._counts: dict[Any, float] = {}  # a labelled Counter child -> what to add
        self._observed: dict[Any, list[float]] = {}  # a labelled Histogram child -> values
        self._scheduled = False

    def add(self, series: Any, amount: float = 1.0) -> None:
        counts = self._counts
        counts[series] = counts.get(series, 0.0) + amount
        if not self._scheduled:
            self._schedule()

    def observe(self, series: Any, value: float) -> None:
        values = self._observed.get(series)
        if values is None:
            self._observed[series] = [value]
        else:
            values.append(value)
        if not self._scheduled:
            self._schedule()

    def flush(self) -> None:
        """Hand every count and observation held to its series."""
        self._scheduled = False
        counts, self._counts = self._counts, {}
        observed, self._observed = self._observed, {}
        for series, amount in counts.items():
            if amount:  # a gauge moved up and back down within the turn: nothing to write
                series.inc(amount)
        for series, values in observed.items():
            for value in values:
                series.observe(value)

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)
