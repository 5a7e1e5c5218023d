"""What the origin guard, the block source and the cluster report, as metrics.

The guard, the block source, the placement and the metadata router report
through small event protocols (``origins/guard.GuardEvents``,
``blocks.BlockEvents``, ``cluster/peers.PeerEvents``) and never touch a
Prometheus object; these adapters turn their events into the metrics that
``metrics.py`` defines (the one place every metric is defined). What every
origin request moves (its count, latency, slot, queue wait, bytes) is added up
per loop turn (``Metrics.add``, ``metric_tally.py``): a cold small object moved
nine series values one write each.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from gateway.obs.metrics import (
    BREAKER_STATES,
    LIMITS,
    ORIGIN_OPERATIONS,
    PRIORITIES,
    Metrics,
)


class OriginGuardMetrics:
    """One origin's protection metrics, with the origin label bound (``Metrics.origin_guard``)."""

    def __init__(self, metrics: Metrics, origin: str) -> None:
        self._m = metrics
        self._origin = origin = metrics.origin_label(origin)  # its position, not its name
        for priority in PRIORITIES:
            metrics.origin_in_flight.labels(origin, priority)
            metrics.origin_queued.labels(origin, priority)
            metrics.origin_queue_wait.labels(origin, priority)
        for limit in LIMITS:
            metrics.origin_throttled.labels(origin, limit)
        metrics.origin_breaker_open.labels(origin).set(0)
        for state in BREAKER_STATES:
            metrics.origin_breaker_transitions.labels(origin, state)
        for operation in ORIGIN_OPERATIONS:
            metrics.origin_retries.labels(origin, operation)
            metrics.origin_retry_budget_exhausted.labels(origin, operation)
        metrics.origin_resumes.labels(origin)
        for won in ("true", "false"):
            metrics.origin_hedges.labels(origin, won)

    def in_flight(self, priority: str, delta: int) -> None:
        self._m.add(self._m.origin_in_flight, self._origin, priority, amount=delta)

    def queued(self, priority: str, delta: int) -> None:
        self._m.origin_queued.labels(self._origin, priority).inc(delta)

    def waited(self, priority: str, seconds: float) -> None:
        self._m.observe(self._m.origin_queue_wait, (self._origin, priority), seconds)

    def throttled(self, limit: str) -> None:
        self._m.origin_throttled.labels(self._origin, limit).inc()

    def retried(self, operation: str) -> None:
        self._m.origin_retries.labels(self._origin, operation).inc()

    def budget_exhausted(self, operation: str) -> None:
        self._m.origin_retry_budget_exhausted.labels(self._origin, operation).inc()

    def resumed(self) -> None:
        self._m.origin_resumes.labels(self._origin).inc()

    def hedged(self, won: bool) -> None:
        self._m.origin_hedges.labels(self._origin, "true" if won else "false").inc()

    @contextlib.contextmanager
    def call(self, operation: str) -> Iterator[None]:
        """Count one origin request, its latency to the answer, and its failure if any."""
        m = self._m
        m.add(m.origin_requests, self._origin, operation)
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            m.origin_errors.labels(self._origin, operation, type(exc).__name__).inc()
            raise
        finally:
            m.observe(m.origin_duration, (self._origin, operation), time.perf_counter() - started)

    def breaker(self, state: str) -> None:
        self._m.origin_breaker_open.labels(self._origin).set(0 if state == "closed" else 1)
        self._m.origin_breaker_transitions.labels(self._origin, state).inc()


class BlockMetrics:
    """The block source's events as metrics (``blocks.BlockEvents``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def coalesced(self) -> None:
        self._m.add(self._m.coalesced_waiters)

    def admission_rejected(self) -> None:
        self._m.admission_rejections.inc()

    def from_origin(self, origin: str, size: int) -> None:
        self._m.add(self._m.origin_bytes, self._m.origin_label(origin), amount=size)


class PeerMetrics:
    """The cluster's peer requests as metrics (``cluster.peers.PeerEvents``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def requested(self, operation: str) -> None:
        self._m.peer_requests.labels(operation).inc()

    def failed(self, operation: str, kind: str) -> None:
        self._m.peer_errors.labels(operation, kind).inc()

    def took(self, operation: str, seconds: float) -> None:
        self._m.peer_duration.labels(operation).observe(seconds)

    def received(self, size: int) -> None:
        self._m.peer_bytes.inc(size)
