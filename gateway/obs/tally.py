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

Each series is a labelled child of a metric, and ``labels()`` hashes and
locks on every call: ``PerRequestSeries`` looks each child up once per label
set and keeps it (the label sets are bounded), and is what ``Metrics``
counts per-request series with (``Metrics.add``, ``Metrics.observe``); the
metrics themselves are all defined in ``metrics.py``.

Used only on the event loop's thread (the per-request accounting runs there);
without a running loop (a script, a test outside a loop), each count goes to
its series at once.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from typing import Any


class Tally:
    """Counts and observations of per-request series, flushed at the end of a loop turn."""

    __slots__ = ("_counts", "_hits", "_observed", "_scheduled")

    def __init__(self) -> None:
        self._counts: dict[Any, float] = {}  # a labelled Counter child -> what to add
        self._observed: dict[Any, list[float]] = {}  # a labelled Histogram child -> values
        # A hit's five series (``hit``) -> [answers, body bytes, seconds of each]
        self._hits: dict[tuple[Any, ...], list[Any]] = {}
        self._scheduled = False

    def add(self, series: Any, amount: float = 1.0) -> None:
        counts = self._counts
        counts[series] = counts.get(series, 0.0) + amount
        if not self._scheduled:
            self._schedule()

    def hit(self, series: tuple[Any, ...], body_bytes: int, seconds: float) -> None:
        """A whole hit (``Metrics.hit_answered``): ``series`` are its answers' and hits'
        counters (each +1), its body's and bytes' counters (each + ``body_bytes``), and
        its latency histogram; one dict entry per label set, not five."""
        held = self._hits.get(series)
        if held is None:
            self._hits[series] = [1, body_bytes, [seconds]]
        else:
            held[0] += 1
            held[1] += body_bytes
            held[2].append(seconds)
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
        hits, self._hits = self._hits, {}
        for (answers, body, served, hit, latency), (count, sent, seconds) in hits.items():
            for series, amount in ((answers, count), (body, sent), (served, sent), (hit, count)):
                counts[series] = counts.get(series, 0.0) + amount
            observed.setdefault(latency, []).extend(seconds)
        for series, amount in counts.items():
            if amount:  # a gauge moved up and back down within the turn: nothing to write
                series.inc(amount)
        for series, values in observed.items():
            _observe_all(series, values)

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)


def _observe_all(series: Any, values: list[float]) -> None:
    """``series.observe(v)`` for each of ``values``, its buckets' and sum's values moved
    once each: ``observe`` walks the bounds and takes two locks per value (with workers:
    two writes of the shared file), ~3 µs of a hit's accounting. prometheus_client's
    histogram child keeps ``_upper_bounds``, ``_buckets`` (one per bound, not cumulative:
    a value counts in the first bucket whose bound holds it) and ``_sum``; another's is
    observed value by value."""
    bounds = getattr(series, "_upper_bounds", None)
    buckets = getattr(series, "_buckets", None)
    total = getattr(series, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            series.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        if value == value:  # a NaN is summed but counted in no bucket, as ``observe`` does
            i = bisect_left(bounds, value)  # the first bound >= value, as ``observe`` finds
            counts[i] = counts.get(i, 0) + 1
    total.inc(sum(values))
    for i, count in counts.items():
        buckets[i].inc(count)


class PerRequestSeries:
    """The machinery ``Metrics`` counts per-request series with: each labelled child
    looked up once per label set and kept, its counts added up in a ``Tally``."""

    def __init__(self) -> None:
        # Labelled children of the per-request series, by label values (bounded sets).
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        # Their counts, added up per loop turn; flushed before a scrape.
        self._tally = Tally()

    def add(self, metric: Any, *labels: str, amount: float = 1.0) -> None:
        """Add ``amount`` to a counter's or gauge's series at the end of this loop turn
        (``metric_tally.py``): for series moved on every request, a cold one included."""
        self._tally.add(self._child(metric, *labels), amount)

    def observe(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        """Observe ``value`` in a histogram's series at the end of this loop turn."""
        self._tally.observe(self._child(metric, *labels), value)

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once per label set and kept.

        ``labels()`` hashes and locks on every call, a noticeable share of a
        cached small-object GET; the per-request series have bounded label sets.
        """
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels) if labels else metric
        return child

    def flush(self) -> None:
        """Hand the per-request counts of this loop turn to their series now (``render``
        does; a test reading the registry itself does too)."""
        self._tally.flush()
