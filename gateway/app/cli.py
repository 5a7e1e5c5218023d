"""The command line and the process: ``hoard serve`` and its workers, and the clients.

``hoard serve`` runs the gateway (its objects are built by ``wiring.py``);
``hoard warm`` and ``hoard cache`` are
clients of a running one (``gateway/client/commands.py``).

``hoard serve`` with no config serves ``--data-dir`` (default ``./data``) as a
posix origin on 127.0.0.1:9000 and generates a credential pair on first start,
kept in the cache directory so it survives restarts. A bad config prints one
line per problem and exits 2, with no traceback; so do a weak secret on a
port other hosts can reach (``safety.py``) and a posix origin's missing folder
(``posix_roots.py``, which also names the folders served that are no bucket).
The port is bound before anything is printed: a busy port is one line and exit
status 1, and no secret is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
from aiohttp import web

from gateway.app import listener
from gateway.app.cores import available_cores
from gateway.app.listener import bind
from gateway.app.posix_roots import root_problems, skipped_folders
from gateway.app.safety import ambient_origins, private_cache, refusals
from gateway.app.server import HIT_PATH, HIT_WIRE, rejected
from gateway.app.supervisor import supervise
from gateway.app.wiring import TLS_CONTEXT, build
from gateway.cache.disk_open import raise_fd_limit
from gateway.client import commands as commands_
from gateway.client.admin import AdminClient, AdminError
from gateway.config.load import load_settings
from gateway.config.settings import (
    ConfigError,
    Credential,
    PosixOriginConfig,
    Settings,
    split_listen,
)
from gateway.core import logtext, tls
from gateway.obs.process import enable_multiprocess

EXIT_CONFIG = 2
_YOUNG_COLLECTION = 10_000  # allocations between the collector's youngest passes (Python: 700)
log = logging.getLogger("hoard")


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
    command = commands_.warm if args.command == "warm" else commands_.cache
    try:
        client = AdminClient(args.endpoint, args.access_key, args.secret_key,
                             ca_bundle=args.ca_bundle)  # fmt: skip
        return command(args, client)
    except AdminError as exc:
        print(f"hoard: {exc}", file=sys.stderr)
        if exc.status in (401, 403):
            print(f"hoard: {commands_.CREDENTIALS_HELP}", file=sys.stderr)
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
        try:
            args.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file of that name, or no permission: say so, no traceback
            raise ConfigError(f"--data-dir: {str(args.data_dir)!r}: {err.strerror}") from None
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


def with_credential(settings: Settings) -> tuple[Settings, Credential | None]:
    """``settings`` with the generated credential when none is configured (and anonymous
    access is off), and that credential (None: the configured ones are used)."""
    if settings.credentials or settings.allow_anonymous:
        return settings, None
    credential = generated_credential(settings.cache.dir)
    return settings.model_copy(update={"credentials": [credential]}), credential


def reloaded(args: argparse.Namespace) -> Settings:
    """The config as a SIGHUP re-reads it: checked as at start (a weak secret off loopback
    is refused: ``ConfigError``), with the generated credential if none is configured."""
    settings = load(args)
    refused, warned = refusals(settings)
    if refused:
        raise ConfigError("; ".join(refused))
    for line in warned:  # as loud as at start: a key added by SIGHUP is no exception
        log.warning("INSECURE, allowed only because Hoard listens on loopback: %s", line)
    return with_credential(settings)[0]


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
    lines.append(f"  export AWS_DEFAULT_REGION={settings.region}")
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
    settings, credential = with_credential(settings)
    if settings.workers > 1:
        supervise(settings, _banner(settings, credential),
                  lambda metrics_dir, hupped: _worker(settings, metrics_dir, reload, hupped))  # fmt: skip
        return
    sock = bind(settings.listen, reuse_port=False)
    app = build(settings, reload=reload)

    async def announce(app: web.Application) -> None:
        print(_banner(settings, credential), flush=True)

    app.on_startup.append(announce)
    _run(app, settings, sock)


def settle_collector() -> None:
    """The garbage collector as a serving process runs it (``loadtest hitprofile`` too)."""
    # What exists now (modules, the app, its tables) lives as long as the process: kept out
    # of the collector's full passes, which walked it all and paused serving ~50 ms each.
    gc.freeze()
    # Every request makes hundreds of short-lived containers (tasks, futures, dicts) that
    # reference counting frees; the collector's youngest pass, every 700 of them by
    # default, walked the requests in flight each time (~3% of a cold small object's CPU).
    gc.set_threshold(_YOUNG_COLLECTION, 10, 10)


def _run(app: web.Application, settings: Settings, sock: socket.socket) -> None:
    settle_collector()
    listener.run(
        app, sock, functools.partial(rejected, app), _event_loop(settings.event_loop),
        ssl_context=app.get(TLS_CONTEXT), first=app[HIT_PATH].answer, wire=app[HIT_WIRE],  # type: ignore[arg-type]
        shutdown_timeout=settings.shutdown_timeout, keepalive_timeout=settings.keepalive_timeout,
        send_timeout=settings.send_timeout,
        access_log=None,
        # Bodies are stored as sent: a gzip-encoded upload must reach the origin still gzipped.
        auto_decompress=False,
    )  # fmt: skip


def _worker(
    settings: Settings, metrics_dir: Path, reload: Callable[[], Settings] | None, hupped: bool
) -> None:
    """One of ``workers`` processes: its own event loop on the shared port (SO_REUSEPORT).
    ``hupped``: started after a SIGHUP (a restarted worker), so it applies what its
    siblings applied then, not the config the node started with."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)  # aiohttp and build() install their own handlers
    enable_multiprocess(metrics_dir)
    app = build(settings, metrics_dir, reload, reloaded=hupped)
    _run(app, settings, bind(settings.listen, reuse_port=True))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "serve":
        return run_client(args)
    try:
        settings = load(args)
        problems = root_problems(settings)  # a posix origin's folder missing: refused here
        if problems:
            raise ConfigError("\n".join(problems))
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
    logtext.install(logging.getLogger())  # keys and prefixes in messages cannot forge lines
    for line in warned:
        log.warning("INSECURE, allowed only because Hoard listens on loopback: %s", line)
    for line in ambient_origins(settings):
        log.warning("%s", line)
    for line in skipped_folders(settings):
        log.warning("%s", line)
    serve(settings, reload=functools.partial(reloaded, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
