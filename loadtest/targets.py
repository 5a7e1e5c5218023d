"""The systems under test, each started cold (empty cache) and stopped by the harness.

| target | what clients talk to |
|---|---|
| ``direct`` | the origin itself (through the counting proxy) |
| ``nginx`` | Debian nginx as an S3 caching reverse proxy (``nginx-cache.conf``) |
| ``nginx-3`` | three such nginx, readers spread over them: a cache per node |
| ``hoard`` | one Hoard node (``python -m gateway serve --config``), N workers |
| ``hoard-cluster`` | three Hoard nodes forming one cluster, readers spread over them |
| ``hoard-disk`` | one Hoard node with its memory tier off: every hit is a disk-tier hit |
| ``static`` | nginx serving the dataset's files from local disk (``nginx-static.conf``) |
| ``bare`` | aiohttp + uvloop answering the dataset's files from memory, no auth (``bare.py``) |

A target that cannot run here says why in ``unavailable()``; the run reports
that instead of numbers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loadtest.datasets import BUCKET, ORIGIN_KEY, ORIGIN_SECRET, UPLOADS, Dataset
from loadtest.procs import Pinning, children, free_port, stop_process, wait_http

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HOARD_KEY, HOARD_SECRET = "loadtest", "loadtest-secret-key"
ALL = ("direct", "nginx", "nginx-3", "hoard", "hoard-cluster", "hoard-disk", "static", "bare")


@dataclass
class Context:
    """What every target needs to know about the run."""

    origin_endpoint: str  # the counting proxy, http://127.0.0.1:P or in moto's namespace
    dataset: Dataset
    workdir: Path
    pinning: Pinning
    cache_bytes: int  # disk cache bound for nginx and Hoard


@dataclass
class Target:
    name: str
    ctx: Context
    endpoints: list[str] = field(default_factory=list)
    access_key: str = ORIGIN_KEY
    secret_key: str = ORIGIN_SECRET
    can_list: bool = True  # static files have no ListObjects
    takes_uploads: bool = False  # the rss workload's upload phase runs only on Hoard
    hoard_api: bool = False  # answers /_hoard/ endpoints (warm jobs, epoch-order prefetch)
    caches: bool = True  # keeps what it read: warm-up passes fill it (not the origin itself)
    notes: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def unavailable(self) -> str | None:
        return None

    def start(self) -> None:
        """Start cold: a fresh working directory, nothing cached."""

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc, 15)
        self.procs = []

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs if proc.poll() is None]

    def memory_tier(self) -> int | None:
        """Bytes of the in-memory cache tier a worker may hold, if the target has one."""
        return None

    def workdir(self, tag: str) -> Path:
        path = self.ctx.workdir / "targets" / f"{self.name}-{tag}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path


@dataclass
class Direct(Target):
    caches: bool = False  # every read goes to the origin

    def start(self) -> None:
        self.endpoints = [self.ctx.origin_endpoint]


class Nginx(Target):
    """One or more nginx, caching (``nginx-cache.conf``) or static (``nginx-static.conf``)."""

    def __init__(self, name: str, ctx: Context, nodes: int = 1, static: bool = False):
        super().__init__(name, ctx, can_list=not static)
        self.nodes = nodes
        self.static = static

    def unavailable(self) -> str | None:
        if shutil.which("nginx") is None:
            return "nginx not installed (apt-get install nginx, or use loadtest/run.sh)"
        return None

    def start(self) -> None:
        self.endpoints = []
        template = (HERE / ("nginx-static.conf" if self.static else "nginx-cache.conf")).read_text()
        for node in range(self.nodes):
            port = free_port()
            directory = self.workdir(str(node))
            values = {
                "@USER@": "user root;" if os.geteuid() == 0 else "",
                "@WORKERS@": str(self.ctx.pinning.server_cpus()),
                "@DIR@": str(directory),
                "@PORT@": str(port),
                "@UPSTREAM@": self.ctx.origin_endpoint.removeprefix("http://"),
                "@MAX_SIZE@": f"{self.ctx.cache_bytes // 1024**2}m",
                "@ROOT@": str(self.ctx.dataset.local_root),
            }
            conf = template
            for name, value in values.items():
                conf = conf.replace(name, value)
            (directory / "nginx.conf").write_text(conf)
            log = open(directory / "stderr.log", "ab")  # noqa: SIM115 - lives as long as nginx
            proc = subprocess.Popen(
                [*self.ctx.pinning.server_prefix(), "nginx", "-p", str(directory),
                 "-e", str(directory / "error.log"), "-c", str(directory / "nginx.conf")],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            log.close()
            self.procs.append(proc)
            endpoint = f"http://127.0.0.1:{port}"
            probe = f"/{BUCKET}/{self.ctx.dataset.images[0].key}" if self.static else "/"
            self._wait(endpoint + probe, proc, directory)
            self.endpoints.append(endpoint)
        kind = "static files, sendfile" if self.static else "proxy_cache + slice 8m + cache_lock"
        self.notes = [f"nginx {kind}, {self.ctx.pinning.server_cpus()} worker(s) per node"]

    def _wait(self, url: str, proc: subprocess.Popen[bytes], directory: Path) -> None:
        try:
            wait_http(url, 15, proc)  # caching: "/" is ListBuckets, answered by the origin
        except RuntimeError as exc:
            log = directory / "error.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"nginx did not start: {exc}\n{tail}") from exc


class Bare(Target):
    """The floor of a Python hit: one aiohttp + uvloop process answering the dataset's files
    from memory (``bare.py``), no signature checked; plain paths, like ``static``."""

    def __init__(self, name: str, ctx: Context) -> None:
        super().__init__(name, ctx, can_list=False)

    def start(self) -> None:
        port = free_port()
        directory = self.workdir("0")
        log = open(directory / "bare.log", "ab")  # noqa: SIM115 - lives as long as the server
        proc = subprocess.Popen(
            [*self.ctx.pinning.server_prefix(), sys.executable, "-m", "loadtest.bare",
             "--port", str(port), "--root", str(self.ctx.dataset.local_root)],
            stdout=log, stderr=subprocess.STDOUT, cwd=directory,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        log.close()
        self.procs.append(proc)
        endpoint = f"http://127.0.0.1:{port}"
        wait_http(f"{endpoint}/{BUCKET}/{self.ctx.dataset.images[0].key}", 30, proc)
        self.endpoints = [endpoint]
        self.notes = ["aiohttp + uvloop, bytes from memory, no auth: one process"]


def cluster_support() -> str | None:
    """None if the gateway at HEAD has a cluster (peers + membership); else why not."""
    missing = [
        m for m in ("peers", "membership") if not (REPO / "gateway/cluster" / f"{m}.py").exists()
    ]
    if missing:
        return "not available yet: gateway/cluster/ has no " + ", ".join(f"{m}.py" for m in missing)
    return None


class Hoard(Target):
    """``nodes`` Hoard processes (``python -m gateway serve``); a cluster when nodes > 1."""

    def __init__(self, name: str, ctx: Context, nodes: int = 1, memory_tier: bool = True):
        super().__init__(name, ctx, access_key=HOARD_KEY, secret_key=HOARD_SECRET,
                         takes_uploads=True, hoard_api=True)  # fmt: skip
        self.nodes = nodes
        self.memory_tier_on = memory_tier
        self.config_paths: list[Path] = []

    def memory_tier(self) -> int | None:
        """``cache.memory`` of the config written for the first node, as the gateway reads it."""
        if not self.config_paths:
            return None
        from gateway.config.load import (
            load_settings,  # the repository's own: loadtest lives beside it
        )

        return load_settings(self.config_paths[0]).cache.memory

    def unavailable(self) -> str | None:
        return cluster_support() if self.nodes > 1 else None

    def config(self, port: int, directory: Path, ports: list[int]) -> dict[str, object]:
        config: dict[str, object] = {
            "listen": f"127.0.0.1:{port}",
            "workers": self.ctx.pinning.server_cpus(),
            "shutdown_timeout": "5s",
            "log_level": "warning",
            "access_log": False,  # as nginx-cache.conf's "access_log off": same work per request
            "cache": {"dir": str(directory / "cache"), "size": self.ctx.cache_bytes,
                      **({} if self.memory_tier_on else {"memory": 0})},
            "credentials": [{"access_key": HOARD_KEY, "secret_key": HOARD_SECRET}],
            "origins": {
                "origin": {
                    "type": "s3", "endpoint": self.ctx.origin_endpoint, "region": "us-east-1",
                    "access_key": ORIGIN_KEY, "secret_key": ORIGIN_SECRET,
                    "addressing_style": "path", "max_connections": 128,
                },
            },
            "default_origin": "origin",
            "mounts": [{"bucket": BUCKET, "origin": "origin", "metadata_ttl": "forever",
                        "readonly": True},
                       # Writable, with the default write-through (PutObjects up to 64 MiB).
                       {"bucket": UPLOADS, "origin": "origin"}],
        }  # fmt: skip
        if self.nodes > 1:
            config["cluster"] = {
                "self": f"http://127.0.0.1:{port}",
                "peers": [f"http://127.0.0.1:{p}" for p in ports],
                "secret": "loadtest-cluster-secret",
            }
        return config

    def start(self) -> None:
        ports = [free_port() for _ in range(self.nodes)]
        self.endpoints = []
        self.config_paths = []
        for node, port in enumerate(ports):
            directory = self.workdir(str(node))
            config_path = directory / "hoard.yaml"
            config_path.write_text(yaml.safe_dump(self.config(port, directory, ports)))
            self.config_paths.append(config_path)
            log = open(directory / "hoard.log", "ab")  # noqa: SIM115 - lives as long as hoard
            proc = subprocess.Popen(
                [*self.ctx.pinning.server_prefix(), sys.executable, "-m", "gateway", "serve",
                 "--config", str(config_path)],
                stdout=log, stderr=subprocess.STDOUT, cwd=directory,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )  # fmt: skip
            log.close()
            self.procs.append(proc)
            endpoint = f"http://127.0.0.1:{port}"
            try:
                wait_http(endpoint + "/_hoard/ready", 60, proc)
            except RuntimeError as exc:
                tail = (directory / "hoard.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"hoard did not start: {exc}\n{tail}") from exc
            self.endpoints.append(endpoint)
        wanted = self.ctx.pinning.server_cpus()
        running = 1 + len(children(self.procs[0].pid))
        self.notes = [f"{self.nodes} node(s), workers: {wanted}, {running} process(es) per node"]
        if wanted > 1 and running == 1:
            self.notes.append("the gateway ignored workers")


def make(name: str, ctx: Context) -> Target:
    if name == "direct":
        return Direct(name, ctx)
    if name == "nginx":
        return Nginx(name, ctx)
    if name == "nginx-3":
        return Nginx(name, ctx, nodes=3)
    if name == "static":
        return Nginx(name, ctx, static=True)
    if name == "hoard":
        return Hoard(name, ctx)
    if name == "hoard-cluster":
        return Hoard(name, ctx, nodes=3)
    if name == "hoard-disk":
        return Hoard(name, ctx, memory_tier=False)
    if name == "bare":
        return Bare(name, ctx)
    raise ValueError(f"unknown target {name!r} (known: {', '.join(ALL)})")
