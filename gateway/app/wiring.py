"""Wiring: the only place that builds Hoard's objects, in dependency order.

``build(settings)`` turns one settings object into the application: origins
behind their guards, the tiers, the metadata tiers, coherence (the watches and
the invalidator), then the reader and the writer as siblings over them
(``read_and_write``),
the cluster node, warm jobs and prefetch, the admin endpoints, and the S3 front,
each given what it needs and nothing global. The process around it (the
command line, workers, signals, the listening socket) is ``cli.py``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import signal
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from gateway.app.admin import Admin, worker_stats
from gateway.app.server import build_app
from gateway.blocks.source import BlockSource
from gateway.cache.admission import Doorkeeper
from gateway.cache.disk import DiskTier
from gateway.cache.memory import MemoryTier
from gateway.cluster.directory import MetadataRouter
from gateway.cluster.node import ClusterNode
from gateway.cluster.peers import BlockRequest
from gateway.coherence.invalidator import Invalidator
from gateway.coherence.watch import Watches
from gateway.config.settings import (
    ConfigError,
    S3OriginConfig,
    Settings,
    split_listen,
)
from gateway.core import errors, tls
from gateway.core.hot_sets import DEFAULT, HotSets
from gateway.core.invalidation import Broadcast, Invalidation
from gateway.metadata.journal import Journal, SoloJournal
from gateway.metadata.memory import MetadataCache
from gateway.metadata.pages import SharedPages
from gateway.metadata.query import MetadataQuery
from gateway.metadata.source import MetadataSource, NoOwner, SharedAnswers, origin_named
from gateway.metadata.store import MetadataStore
from gateway.node.leader import Leadership
from gateway.node.shared import LeaderDocument
from gateway.node.stats import WorkerStats
from gateway.obs.access_log import AccessLog
from gateway.obs.events import BlockMetrics, OriginGuardMetrics
from gateway.obs.metrics import Metrics
from gateway.origins.base import Origin
from gateway.origins.guard import OriginGuard
from gateway.origins.namespace import Namespace
from gateway.origins.posix import PosixOrigin
from gateway.origins.s3 import S3Origin
from gateway.pieces import BlockRef, Piece
from gateway.prefetch.api import PrefetchApi
from gateway.prefetch.node import NodePrefetch
from gateway.prefetch.prefetcher import Prefetcher
from gateway.prefetch.registry import Registry
from gateway.read.readahead import ReadAheadPolicy
from gateway.read.reader import Reader
from gateway.s3.auth import Authenticator
from gateway.s3.body import BodySender
from gateway.s3.front import S3Front
from gateway.warm.auto import AutoWarm
from gateway.warm.fanout import ShareClient
from gateway.warm.http import WarmHttp
from gateway.warm.jobs import WarmJobs
from gateway.warm.listed import ListedPrefixes
from gateway.warm.share import WarmTiers
from gateway.warm.store import JobStore
from gateway.write.through import WriteThrough, WriteThroughs
from gateway.write.writer import Writer

log = logging.getLogger("hoard")
TLS_CONTEXT = web.AppKey("tls_context", ssl.SSLContext)  # HTTPS on the listen address
GAUGES = web.AppKey("gauges", asyncio.Task)  # a worker's periodic gauge refresh
GAUGE_REFRESH = 1.0  # seconds between a worker's refreshes of its gauges


def build_origins(settings: Settings, metrics: Metrics) -> dict[str, Origin]:
    """Every configured origin, each behind its guard (limits, retries, circuit breaker)."""
    origins: dict[str, Origin] = {}
    for name, cfg in settings.origins.items():
        origin: Origin
        if isinstance(cfg, S3OriginConfig):
            origin = S3Origin(name, cfg)
        else:
            origin = PosixOrigin(name, cfg.path)
        origins[name] = OriginGuard(origin, cfg, OriginGuardMetrics(metrics, name))
    return origins


def build(
    settings: Settings,
    metrics_dir: Path | None = None,
    reload: Callable[[], Settings] | None = None,
    reloaded: bool = False,
) -> web.Application:
    """Wire every object of one gateway process from its settings.

    ``metrics_dir`` is set when this process is one of several workers;
    ``reload`` re-reads the config on SIGHUP (credentials and ``cluster.peers`` are applied);
    ``reloaded``: a worker started after a SIGHUP applies it at start, as its siblings did.
    """
    metrics = Metrics(multiprocess_dir=metrics_dir, origins=settings.origins)
    shared = metrics_dir is not None
    cache = settings.cache
    namespace = Namespace.from_settings(settings, build_origins(settings, metrics))
    metrics.create_mount_series(namespace.labels())
    assert isinstance(settings.workers, int)  # "auto" was resolved by load()
    leadership = Leadership(cache.dir / "node" / "leader")  # the node's once-per-node work
    # cache.memory bounds the node: each worker holds its share (see gateway/node/).
    memory = MemoryTier(
        cache.memory // settings.workers, cache.memory_item_max,
        on_evict=lambda n: metrics.cache_evictions.labels("memory").inc(n),
        max_on_disk=cache.memory_item_max_on_disk,
    )  # fmt: skip
    disk = DiskTier(
        cache.dir, cache.size, fsync=cache.fsync, open_files=cache.open_files,
        on_evict=lambda n: metrics.cache_evictions.labels("disk").inc(n),
        on_corrupt=metrics.corrupt_blocks.inc, on_full=metrics.disk_full.inc,
        packed_max=cache.packed_block_max, segment_size=cache.segment_size,
    )  # fmt: skip
    body = BodySender(send_timeout=settings.send_timeout)
    node_view = (  # one membership for the node's workers, probed by the leader
        LeaderDocument(cache.dir / "node" / "membership.json", leadership)
        if settings.workers > 1
        else None
    )
    cluster = _cluster(settings, metrics, body, node_view)
    placement = cluster.placement if cluster is not None else None
    admission = (
        Doorkeeper(cache.admission, cache.admission_window) if cache.admission != "always" else None
    )
    blocks = BlockSource(
        memory, disk, BlockMetrics(metrics), cache.fill_concurrency, placement, admission
    )
    metadata = MetadataCache(
        head_bytes=cache.metadata_head_bytes, listing_bytes=cache.metadata_listing_bytes,
        whole_listing_bytes=cache.whole_listing_bytes,
        on_event=functools.partial(_metadata_event, metrics),
    )  # fmt: skip
    store = MetadataStore(
        cache.dir / "metadata.sqlite3", max_rows=cache.metadata_store_rows, shared=shared
    )
    journal = Journal(cache.dir / "journal")  # what sibling workers invalidated
    router = cluster.directory if cluster is not None else None
    read_ahead = ReadAheadPolicy(cache.read_ahead, cache.read_ahead_max, cache.read_ahead_idle)
    broadcast = cluster.broadcast if cluster is not None else None
    hot = HotSets.sized(cache.hit_keys)  # the hit path's hot sets: reader, front, presigned memo
    core = read_and_write(
        namespace, blocks, metadata, metrics, cache.block_size, read_ahead=read_ahead,
        store=store, router=router, journal=journal, broadcast=broadcast,
        pages=SharedPages(cache.dir / "node" / "pages", store) if shared else None, hot=hot,
    )  # fmt: skip
    reader, writer, invalidator = core.reader, core.writer, core.invalidator
    prefetcher = Prefetcher(settings.prefetch, reader.block_refs, blocks, metrics, cache.block_size)
    registry = Registry(cache.dir / "prefetch", settings.prefetch.max_streams)
    node_prefetch = NodePrefetch(registry, prefetcher, leadership)  # the node's streams
    reader.observers.append(node_prefetch.observe)
    prefetch_api = PrefetchApi(
        node_prefetch, reader, settings.prefetch, cluster.announce if cluster is not None else None
    )
    auth = Authenticator(settings.credentials, settings.allow_anonymous,
                         domains=settings.virtual_host_domains, region=None if settings.region == "any" else settings.region,
                         verdicts_kept=hot.urls)  # fmt: skip
    front = S3Front(reader, writer, auth, settings.virtual_host_domains, body,
                    settings.body_timeout, hot)  # fmt: skip
    access = AccessLog(as_json=settings.log_format == "json", enabled=settings.access_log)
    warm = _warm(settings, reader, WarmTiers(blocks, disk, store), metrics, cluster)
    warm_http = WarmHttp(warm)
    auto_warm = AutoWarm(
        metadata, settings.warm, lambda: disk.limit, warm.warming,
        functools.partial(warm.submit, bucket_known=True), metrics,
        ListedPrefixes(cache.dir / "node" / "listed"),
        lambda bucket, prefix: reader.list_objects(bucket, prefix, "", "", 1),
    )  # fmt: skip
    reader.cold_reads.append(auto_warm.cold)
    reader.client_listings.append(auto_warm.listing)
    stats = WorkerStats(
        cache.dir / "node" / "stats" if shared else None,
        functools.partial(worker_stats, blocks, metadata),
    )
    admin = Admin(
        invalidator, auth, metrics, stats.node, cluster.snapshot if cluster is not None else None,
        prefetch_api, warm_http,
    )  # fmt: skip
    if cluster is not None:
        cluster.server.serve(PeerAnswers(namespace, blocks, core, prefetch_api))
        cluster.server.mount("warm", warm_http.peer)
    app = build_app(
        front, metrics, settings.virtual_host_domains, admin, access,
        cluster.server if cluster is not None else None,
    )  # fmt: skip
    metrics.cache_limit_bytes.labels("memory").set(memory.capacity)

    def tier_levels() -> None:
        """Each worker reports its memory tier; the leader alone what is the node's (the
        gauges are summed over live workers: see metrics.py)."""
        metrics.cache_bytes.labels("memory").set(memory.used)
        if not leadership.leads:
            return
        metrics.cache_bytes.labels("disk").set(disk.stats().used_bytes)
        metrics.cache_limit_bytes.labels("disk").set(disk.limit)  # lowered by a full disk
        metrics.pinned_bytes.set(disk.stats().pinned_bytes)
        for state, count in warm.counts().items():
            metrics.warm_jobs.labels(state).set(count)

    metrics.before_render.append(tier_levels)

    on_sighup = []  # what a SIGHUP reloads: the certificate, the credentials, the cluster's peers
    cert, key = settings.tls.cert, settings.tls.key
    if cert is not None and key is not None:
        app[TLS_CONTEXT] = tls.server_context(cert, key)
        on_sighup.append(functools.partial(tls.reload, app[TLS_CONTEXT], cert, key))

    async def start(app: web.Application) -> None:
        leadership.start()
        if shared:  # a scrape is answered by one worker: the others' gauges must be current
            stats.publish()
            app[GAUGES] = asyncio.create_task(_every(GAUGE_REFRESH, tier_levels, stats.publish))
        journal.open()
        node_prefetch.start()
        await disk.start()
        await store.start()
        if cluster is not None:
            await cluster.start()
        if reload is not None:
            on_sighup.append(functools.partial(_reload, reload, auth, cluster))
            if reloaded:
                _reload(reload, auth, cluster)  # not the config the node started with
        if on_sighup:
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: [each() for each in on_sighup]
            )
        await warm.start()  # after the cluster: a resumed share needs to know who owns what

    async def stop(app: web.Application) -> None:
        if GAUGES in app:
            app[GAUGES].cancel()
            stats.forget()
        await auto_warm.close()
        await warm.close()
        await writer.close()  # pending write-throughs, before the tiers they write to
        await node_prefetch.close()
        await invalidator.close()  # origin changes still being told to other nodes
        if cluster is not None:
            await cluster.close()
        await blocks.close()
        await asyncio.gather(*(origin.close() for origin in namespace.origins()))
        await disk.close()
        await store.close()
        journal.close()
        await metadata.aclose()
        await core.source.buckets.aclose()
        body.close()
        await leadership.close()

    app.on_startup.insert(0, start)
    app.on_cleanup.append(stop)
    return app


async def _every(interval: float, *steps: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(interval)
        for step in steps:
            try:
                step()
            except Exception:  # a failing round must not end the refreshes
                log.exception("periodic refresh failed")


def _warm(
    settings: Settings,
    reader: Reader,
    tiers: WarmTiers,
    metrics: Metrics,
    cluster: ClusterNode | None,
) -> WarmJobs:
    """Warm jobs of this node, sharing jobs with the other live nodes in a cluster."""
    peers = None
    if cluster is not None:
        peers = ShareClient(cluster.client, cluster.membership.self_url,
                            cluster.membership.live, settings.warm.poll_timeout)  # fmt: skip
    store = JobStore(settings.cache.dir / "warm")
    return WarmJobs(reader, tiers, store, metrics, settings.warm, settings.cache.pin_limit, peers)


def _cluster(
    settings: Settings, metrics: Metrics, body: BodySender, node_view: LeaderDocument | None
) -> ClusterNode | None:
    """This node's cluster part, or None for a single node (no peers, no DNS)."""
    if not settings.cluster.enabled:
        return None
    _, port = split_listen(settings.listen)
    node_dir = settings.cache.dir / "node"  # the nonces its workers accepted, shared
    return ClusterNode(settings.cluster, port, metrics, body, node=node_view, node_dir=node_dir)


@dataclasses.dataclass(frozen=True, slots=True)
class ReadWrite:
    """The read path and the write path, siblings over one metadata source and coherence."""

    source: MetadataSource
    invalidator: Invalidator
    reader: Reader
    writer: Writer


def read_and_write(
    namespace: Namespace,
    blocks: BlockSource,
    metadata: MetadataCache,
    metrics: Metrics,
    block_size: int,
    *,
    read_ahead: ReadAheadPolicy | None = None,
    store: MetadataStore | None = None,
    router: MetadataRouter | None = None,
    journal: Journal | None = None,
    pages: SharedAnswers | None = None,
    broadcast: Broadcast | None = None,
    hot: HotSets = DEFAULT,
) -> ReadWrite:
    """The metadata source, the watches and the invalidator, then the reader and the writer
    over them (a single worker and a single node where ``journal`` and ``router`` are None).

    ``router``: in a cluster, metadata misses go to their owner node; ``journal``: the
    node's invalidations, shared with sibling workers; ``pages``: origin answers shared
    with sibling workers asking at once; ``broadcast``: the cluster's other nodes;
    ``hot``: how many keys' hit state the reader keeps.
    """
    node_journal = journal if journal is not None else SoloJournal()
    owner = router if router is not None else NoOwner()
    source = MetadataSource(metadata, store, owner, node_journal, metrics.revalidated, pages)
    watches = Watches()
    invalidator = Invalidator(namespace, source, blocks, watches, node_journal, broadcast)
    through = WriteThrough(
        source, blocks, block_size, invalidator, watches, metrics.write_through_bytes.inc
    )
    throughs = WriteThroughs(namespace, through, namespace.write_through_buffer)
    reader = Reader(namespace, blocks, source, invalidator, metrics, block_size,
                    (hot.keys, hot.urls), read_ahead)  # fmt: skip
    writer = Writer(namespace, invalidator, throughs, broadcast)
    return ReadWrite(source, invalidator, reader, writer)


class PeerAnswers:
    """What this node answers other nodes with (``cluster.peer_server.NodeAnswers``)."""

    def __init__(
        self, namespace: Namespace, blocks: BlockSource, core: ReadWrite, prefetch: PrefetchApi
    ) -> None:
        self._namespace = namespace
        self._origins = {origin.name: origin for origin in namespace.origins()}
        self._blocks = blocks
        self._source = core.source
        self._invalidator = core.invalidator
        self._prefetch = prefetch

    async def read_block(self, request: BlockRequest) -> AsyncIterator[Piece]:
        """As the block's owner: its tiers, else (unless only what is cached is
        wanted) its origin fill."""
        origin = self._origins.get(request.origin)
        if origin is None:
            raise errors.OriginUnavailable(f"no origin named {request.origin!r} here")
        ref = BlockRef(request.block_id, origin, request.first, request.last)
        async for piece in self._blocks.pieces(
            ref, request.offset, request.length, local=True, cached_only=request.cached_only
        ):
            yield piece

    async def invalidate(self, items: list[Invalidation]) -> None:
        await self._invalidator.invalidate_origin(items)

    async def metadata(self, query: MetadataQuery) -> dict[str, object]:
        """Another node's metadata miss, answered as the owner (``MetadataSource``)."""
        self._invalidator.catch_up()
        origin = origin_named(self._namespace.origins(), query.origin)
        return await self._source.answer_peer(query, origin)

    async def drop_all(self) -> None:
        await self._invalidator.forget_metadata()

    async def on_message(self, name: str, body: bytes) -> None:
        await self._prefetch.on_peer(name, body)


def _reload(
    reload: Callable[[], Settings], auth: Authenticator, cluster: ClusterNode | None
) -> None:
    """SIGHUP: re-read the config and apply its credentials (keys added, removed, limited;
    ``allow_anonymous``) and ``cluster.peers`` (nodes joining or leaving a static cluster);
    the rest of the config needs a restart. A config that fails changes nothing."""
    try:
        settings = reload()
    except (ConfigError, OSError) as exc:
        log.error("config reload failed, nothing changed: %s", exc)
        return
    auth.reload(settings.credentials, settings.allow_anonymous)
    log.info("config reloaded: %d credential(s)", len(settings.credentials))
    if cluster is not None:
        cluster.membership.update_static(settings.cluster.peers)
        log.info("cluster peers are %s", ", ".join(settings.cluster.peers) or "none")


def _metadata_event(metrics: Metrics, kind: str, state: str, mount: str, times: int) -> None:
    metrics.metadata_lookup(kind, state, mount, times)
    if state == "stale_error":
        log.warning("origin failing: serving stale %s metadata (stale-if-error)", kind)
