"""Command line and wiring: the only place that builds Hoard's objects.

``hoard serve`` runs the gateway; ``hoard warm`` and ``hoard cache`` are
clients of a running one (``gateway/client/commands.py``).

``hoard serve`` with no config serves ``--data-dir`` (default ``./data``) as a
posix origin on 127.0.0.1:9000 and generates a credential pair on first start,
kept in the cache directory so it survives restarts. A bad config prints one
line per problem and exits 2, with no traceback; so does a weak secret on a
port other hosts can reach (``safety.py``). The port is bound before anything
is printed: a busy port is one line and exit status 1, and no secret is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import urllib3
from aiohttp import web

from gateway import errors, listener, tls
from gateway.accesslog import AccessLog
from gateway.admin import Admin
from gateway.blocks import BlockSource
from gateway.cache.admission import Doorkeeper
from gateway.cache.disk import DiskTier
from gateway.cache.disk_open import raise_fd_limit
from gateway.cache.memory import MemoryTier
from gateway.client import commands as commands_
from gateway.client.admin import AdminClient, AdminError
from gateway.cluster.node import ClusterNode
from gateway.cluster.peers import BlockRequest, MetadataQuery
from gateway.config import (
    ConfigError,
    Credential,
    PosixOriginConfig,
    S3OriginConfig,
    Settings,
    load_settings,
    split_listen,
)
from gateway.invalidation import Invalidation
from gateway.listener import bind
from gateway.metadata.journal import Journal
from gateway.metadata.memory import MetadataCache
from gateway.metadata.store import MetadataStore
from gateway.metrics import Metrics, enable_multiprocess
from gateway.namespace import Namespace
from gateway.node.cores import available_cores
from gateway.node.leader import Leadership
from gateway.node.pages import SharedPages
from gateway.node.shared import LeaderDocument
from gateway.node.stats import WorkerStats
from gateway.node.supervisor import supervise
from gateway.origins.base import Origin
from gateway.origins.guard import OriginGuard
from gateway.origins.posix import PosixOrigin
from gateway.origins.s3 import S3Origin
from gateway.pieces import BlockRef, Piece
from gateway.prefetch.api import PrefetchApi
from gateway.prefetch.node import NodePrefetch
from gateway.prefetch.prefetcher import Prefetcher
from gateway.prefetch.registry import Registry
from gateway.readahead import ReadAheadPolicy
from gateway.reader import Reader
from gateway.s3.auth import Authenticator
from gateway.s3.body import BodySender
from gateway.s3.front import S3Front
from gateway.safety import ambient_origins, private_cache, refusals
from gateway.server import HIT_PATH, build_app, rejected
from gateway.warm.fanout import ShareClient
from gateway.warm.http import WarmHttp
from gateway.warm.jobs import WarmJobs
from gateway.warm.store import JobStore
from gateway.writer import Writer

EXIT_CONFIG = 2
log = logging.getLogger("hoard")
TLS_CONTEXT = web.AppKey("tls_context", ssl.SSLContext)  # HTTPS on the listen address
GAUGES = web.AppKey("gauges", asyncio.Task)  # a worker's periodic gauge refresh
GAUGE_REFRESH = 1.0  # seconds between a worker's refreshes of its gauges


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hoard", description="S3 caching gateway for ML training")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, help="YAML config file (default: embedded)")
    serve.add_argument("--host", help="address to listen on (overrides listen)")
    serve.add_argument("--port", type=int, help="port to listen on (overrides listen)")
    serve.add_argument(
        "--data-dir", type=Path, default=Path("data"),
        help="with no --config: the directory served as buckets (default ./data)",
    )  # fmt: skip
    serve.add_argument("--workers", type=_workers_arg,
                       help="worker processes, or 'auto': one per core (overrides workers)")  # fmt: skip
    commands_.add_arguments(commands)
    return parser


def _workers_arg(text: str) -> int | str:
    if text == "auto":
        return text
    count = int(text)
    if not 1 <= count <= 256:
        raise argparse.ArgumentTypeError("between 1 and 256, or auto")
    return count


def run_client(args: argparse.Namespace) -> int:
    """``hoard warm`` / ``hoard cache``: signed calls to a running gateway."""
    client = AdminClient(args.endpoint, args.access_key, args.secret_key)
    command = commands_.warm if args.command == "warm" else commands_.cache
    try:
        return command(args, client)
    except AdminError as exc:
        print(f"hoard: {exc}", file=sys.stderr)
    except (ValueError, OSError, urllib3.exceptions.HTTPError) as exc:
        print(f"hoard: {exc}", file=sys.stderr)
    return commands_.EXIT_FAILED


def embedded_defaults(data_dir: Path) -> dict[str, Any]:
    """The zero-config gateway: one local directory as the origin, loopback only.

    Its metadata is asked of the directory on every request (a stat or a
    directory walk, cheap on a local disk), so a file dropped in is seen at once.
    """
    return {
        "listen": "127.0.0.1:9000",
        "origins": {"local": {"type": "posix", "path": str(data_dir)}},
        "default_origin": "local",
        "default_metadata_ttl": 0,
        "default_negative_ttl": 0,
    }


def _overrides(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    updates: dict[str, Any] = {}
    if args.host or args.port:
        host, port = split_listen(settings.listen)
        host = args.host or host
        updates["listen"] = (
            f"[{host}]:{args.port or port}" if ":" in host else f"{host}:{args.port or port}"
        )
    if args.workers:
        updates["workers"] = args.workers
    return updates


def load(args: argparse.Namespace) -> Settings:
    if args.config is None:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        settings = load_settings(None, embedded_defaults(args.data_dir.resolve()))
    else:
        settings = load_settings(args.config)
    settings = settings.model_copy(update=_overrides(args, settings))
    if settings.workers == "auto":  # resolved once, here: everything after sees a number
        settings = settings.model_copy(update={"workers": available_cores()})
    return settings


def generated_credential(cache_dir: Path) -> Credential:
    """The credential pair kept in the cache dir, created on first start."""
    path = cache_dir / "credentials.json"
    if path.exists():
        return Credential(**json.loads(path.read_text()))
    cache_dir.mkdir(parents=True, exist_ok=True)
    pair = {"access_key": "hoard-" + secrets.token_hex(6), "secret_key": secrets.token_urlsafe(30)}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(pair, handle)
    return Credential(**pair)


def build_origins(settings: Settings, metrics: Metrics) -> dict[str, Origin]:
    """Every configured origin, each behind its guard (limits, retries, circuit breaker)."""
    origins: dict[str, Origin] = {}
    for name, cfg in settings.origins.items():
        origin: Origin
        if isinstance(cfg, S3OriginConfig):
            origin = S3Origin(name, cfg)
        else:
            origin = PosixOrigin(name, cfg.path)
        origins[name] = OriginGuard(origin, cfg, metrics.origin_guard(name))
    return origins


def build(
    settings: Settings,
    metrics_dir: Path | None = None,
    reload: Callable[[], Settings] | None = None,
) -> web.Application:
    """Wire every object of one gateway process from its settings.

    ``metrics_dir`` is set when this process is one of several workers;
    ``reload`` re-reads the config on SIGHUP (only ``cluster.peers`` is applied).
    """
    metrics = Metrics(multiprocess_dir=metrics_dir)
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
    )  # fmt: skip
    disk = DiskTier(
        cache.dir, cache.size, fsync=cache.fsync, open_files=cache.open_files,
        on_evict=lambda n: metrics.cache_evictions.labels("disk").inc(n),
        on_corrupt=metrics.corrupt_blocks.inc, on_full=metrics.disk_full.inc,
        packed_max=cache.packed_block_max, segment_size=cache.segment_size,
    )  # fmt: skip
    body = BodySender()
    node_view = (  # one membership for the node's workers, probed by the leader
        LeaderDocument(cache.dir / "node" / "membership.json", leadership)
        if settings.workers > 1
        else None
    )
    cluster = _cluster(settings, metrics, namespace, lambda: blocks, lambda: reader, body,
                       lambda: prefetch_api, node_view)  # fmt: skip
    placement = cluster.placement if cluster is not None else None
    admission = (
        Doorkeeper(cache.admission, cache.admission_window) if cache.admission != "always" else None
    )
    blocks = BlockSource(
        memory, disk, metrics.block_events(), cache.fill_concurrency, placement, admission
    )
    metadata = MetadataCache(
        head_bytes=cache.metadata_head_bytes, listing_bytes=cache.metadata_listing_bytes,
        whole_listing_bytes=cache.whole_listing_bytes,
        on_event=lambda kind, state, mount: _metadata_event(metrics, kind, state, mount),
    )  # fmt: skip
    store = MetadataStore(
        cache.dir / "metadata.sqlite3", max_rows=cache.metadata_store_rows, shared=shared
    )
    journal = Journal(cache.dir / "journal")  # what sibling workers invalidated
    router = cluster.directory if cluster is not None else None
    prefetcher = Prefetcher(settings.prefetch, lambda: reader, metrics, cache.block_size)
    registry = Registry(cache.dir / "prefetch", settings.prefetch.max_streams)
    node_prefetch = NodePrefetch(registry, prefetcher, leadership)  # the node's streams
    read_ahead = ReadAheadPolicy(cache.read_ahead, cache.read_ahead_max, cache.read_ahead_idle)
    reader = Reader(namespace, blocks, metadata, metrics, cache.block_size, read_ahead, store,
                    router, observe=node_prefetch.observe, journal=journal,
                    pages=SharedPages(cache.dir / "node" / "pages", store) if shared else None)  # fmt: skip
    prefetch_api = PrefetchApi(
        node_prefetch, reader, settings.prefetch, cluster.announce if cluster is not None else None
    )
    auth = Authenticator(
        settings.credentials, settings.allow_anonymous, domains=settings.virtual_host_domains
    )
    writer = Writer(namespace, reader, cluster.broadcast if cluster is not None else None)
    front = S3Front(reader, writer, auth, settings.virtual_host_domains, body)
    access = AccessLog(as_json=settings.log_format == "json", enabled=settings.access_log)
    warm = _warm(settings, reader, metrics, cluster)
    warm_http = WarmHttp(warm)
    stats = WorkerStats(cache.dir / "node" / "stats" if shared else None, reader.stats)
    admin = Admin(
        reader, auth, metrics, cluster.snapshot if cluster is not None else None,
        prefetch_api, warm_http, stats.node,
    )  # fmt: skip
    if cluster is not None:
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

    on_sighup = []  # what a SIGHUP reloads: the certificate, the cluster's peers
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
                on_sighup.append(functools.partial(_reload_peers, cluster, reload))
        if on_sighup:
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: [each() for each in on_sighup]
            )
        await warm.start()  # after the cluster: a resumed share needs to know who owns what

    async def stop(app: web.Application) -> None:
        if GAUGES in app:
            app[GAUGES].cancel()
            stats.forget()
        await warm.close()
        await writer.close()  # pending write-throughs, before the tiers they write to
        await node_prefetch.close()
        if cluster is not None:
            await cluster.close()
        await blocks.close()
        await asyncio.gather(*(origin.close() for origin in namespace.origins()))
        await disk.close()
        await store.close()
        journal.close()
        await metadata.aclose()
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
    settings: Settings, reader: Reader, metrics: Metrics, cluster: ClusterNode | None
) -> WarmJobs:
    """Warm jobs of this node, sharing jobs with the other live nodes in a cluster."""
    peers = None
    if cluster is not None:
        peers = ShareClient(cluster.client, cluster.membership.self_url,
                            cluster.membership.live, settings.warm.poll_timeout)  # fmt: skip
    store = JobStore(settings.cache.dir / "warm")
    return WarmJobs(reader, store, metrics, settings.warm, settings.cache.pin_limit, peers)


def _cluster(
    settings: Settings,
    metrics: Metrics,
    namespace: Namespace,
    blocks: Callable[[], BlockSource],
    reader: Callable[[], Reader],
    body: BodySender,
    prefetch: Callable[[], PrefetchApi],
    node_view: LeaderDocument | None,
) -> ClusterNode | None:
    """This node's cluster part, or None for a single node (no peers, no DNS)."""
    if not settings.cluster.enabled:
        return None
    origins = {origin.name: origin for origin in namespace.origins()}

    async def read_block(request: BlockRequest) -> AsyncIterator[Piece]:
        """A peer asks this node, as the block's owner: its tiers, else (unless only
        what is cached is wanted) its origin fill."""
        origin = origins.get(request.origin)
        if origin is None:
            raise errors.OriginUnavailable(f"no origin named {request.origin!r} here")
        ref = BlockRef(request.block_id, origin, request.first, request.last)
        async for piece in blocks().pieces(
            ref, request.offset, request.length, local=True, cached_only=request.cached_only
        ):
            yield piece

    async def invalidate(items: list[Invalidation]) -> None:
        await reader().changes.invalidate_origin(items)

    async def metadata(query: MetadataQuery) -> dict[str, object]:
        return await reader().answer_peer(query)

    async def drop_all() -> None:
        await reader().changes.forget_metadata()

    _, port = split_listen(settings.listen)

    async def on_message(name: str, message: bytes) -> None:
        await prefetch().on_peer(name, message)

    return ClusterNode(settings.cluster, port, metrics, read_block, invalidate, body,
                       metadata=metadata, drop_all=drop_all, on_message=on_message,
                       node=node_view)  # fmt: skip


def _reload_peers(cluster: ClusterNode, reload: Callable[[], Settings]) -> None:
    """SIGHUP: re-read the config and apply its ``cluster.peers`` (nodes joining or
    leaving a static cluster); the rest of the config needs a restart."""
    try:
        peers = reload().cluster.peers
    except (ConfigError, OSError) as exc:
        log.error("config reload failed, cluster peers unchanged: %s", exc)
        return
    cluster.membership.update_static(peers)
    log.info("config reloaded: cluster peers are %s", ", ".join(peers) or "none")


def _metadata_event(metrics: Metrics, kind: str, state: str, mount: str) -> None:
    metrics.metadata_lookup(kind, state, mount)
    if state == "stale_error":
        log.warning("origin failing: serving stale %s metadata (stale-if-error)", kind)


def _banner(settings: Settings, credential: Credential | None) -> str:
    host, port = split_listen(settings.listen)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    scheme = "https" if settings.tls.enabled else "http"
    endpoint = f"{scheme}://{'[' + shown + ']' if ':' in shown else shown}:{port}"
    lines = [f"Hoard is serving S3 on {endpoint}"]
    default = settings.origins.get(settings.default_origin or "")
    if isinstance(default, PosixOriginConfig):
        lines.append(f"  serving the directory {default.path} (each directory in it is a bucket)")
    elif settings.default_origin:
        lines.append(f"  buckets pass through to origin '{settings.default_origin}'")
    lines.append("Use it with:")
    lines.append(f"  export AWS_ENDPOINT_URL={endpoint}")
    if credential is not None:
        lines.append(f"  export AWS_ACCESS_KEY_ID={credential.access_key}")
        lines.append(f"  export AWS_SECRET_ACCESS_KEY={credential.secret_key.get_secret_value()}")
    lines.append("  export AWS_DEFAULT_REGION=us-east-1")
    return "\n".join(lines)


def _event_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:  # uvloop is optional on platforms without it
            return asyncio.new_event_loop()
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def serve(settings: Settings, reload: Callable[[], Settings] | None = None) -> None:
    """Run the gateway; ``reload`` re-reads the config on SIGHUP."""
    raise_fd_limit()
    private_cache(settings.cache.dir, settings.cache.umask)
    credential = None
    if not settings.credentials and not settings.allow_anonymous:
        credential = generated_credential(settings.cache.dir)
        settings = settings.model_copy(update={"credentials": [credential]})
    if settings.workers > 1:
        supervise(settings, _banner(settings, credential),
                  lambda metrics_dir: _worker(settings, metrics_dir, reload))  # fmt: skip
        return
    sock = bind(settings.listen, reuse_port=False)
    app = build(settings, reload=reload)

    async def announce(app: web.Application) -> None:
        print(_banner(settings, credential), flush=True)

    app.on_startup.append(announce)
    _run(app, settings, sock)


def _run(app: web.Application, settings: Settings, sock: socket.socket) -> None:
    listener.run(
        app, sock, functools.partial(rejected, app), _event_loop(settings.event_loop),
        ssl_context=app.get(TLS_CONTEXT), first=app[HIT_PATH].answer,
        shutdown_timeout=settings.shutdown_timeout, access_log=None,
        # Bodies are stored as sent: a gzip-encoded upload must reach the origin still gzipped.
        auto_decompress=False,
    )  # fmt: skip


def _worker(settings: Settings, metrics_dir: Path, reload: Callable[[], Settings] | None) -> None:
    """One of ``workers`` processes: its own event loop on the shared port (SO_REUSEPORT)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)  # aiohttp and build() install their own handlers
    enable_multiprocess(metrics_dir)
    _run(build(settings, metrics_dir, reload), settings, bind(settings.listen, reuse_port=True))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "serve":
        return run_client(args)
    try:
        settings = load(args)
        if settings.tls.cert is not None and settings.tls.key is not None:
            tls.server_context(settings.tls.cert, settings.tls.key)  # unusable files: exit 2
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"hoard: config error: {line}", file=sys.stderr)
        return EXIT_CONFIG
    refused, warned = refusals(settings)
    for line in refused:
        print(f"hoard: config error: {line} (or listen on loopback only)", file=sys.stderr)
    if refused:
        return EXIT_CONFIG
    # One access-log line per request: skip the caller lookup (a stack walk per
    # record) and the thread names the format does not print.
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s",
    )
    for line in warned:
        log.warning("INSECURE, allowed only because Hoard listens on loopback: %s", line)
    for line in ambient_origins(settings):
        log.warning("%s", line)
    serve(settings, reload=lambda: load(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
