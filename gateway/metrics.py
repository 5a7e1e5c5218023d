"""Every Prometheus metric Hoard exports, defined in this one place.

Metrics live on a registry owned by one ``Metrics`` object that ``cli.py``
builds and passes down: no module-level collectors, so tests can build as
many independent gateways as they like. Labels are bounded sets (operation,
status, source, origin name from config) — never a key, bucket or other
client-supplied string.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Tiers an object byte can come from, and outcomes of a metadata lookup.
SOURCES = ("memory", "disk", "origin", "peer")
METADATA_STATES = ("hit", "miss", "stale", "stale_error", "negative")
WARM_STATES = ("queued", "running", "done", "failed", "cancelled")

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


def enable_multiprocess(directory: Path) -> None:
    """Make metrics created from now on in this process live in ``directory``.

    prometheus-client's multiprocess mode: each worker writes its values to
    memory-mapped files there and any worker's ``/metrics`` sums them. Call it
    in each worker before building ``Metrics``; the directory must be empty
    when the workers start.
    """
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values.ValueClass = values.MultiProcessValue()


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None,
                 multiprocess_dir: Path | None = None) -> None:  # fmt: skip
        self.registry = registry or CollectorRegistry()
        self._multiprocess_dir = multiprocess_dir
        # Called before each scrape, to set gauges that are cheaper to read than to track.
        self.before_render: list[Callable[[], None]] = []
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

        self.bytes_served = Counter(
            "hoard_bytes_served_total",
            "Object bytes handed to clients, by the tier they came from "
            "(memory, disk, origin, peer).",
            ["source"],
            registry=self.registry,
        )
        self.origin_requests = Counter(
            "hoard_origin_requests_total",
            "Requests Hoard sent to an origin, by origin name and S3 operation.",
            ["origin", "operation"],
            registry=self.registry,
        )
        self.origin_duration = Histogram(
            "hoard_origin_request_duration_seconds",
            "Time until an origin answered (headers, not the whole body), by operation.",
            ["origin", "operation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.origin_errors = Counter(
            "hoard_origin_errors_total",
            "Origin requests that failed, by origin, operation and error kind.",
            ["origin", "operation", "error"],
            registry=self.registry,
        )
        self.origin_bytes = Counter(
            "hoard_origin_bytes_total",
            "Object bytes received from an origin.",
            ["origin"],
            registry=self.registry,
        )
        self.write_through_bytes = Counter(
            "hoard_write_through_bytes_total",
            "Object bytes a write through Hoard also placed in the block cache.",
            registry=self.registry,
        )
        self.coalesced_waiters = Counter(
            "hoard_coalesced_waiters_total",
            "Block reads that joined a fill already in flight instead of asking the origin.",
            registry=self.registry,
        )
        self.cache_evictions = Counter(
            "hoard_cache_evictions_total",
            "Blocks evicted to stay within a tier's bound, by tier.",
            ["tier"],
            registry=self.registry,
        )
        self.corrupt_blocks = Counter(
            "hoard_cache_corrupt_blocks_total",
            "Disk blocks that failed their checksum or header check and were dropped.",
            registry=self.registry,
        )
        self.metadata_lookups = Counter(
            "hoard_metadata_lookups_total",
            "Metadata cache lookups by kind (head, list) and outcome "
            "(hit, miss, stale, stale_error, negative).",
            ["kind", "state"],
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            "hoard_cache_bytes",
            "Bytes held by a cache tier.",
            ["tier"],
            registry=self.registry,
            multiprocess_mode="max",
        )
        self.cache_limit_bytes = Gauge(
            "hoard_cache_limit_bytes",
            "Configured bound of a cache tier.",
            ["tier"],
            registry=self.registry,
            multiprocess_mode="max",
        )

        # The cluster: block reads from peers (labels: operation, outcome — bounded).
        self.peer_requests = Counter(
            "hoard_peer_requests_total",
            "Requests to other cluster nodes, by operation (block, invalidate).",
            ["operation"],
            registry=self.registry,
        )
        self.peer_errors = Counter(
            "hoard_peer_errors_total",
            "Requests to other cluster nodes that failed, by operation and kind.",
            ["operation", "kind"],
            registry=self.registry,
        )
        self.peer_bytes = Counter(
            "hoard_peer_bytes_total",
            "Block bytes received from other cluster nodes.",
            registry=self.registry,
        )
        self.peer_duration = Histogram(
            "hoard_peer_request_duration_seconds",
            "Time from a peer request to its last byte, by operation.",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.membership_changes = Counter(
            "hoard_cluster_membership_changes_total",
            "Changes of this node's view of the live cluster members.",
            registry=self.registry,
        )
        self.live_members = Gauge(
            "hoard_cluster_live_members",
            "Cluster members this node sees as live, itself included.",
            registry=self.registry,
            multiprocess_mode="max",
        )

        # Warm jobs (labels bounded: how a block was had, job states).
        self.warm_bytes = Counter(
            "hoard_warm_bytes_total",
            "Bytes of owned blocks warm jobs completed on this node, by whether they were "
            "fetched from the origin or already cached.",
            ["how"],
            registry=self.registry,
        )
        self.warm_objects = Counter(
            "hoard_warm_objects_total",
            "Objects whose share on this node a warm job completed (failed ones included).",
            registry=self.registry,
        )
        self.warm_jobs = Gauge(
            "hoard_warm_jobs",
            "Warm job shares known to this node, by state.",
            ["state"],
            registry=self.registry,
            multiprocess_mode="max",
        )
        self.pinned_bytes = Gauge(
            "hoard_cache_pinned_bytes",
            "Disk tier bytes under a live pin (exempt from eviction).",
            registry=self.registry,
            multiprocess_mode="max",
        )
        self._create_known_series()

    @contextlib.contextmanager
    def origin_call(self, origin: str, operation: str) -> Iterator[None]:
        """Count one origin request, its latency to the answer, and its failure if any."""
        self.origin_requests.labels(origin, operation).inc()
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            self.origin_errors.labels(origin, operation, type(exc).__name__).inc()
            raise
        finally:
            self.origin_duration.labels(origin, operation).observe(time.perf_counter() - started)

    def _create_known_series(self) -> None:
        """Export bounded label sets at 0 from the start.

        A series that first appears with its increase already in it has a
        ``rate()`` of 0 over its first window: a hit ratio would read 0 right
        after the first warm hit. Prometheus' advice: initialise what you can.
        """
        for source in SOURCES:
            self.bytes_served.labels(source)
        for tier in ("memory", "disk"):
            self.cache_evictions.labels(tier)
        for kind in ("head", "list"):
            for state in METADATA_STATES:
                self.metadata_lookups.labels(kind, state)
        for how in ("fetched", "cached"):
            self.warm_bytes.labels(how)
        for state in WARM_STATES:
            self.warm_jobs.labels(state)

    def served(self, memory: int = 0, disk: int = 0, origin: int = 0, peer: int = 0) -> None:
        """Count object bytes handed to a client by the tier that supplied them."""
        for source, count in (
            ("memory", memory),
            ("disk", disk),
            ("origin", origin),
            ("peer", peer),
        ):
            if count:
                self.bytes_served.labels(source).inc(count)

    def render(self) -> bytes:
        for refresh in self.before_render:
            refresh()
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        multiprocess.MultiProcessCollector(combined, path=str(self._multiprocess_dir))
        return generate_latest(combined)
