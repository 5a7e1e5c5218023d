"""Every Prometheus metric Hoard exports, defined in this one place.

Metrics live on a registry owned by one ``Metrics`` object that ``app/wiring.py``
builds and passes down: no module-level collectors, so tests can build as
many independent gateways as they like. Labels are bounded sets (operation,
status, source, tier...) and carry no name from a request or from the config, as
``/metrics`` is unsigned: never a key or a bucket, and neither a mount's bucket
nor an origin's name. ``mount`` is a configured mount's position in ``mounts:``
(``m0``, ``m1``...; ``Namespace.label``), ``default`` for any bucket passed
through to ``default_origin``, and empty for requests outside a bucket;
``origin`` is an origin's position in ``origins:`` (``o0``...; ``origin_label``).

With ``workers: N`` every worker writes its values to the node's multiprocess
directory and a scrape of any worker sums them (``render``). Each gauge says
how: ``livesum`` for what each live worker holds (origin requests in flight,
its memory tier) and for what is the node's and set by the leader worker
alone (disk bytes, pins, warm jobs: ``app/wiring.py``'s ``tier_levels``), so it is
counted once; ``max`` where every worker sees the same value (the cluster's
live members, an open breaker).

Definitions only: what a request counts is ``counting.py`` (``RequestCounting``,
the base of ``Metrics``), the machinery ``tally.py`` (``PerRequestSeries``) and
``process.py`` (workers' summed scrapes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway.obs.counting import RequestCounting
from gateway.obs.process import ProcessTreeCollector, render_node

# Tiers an object byte can come from, and outcomes of a metadata lookup.
SOURCES = ("memory", "disk", "origin", "peer")
METADATA_STATES = ("hit", "miss", "stale", "stale_error", "negative")
# How expired metadata of a known object was revalidated (gateway/metadata/revalidate.py).
REVALIDATIONS = ("confirmed", "changed", "unlisted", "too_big", "list_failed")
# Origin protection: who waits, which limit held a request back, breaker states.
PRIORITIES = ("client", "background")
LIMITS = ("concurrency", "requests", "bytes")
BREAKER_STATES = ("open", "half_open", "closed")
ORIGIN_OPERATIONS = ("GetObject", "HeadObject", "ListObjectsV2", "HeadBucket",
                     "GetBucketLocation", "ListBuckets")  # fmt: skip
WARM_STATES = ("queued", "running", "done", "failed", "cancelled")
WARM_AUTO_DECISIONS = ("started", "running", "too_big")
CUT_REASONS = ("origin_unavailable", "origin_changed", "client_gone", "error")

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class Metrics(RequestCounting):
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None,
                 multiprocess_dir: Path | None = None, origins: Iterable[str] = ()) -> None:  # fmt: skip
        """``origins``: the configured origins' names, in the config's order: the ``origin``
        label of each is its position (``o0``, ``o1``...), never its name."""
        super().__init__()  # the per-request series' children, tally and counts (counting.py)
        self._origin_labels = {name: f"o{index}" for index, name in enumerate(origins)}
        self.registry = registry or CollectorRegistry()
        self._process = ProcessTreeCollector(tree=multiprocess_dir is not None)
        self.registry.register(self._process)
        self._multiprocess_dir = multiprocess_dir
        # Called before each scrape, to set gauges that are cheaper to read than to track.
        self.before_render: list[Callable[[], None]] = []
        self.before_render.append(self._tally.flush)  # per-request counts, before a scrape
        self.requests = Counter(
            "hoard_requests_total",
            'S3 requests answered, by operation, HTTP status ("cut": a body cut after its '
            "headers) and mount.",
            ["operation", "status", "mount"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "hoard_request_duration_seconds",
            "Time from request to the end of the response, by operation and mount.",
            ["operation", "mount"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.response_bytes = Counter(
            "hoard_response_bytes_total",
            "Response body bytes sent to clients, by operation and mount.",
            ["operation", "mount"],
            registry=self.registry,
        )

        self.responses_cut = Counter(
            "hoard_responses_cut_total",
            "Responses cut after their headers (the connection dropped short of the "
            "declared length), by reason (origin_unavailable, origin_changed, client_gone, "
            'error). Counted in hoard_requests_total with status "cut".',
            ["reason"],
            registry=self.registry,
        )
        self.bytes_served = Counter(
            "hoard_bytes_served_total",
            "Object bytes handed to S3 clients, by the tier they came from "
            "(memory, disk, origin, peer) and mount.",
            ["source", "mount"],
            registry=self.registry,
        )
        self.hit_path = Counter(
            "hoard_hit_path_responses_total",
            "GETs answered by the hit path (a whole small object held in memory or on disk, "
            "served without the general machinery), by tier (memory, disk). Counted in "
            "hoard_requests_total too.",
            ["source"],
            registry=self.registry,
        )
        self.bundles = Counter(
            "hoard_bundles_total",
            "Batch GETs (POST ?bundle) answered with an archive, whole or cut.",
            registry=self.registry,
        )
        self.bundle_keys = Counter(
            "hoard_bundle_keys_total",
            "Keys of batch GETs, by outcome: sent as an archive member, or skipped "
            "(missing, refused or not readable; listed in __bundle_errors.json).",
            ["outcome"],
            registry=self.registry,
        )
        self.bundle_bytes = Counter(
            "hoard_bundle_object_bytes_total",
            "Object bytes sent in batch GET archives (TAR headers and padding not counted).",
            registry=self.registry,
        )
        self.origin_requests = Counter(
            "hoard_origin_requests_total",
            "Requests Hoard sent to an origin, by origin name and S3 operation (a hedge and "
            "a resume each count; tries after a failure count as retries).",
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
        self.disk_full = Counter(
            "hoard_cache_disk_full_total",
            "Times the disk tier found its file system full before its capacity, lowered its "
            "limit to a low watermark and evicted down to it.",
            registry=self.registry,
        )
        self.corrupt_blocks = Counter(
            "hoard_cache_corrupt_blocks_total",
            "Disk blocks that failed their checksum or header check and were dropped.",
            registry=self.registry,
        )
        self.metadata_lookups = Counter(
            "hoard_metadata_lookups_total",
            "Metadata cache lookups by kind (head, list; page: a rendered listing page of a "
            "cached whole listing, hit when its bytes were reused) and outcome "
            "(hit, miss, stale, stale_error, negative; too_big: a prefix whose listing outgrew "
            "the memory for one snapshot, cached page by page instead; evicted, with no mount) "
            "and mount.",
            ["kind", "state", "mount"],
            registry=self.registry,
        )
        self.revalidations = Counter(
            "hoard_metadata_revalidations_total",
            "Expired metadata of known objects revalidated, by outcome: confirmed by a "
            "listing of its directory (no HEAD), or one HEAD because the listing showed it "
            "changed or unlisted, or could not be had whole (too_big, list_failed), and mount.",
            ["outcome", "mount"],
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            "hoard_cache_bytes",
            "Bytes held by a cache tier (memory: summed over the node's workers).",
            ["tier"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.cache_limit_bytes = Gauge(
            "hoard_cache_limit_bytes",
            "Configured bound of a cache tier (memory: cache.memory, shared by the workers).",
            ["tier"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )

        self.admission_rejections = Counter(
            "hoard_cache_admission_rejections_total",
            "Filled blocks kept off the disk tier by scan-resistant admission (first miss).",
            registry=self.registry,
        )
        self.read_ahead_window = Histogram(
            "hoard_read_ahead_window_blocks",
            "Read-ahead window of sequential streams, in blocks, at each read and each widening.",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.prefetch_bytes = Counter(
            "hoard_prefetch_bytes_total",
            "Block bytes epoch-order prefetch fetched ahead of readers (not already cached).",
            registry=self.registry,
        )
        self.hit_wire = Gauge(
            "hoard_hit_wire_enabled",
            "1: hits are answered inside the connection's protocol, as they are parsed "
            "(gateway/hotwire.py); 0: behind aiohttp's request machinery, because the aiohttp "
            "internals it needs are missing (logged at start).",
            registry=self.registry,
            multiprocess_mode="min",
        )
        self.compiled = Gauge(
            "hoard_compiled_extension",
            "1: the compiled twin of this module runs (gateway/core/compiled.py); 0: its "
            "Python twin (not built at install, or HOARD_NO_EXTENSIONS=1).",
            ["module"],
            registry=self.registry,
            multiprocess_mode="min",
        )
        self.prefetch_streams = Gauge(
            "hoard_prefetch_streams",
            "Epoch-order prefetch streams registered on this node.",
            registry=self.registry,
            multiprocess_mode="livesum",
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
        self._origin_protection()

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
        self.warm_auto = Counter(
            "hoard_warm_auto_total",
            "Cold epochs over a listed prefix that auto-warm spotted, by what it did: "
            "started a job, found one running, or left a prefix too big for the cache.",
            ["decision"],
            registry=self.registry,
        )
        self.warm_jobs = Gauge(
            "hoard_warm_jobs",
            "Warm job shares known to this node, by state.",
            ["state"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.pinned_bytes = Gauge(
            "hoard_cache_pinned_bytes",
            "Disk tier bytes under a live pin (exempt from eviction).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self._create_known_series()

    def _origin_protection(self) -> None:
        """What ``origins/guard.py`` reports, per origin (labels: origin, priority, limit, state)."""
        self.origin_in_flight = Gauge(
            "hoard_origin_in_flight_requests",
            "Origin requests holding a concurrency slot (a GET until its body is read or closed), "
            "by origin and priority (client, background).",
            ["origin", "priority"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.origin_queued = Gauge(
            "hoard_origin_queued_requests",
            "Origin requests waiting for a concurrency slot, by origin and priority.",
            ["origin", "priority"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.origin_queue_wait = Histogram(
            "hoard_origin_queue_wait_seconds",
            "Time an origin request waited for a concurrency slot, by origin and priority.",
            ["origin", "priority"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.origin_throttled = Counter(
            "hoard_origin_throttled_total",
            "Origin requests (or body chunks, for bytes) held back by a limit, by origin and "
            "limit (concurrency, requests, bytes).",
            ["origin", "limit"],
            registry=self.registry,
        )
        self.origin_retries = Counter(
            "hoard_origin_retries_total",
            "Origin requests tried again after a failure, by origin and operation.",
            ["origin", "operation"],
            registry=self.registry,
        )
        self.origin_retry_budget_exhausted = Counter(
            "hoard_origin_retry_budget_exhausted_total",
            "Failed origin requests not retried because the retry budget was spent.",
            ["origin", "operation"],
            registry=self.registry,
        )
        self.origin_resumes = Counter(
            "hoard_origin_resumes_total",
            "Origin GET bodies that broke mid-way and were continued from the next byte.",
            ["origin"],
            registry=self.registry,
        )
        self.origin_hedges = Counter(
            "hoard_origin_hedges_total",
            "Second requests started for a stalled origin GET, by origin and whether the "
            "hedge delivered first (won: true, false).",
            ["origin", "won"],
            registry=self.registry,
        )
        self.origin_breaker_open = Gauge(
            "hoard_origin_breaker_open",
            "1 while the circuit breaker for an origin is open or half-open, else 0.",
            ["origin"],
            registry=self.registry,
            multiprocess_mode="max",
        )
        self.origin_breaker_transitions = Counter(
            "hoard_origin_breaker_transitions_total",
            "Circuit breaker state changes, by origin and the state entered "
            "(open, half_open, closed).",
            ["origin", "state"],
            registry=self.registry,
        )

    def origin_label(self, name: str) -> str:
        """The ``origin`` label of the origin named ``name`` in the config. A ``Metrics``
        built without the names (a test's own) labels an origin by its name."""
        return self._origin_labels.get(name, name)

    def _create_known_series(self) -> None:
        """Export bounded label sets at 0 from the start.

        A series that first appears with its increase already in it has a
        ``rate()`` of 0 over its first window: a hit ratio would read 0 right
        after the first warm hit. Prometheus' advice: initialise what you can.
        """
        for tier in ("memory", "disk"):
            self.cache_evictions.labels(tier)
        for reason in CUT_REASONS:
            self.responses_cut.labels(reason)
        for outcome in ("sent", "skipped"):
            self.bundle_keys.labels(outcome)
        for how in ("fetched", "cached"):
            self.warm_bytes.labels(how)
        for state in WARM_STATES:
            self.warm_jobs.labels(state)
        for decision in WARM_AUTO_DECISIONS:
            self.warm_auto.labels(decision)

    def create_mount_series(self, mounts: Iterable[str]) -> None:
        """Export the per-mount series at 0 too, for the ``mount`` labels known at start."""
        for mount in mounts:
            for source in SOURCES:
                self.bytes_served.labels(source, mount)
            for kind in ("head", "list"):
                for state in METADATA_STATES:
                    self.metadata_lookups.labels(kind, state, mount)
            for outcome in REVALIDATIONS:
                self.revalidations.labels(outcome, mount)

    def render(self) -> bytes:
        for refresh in self.before_render:
            refresh()
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        return render_node(self._multiprocess_dir, self._process)
