"""What one request counts: the per-request methods of ``Metrics``.

``metrics.py`` defines every metric; this is how a request, a hit, a cut
answer, a metadata lookup or a batch GET moves them, each through labelled
children looked up once per label set and counts added up per loop turn
(``tally.py``). ``Metrics`` inherits these methods, so a caller holds one
object for both; the metrics they move are ``Metrics``' attributes, declared
here for the type checker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.obs.tally import PerRequestSeries


class RequestCounting(PerRequestSeries):
    """The counting half of ``Metrics`` (see the module)."""

    # Defined by ``Metrics.__init__`` (``metrics.py``).
    requests: Any
    request_duration: Any
    response_bytes: Any
    responses_cut: Any
    metadata_lookups: Any
    revalidations: Any
    bytes_served: Any
    bundles: Any
    bundle_keys: Any
    bundle_bytes: Any
    hit_path: Any

    def __init__(self) -> None:
        super().__init__()
        # (operation, status, mount) -> its request, duration and bytes series (``answered``)
        self._answer_series: dict[tuple[str, int | str, str], tuple[Any, Any, Any]] = {}
        # (source, status, mount) -> a hit's five series (``hit_answered``)
        self._hit_series: dict[tuple[str, int, str], tuple[Any, ...]] = {}

    def answered(
        self, operation: str, status: int | str, mount: str, seconds: float, body_bytes: int
    ) -> None:
        """Count one S3 response: its operation, status, latency and body bytes."""
        series = self._answer_series.get((operation, status, mount))
        if series is None:  # the three children of one label set, looked up once together
            series = self._answer_series[(operation, status, mount)] = (
                self._child(self.requests, operation, str(status), mount),
                self._child(self.request_duration, operation, mount),
                self._child(self.response_bytes, operation, mount),
            )
        tally = self._tally
        tally.add(series[0])
        tally.observe(series[1], seconds)
        tally.add(series[2], body_bytes)

    def cut(self, operation: str, reason: str, mount: str, seconds: float, body_bytes: int) -> None:
        """Count one response cut mid-body: as status "cut" (not its 200), and by reason."""
        self.answered(operation, "cut", mount, seconds, body_bytes)
        self._child(self.responses_cut, reason).inc()

    def metadata_lookup(self, kind: str, state: str, mount: str, times: int = 1) -> None:
        """Count ``times`` metadata lookups of one outcome (``METADATA_STATES``)."""
        self._tally.add(self._child(self.metadata_lookups, kind, state, mount), times)

    def revalidated(self, outcome: str, mount: str) -> None:
        """Count one revalidation of a known object by outcome (``REVALIDATIONS``)."""
        self._child(self.revalidations, outcome, mount).inc()

    def served(self, mount: str, tally: Mapping[str, int]) -> None:
        """Count object bytes handed to a client, by the tier that supplied them (``SOURCES``)."""
        for source, count in tally.items():
            if count:
                self._tally.add(self._child(self.bytes_served, source, mount), count)

    def bundle(self, sent: int, skipped: int, object_bytes: int) -> None:
        """Count one batch GET: its keys sent and skipped, and its object bytes."""
        self._tally.add(self._child(self.bundles))
        self._tally.add(self._child(self.bundle_keys, "sent"), sent)
        self._tally.add(self._child(self.bundle_keys, "skipped"), skipped)
        self._tally.add(self._child(self.bundle_bytes), object_bytes)

    def hit(self, source: str) -> None:
        """Count one GET answered by the hit path, by the tier it came from."""
        self._tally.add(self._child(self.hit_path, source))

    def hit_answered(
        self, source: str, status: int, mount: str, seconds: float, body_bytes: int
    ) -> None:
        """A whole hit's counts in one call: ``answered`` (a GetObject), ``served`` from
        ``source``, and ``hit``; the five series of one label set looked up once together."""
        series = self._hit_series.get((source, status, mount))
        if series is None:
            series = self._hit_series[(source, status, mount)] = (
                self._child(self.requests, "GetObject", str(status), mount),
                self._child(self.response_bytes, "GetObject", mount),
                self._child(self.bytes_served, source, mount),
                self._child(self.hit_path, source),
                self._child(self.request_duration, "GetObject", mount),
            )
        self._tally.hit(series, body_bytes, seconds)
