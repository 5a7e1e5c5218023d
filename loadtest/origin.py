"""The origin: moto's S3 server made to behave like a remote object store.

Where it can (root, ``ip`` and ``tc`` present, namespaces permitted), the
origin runs in a network namespace created for this run, joined to the host by
a veth pair with a private /30 that exists only between the two ends of that
pair. ``tc`` shapes both directions: ``netem delay`` + ``rate`` when the kernel
has netem, otherwise ``tbf`` for the rate cap and the counting proxy for the
delay (see ``proxy.py``). Without namespaces, moto runs on loopback and the
proxy emulates both delay and rate; a warning says so.

Every origin request of every target passes the counting proxy (on
127.0.0.1, or beside moto in the namespace, where the shaped link is the
targets' hop to it), so ``counts()`` is the origin's view of a run. Seeding
goes to moto directly and is not counted.

Cleanup is unconditional: ``close()`` (also from ``with``, Ctrl-C and SIGTERM,
which ``__main__`` turns into SystemExit) stops moto and the proxy and deletes
the namespace; a namespace left by a killed run (its pid gone) is deleted by
the next run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from loadtest.procs import free_port, stop_process, wait_http

NS_PREFIX = "hoardlt-"
MOTO_PORT = 5000


@dataclass(frozen=True)
class Network:
    """How the origin is reached, for the report."""

    mode: str  # "netns" or "loopback"
    delay: str  # how the round trip is emulated
    rate: str  # how bandwidth is capped
    stream: str = ""  # how one response's bandwidth is capped
    warning: str = ""


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}: {done.stderr.strip() or done.returncode}")


def _try(*cmd: str) -> bool:
    try:
        _run(*cmd)
        return True
    except (RuntimeError, subprocess.TimeoutExpired, OSError):
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> None:
    """Delete namespaces of earlier runs whose process is gone (bounded: one pass)."""
    if shutil.which("ip") is None:
        return
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.fullmatch(NS_PREFIX + r"(\d+)", name)
        if match and not _pid_alive(int(match.group(1))):
            _delete_namespace(name)


def _delete_namespace(name: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=10)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    # Deleting the namespace destroys its veth end, and with it the host end.
    _try("ip", "netns", "del", name)


def _free_subnet() -> int:
    """An X such that 10.254.X.0/30 is used by no address or route on this host."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10)
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, timeout=10)
    text = used.stdout + routes.stdout
    for x in range(0, 250):
        if f"10.254.{x}." not in text:
            return x
    raise RuntimeError("no free 10.254.X.0/30 subnet")


class Origin:
    """moto + counting proxy, in a namespace when possible. Use as a context manager."""

    def __init__(
        self, workdir: Path, mode: str = "auto", rtt_ms: float = 20.0,
        rate_mbit: float = 1000.0, stream_mbit: float = 400.0,
    ):  # fmt: skip
        self.workdir = workdir
        self.want = mode
        self.rtt_ms = rtt_ms
        self.rate_mbit = rate_mbit
        self.stream_mbit = stream_mbit
        self.namespace: str | None = None
        self.moto: subprocess.Popen[bytes] | None = None
        self.proxy: subprocess.Popen[bytes] | None = None
        self.moto_url = ""
        self.endpoint = ""  # the counting proxy: what targets use as the origin
        self.network = Network("loopback", "", "")
        self._subnet = 0
        self._host_if = ""

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Origin:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        warning = ""
        proxy_rtt, proxy_rate = self.rtt_ms, self.rate_mbit
        if self.want in ("auto", "netns"):
            try:
                kernel_delay, kernel_rate = self._start_in_namespace()
                proxy_rtt = 0.0 if kernel_delay else self.rtt_ms
                proxy_rate = 0.0 if kernel_rate else self.rate_mbit
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                if self.want == "netns":
                    raise
                stop_process(self.moto, 5)
                self.moto = None
                self._drop_namespace()
                warning = f"network namespace unavailable ({exc}); origin on loopback"
        if self.moto is None:
            self.network = Network(
                "loopback",
                f"counting proxy holds each request {self.rtt_ms:g} ms",
                f"counting proxy paces {self.rate_mbit:g} Mbit/s",
                warning=warning or "origin on loopback by request (--origin loopback)",
            )
            print(f"WARNING: {self.network.warning}; delay and rate emulated in userspace",
                  file=sys.stderr, flush=True)  # fmt: skip
            self.moto_url = f"http://127.0.0.1:{free_port()}"
            self.moto = self._spawn([], self.moto_url)
            wait_http(self.moto_url + "/moto-api/", 60, self.moto)
        proxy_port = free_port()
        # In a namespace the proxy runs beside moto, so the shaped link is the targets'
        # hop (a WAN between a cache and its origin), and the proxy's own connections to
        # moto stay inside: werkzeug closes every connection, so the proxy opens one per
        # request, and across the veth their TIME_WAIT ports are never reused (the
        # kernel's default reuses them on loopback only). Tens of thousands of them made
        # each connect() scan for a free port: the proxy's system time tripled in the
        # later epochs of a run, and whichever target ran then looked slow.
        prefix, host = [], "127.0.0.1"
        if self.namespace is not None:
            prefix, host = ["ip", "netns", "exec", self.namespace], f"10.254.{self._subnet}.2"
        with open(self.workdir / "proxy.log", "ab") as log:
            self.proxy = subprocess.Popen(
                [*prefix, sys.executable, "-m", "loadtest.proxy", "--host", host,
                 "--port", str(proxy_port), "--upstream", self.moto_url,
                 "--rtt-ms", str(proxy_rtt), "--rate-mbit", str(proxy_rate),
                 "--stream-mbit", str(self.stream_mbit)],
                stdout=log, stderr=subprocess.STDOUT, env=_env(),
            )  # fmt: skip
        self.endpoint = f"http://{host}:{proxy_port}"
        if self.stream_mbit > 0:
            self.network = dataclasses.replace(
                self.network,
                stream=f"counting proxy paces each response {self.stream_mbit:g} Mbit/s",
            )
        wait_http(self.endpoint + "/_counts", 30, self.proxy)

    def _spawn(self, prefix: list[str], url: str) -> subprocess.Popen[bytes]:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with open(self.workdir / "moto.log", "ab") as log:
            return subprocess.Popen(
                [*prefix, sys.executable, "-m", "loadtest.motoserver", "-H", host, "-p", port],
                stdout=log, stderr=subprocess.STDOUT,
                # Path-style only: without this moto reads "10" of 10.254.x.2 as a bucket.
                env={**_env(), "S3_IGNORE_SUBDOMAIN_BUCKETNAME": "true"},
            )  # fmt: skip

    def _start_in_namespace(self) -> tuple[bool, bool]:
        """moto in a new namespace. Returns (the kernel delays, the kernel caps the rate)."""
        kernel_delay, kernel_rate = self._make_namespace()
        assert self.namespace is not None
        self.moto_url = f"http://10.254.{self._subnet}.2:{MOTO_PORT}"
        self.moto = self._spawn(["ip", "netns", "exec", self.namespace], self.moto_url)
        wait_http(self.moto_url + "/moto-api/", 60, self.moto)
        self.network = Network(
            "netns",
            f"netem {self.rtt_ms / 2:g} ms each way" if kernel_delay
            else f"counting proxy holds each request {self.rtt_ms:g} ms (kernel has no netem)",
            f"tc {'netem' if kernel_delay else 'tbf'} {self.rate_mbit:g} Mbit/s each way"
            if kernel_rate else f"counting proxy paces {self.rate_mbit:g} Mbit/s",
        )  # fmt: skip
        return kernel_delay, kernel_rate

    def _make_namespace(self) -> tuple[bool, bool]:
        """Create namespace + veth + shaping. Returns (kernel delays, kernel caps rate)."""
        if os.geteuid() != 0:
            raise RuntimeError("not root")
        if shutil.which("ip") is None:
            raise RuntimeError("no ip command")
        remove_stale_namespaces()
        self._subnet = _free_subnet()
        name = f"{NS_PREFIX}{os.getpid()}"
        host_if, ns_if = f"hlt{os.getpid()}h"[:15], f"hlt{os.getpid()}n"[:15]
        _run("ip", "netns", "add", name)
        self.namespace = name
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        self._host_if = host_if
        _run("ip", "link", "set", ns_if, "netns", name)
        net = f"10.254.{self._subnet}"
        _run("ip", "addr", "add", f"{net}.1/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        inside = ("ip", "netns", "exec", name)
        _run(*inside, "ip", "addr", "add", f"{net}.2/30", "dev", ns_if)
        _run(*inside, "ip", "link", "set", ns_if, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        # The proxy's connections to moto (one per request: werkzeug closes each) reuse
        # TIME_WAIT ports in this namespace, as they do on loopback.
        _try(*inside, "sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1")
        if shutil.which("tc") is None:
            return False, False
        rate = f"{self.rate_mbit:g}mbit"
        netem = (
            "root",
            "netem",
            "delay",
            f"{self.rtt_ms / 2:g}ms",
            "rate",
            rate,
            "limit",
            "100000",
        )
        if _try("tc", "qdisc", "add", "dev", host_if, *netem) and _try(
            *inside, "tc", "qdisc", "add", "dev", ns_if, *netem
        ):
            return True, True
        _try("tc", "qdisc", "del", "dev", host_if, "root")
        tbf = ("root", "tbf", "rate", rate, "burst", "1mb", "latency", "100ms")
        shaped = _try("tc", "qdisc", "add", "dev", host_if, *tbf) and _try(
            *inside, "tc", "qdisc", "add", "dev", ns_if, *tbf
        )
        return False, shaped

    def _drop_namespace(self) -> None:
        if self.namespace is not None:
            _delete_namespace(self.namespace)
            self.namespace = None
        if self._host_if:
            # Gone with the namespace once its peer moved there; deleted here otherwise.
            _try("ip", "link", "del", self._host_if)
            self._host_if = ""

    def close(self) -> None:
        stop_process(self.proxy, 5)
        stop_process(self.moto, 5)
        self.proxy = self.moto = None
        self._drop_namespace()

    def alive(self) -> bool:
        return all(p is not None and p.poll() is None for p in (self.moto, self.proxy))

    # -- counting ----------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """The proxy's counters since it started (diff two snapshots for one phase)."""
        with urllib.request.urlopen(self.endpoint + "/_counts", timeout=10) as response:
            return json.loads(response.read())


def diff_counts(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    keys = ("GET", "HEAD", "LIST", "OTHER", "bytes", "connections")
    return {key: after.get(key, 0) - before.get(key, 0) for key in keys}


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
