"""Every Prometheus metric Hoard exports, defined in this one place.

Metrics live on a registry owned by one ``Metrics`` object that ``cli.py``
builds and passes down: no module-level collectors, so tests can build as
many independent gateways as they like. Labels are bounded sets (operation,
status, source, origin name from config) — never a key, bucket or other
client-supplied string.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "hoard_requests_total",
            "S3 requests answered, by operation and HTTP status.",
            ["operation", "status"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "hoard_request_duration_seconds",
            "Time from request to the end of the response, by operation.",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.response_bytes = Counter(
            "hoard_response_bytes_total",
            "Response body bytes sent to clients, by operation.",
            ["operation"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
