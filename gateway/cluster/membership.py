"""Who is in the cluster, and which of them are healthy enough to own blocks.

Members come from the static ``cluster.peers`` list, from ``cluster.dns`` (a
headless-service name re-resolved every ``dns_interval``, each address becoming
``http://<ip>:<port>``), or both; ``update_static`` replaces the static list at
run time (SIGHUP). This node is always a member and always live.

Health is counted, not timed: an active probe of every peer each
``probe_interval`` plus passive reports from peer requests. A live peer leaves
after ``fail_after`` consecutive failures; a peer that left comes back only after
``rejoin_after`` consecutive successes. The asymmetry is the hysteresis that
keeps a flapping peer from moving ownership back and forth. A peer never seen
healthy joins on its first success: admitting it moves nothing back.

``live()`` is the sorted list of live URLs and ``version`` counts its changes, so
a caller rebuilds its ``Ranking`` only when the version moved.

One prober per node. With ``workers: N``, every worker needs the view (it
places blocks by it) but only the node's leader (``gateway/node/leader.py``)
probes and resolves DNS: after each round it writes its whole view, health
counters included, to a shared document (``node``); the other workers adopt
that document each round instead of probing. A new leader starts from the
last document, so the hysteresis carries over a change of leader. A worker's
passive reports count in its own view until the leader's next round. With no
``node`` (one process), the membership probes by itself.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from gateway.core.tasks import TaskSet

log = logging.getLogger(__name__)

Probe = Callable[[str], Awaitable[bool]]  # True if the peer at this URL answers healthy
Resolver = Callable[[str], Awaitable[Iterable[str]]]  # a DNS name → its IP addresses
Listener = Callable[[list[str]], None]  # called with the new live list


class NodeShare(Protocol):
    """How the workers of a node share one membership (``gateway/node/``)."""

    @property
    def leads(self) -> bool: ...

    def write(self, body: dict[str, Any]) -> None: ...

    def read(self, max_age: float | None = None) -> dict[str, Any] | None: ...


def normalize_url(url: str) -> str:
    """``HTTP://10.0.0.1:9000/`` → ``http://10.0.0.1:9000``: one spelling per node."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"cluster peer {url!r}: expected a URL such as http://10.0.0.1:9000")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


async def resolve_addresses(name: str) -> list[str]:
    """The IP addresses ``name`` resolves to, without blocking the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


@dataclass(slots=True)
class _Member:
    url: str
    sources: set[str] = field(default_factory=set)  # "self", "static", "dns"
    healthy: bool = False
    ever_healthy: bool = False  # hysteresis applies only to a peer that has left
    failures: int = 0  # consecutive
    successes: int = 0  # consecutive
    last_seen: float | None = None  # clock() at the last success


class Membership:
    """The member set and its live subset, kept current by background tasks."""

    def __init__(
        self,
        self_url: str,
        static_peers: Iterable[str] = (),
        dns_name: str = "",
        port: int | None = None,
        *,
        probe: Probe,
        clock: Callable[[], float] = time.time,
        resolver: Resolver = resolve_addresses,
        probe_interval: float = 1.0,
        probe_timeout: float = 1.0,
        dns_interval: float = 5.0,
        fail_after: int = 2,
        rejoin_after: int = 3,
        node: NodeShare | None = None,
    ) -> None:
        if fail_after < 1 or rejoin_after < 1:
            raise ValueError("fail_after and rejoin_after must be at least 1")
        self.self_url = normalize_url(self_url)
        parts = urlsplit(self.self_url)
        self._scheme = parts.scheme
        self._port = port or parts.port or (443 if parts.scheme == "https" else 80)
        self._dns_name = dns_name
        self._probe = probe
        self._clock = clock
        self._resolver = resolver
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.dns_interval = dns_interval
        self.fail_after = fail_after
        self.rejoin_after = rejoin_after
        me = _Member(self.self_url, {"self"}, healthy=True, ever_healthy=True)
        self._members: dict[str, _Member] = {self.self_url: me}
        self._live: list[str] = [self.self_url]
        self.version = 0  # bumped each time live() changes
        self._listeners: list[Listener] = []
        self._tasks = TaskSet()  # the probe (and DNS) loops
        self._node = node
        self._leading = False  # whether the last round was this worker's as the node's leader
        self._seen: list[Callable[[str], None]] = []
        self.update_static(static_peers)

    # -- the view -------------------------------------------------------------

    def live(self) -> list[str]:
        """URLs of the live members (this node included), sorted."""
        return list(self._live)

    def members(self) -> list[str]:
        return sorted(self._members)

    def on_change(self, listener: Listener) -> None:
        """Call ``listener(live)`` after every change of the live set."""
        self._listeners.append(listener)

    def on_seen(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(url)`` whenever a peer answered (here, or in the leader's round)."""
        self._seen.append(listener)

    def snapshot(self) -> dict[str, Any]:
        """Everything ``GET /_hoard/cluster`` shows about membership, JSON-ready."""
        now = self._clock()
        self._members[self.self_url].last_seen = now
        members = [
            {
                "url": m.url,
                "self": m.url == self.self_url,
                "sources": sorted(m.sources),
                "healthy": m.healthy,
                "last_seen": m.last_seen,
                "seen_ago": None if m.last_seen is None else max(0.0, now - m.last_seen),
                "consecutive_failures": m.failures,
                "consecutive_successes": m.successes,
            }
            for m in sorted(self._members.values(), key=lambda m: m.url)
        ]
        return {"self": self.self_url, "version": self.version, "live": self.live(),
                "members": members}  # fmt: skip

    # -- where members come from ---------------------------------------------

    def update_static(self, peers: Iterable[str]) -> None:
        """Replace the static peer list (config reload); health of kept peers is kept."""
        self._set_source("static", {normalize_url(peer) for peer in peers})

    def update_dns(self, addresses: Iterable[str]) -> None:
        """Replace the DNS-discovered peers with these IP addresses."""
        self._set_source("dns", {self._address_url(a) for a in addresses})

    async def refresh_dns(self) -> None:
        """Re-resolve ``dns_name``; on failure keep the last answer (a DNS hiccup is
        not the whole cluster dying)."""
        if not self._dns_name:
            return
        try:
            addresses = list(await self._resolver(self._dns_name))
        except Exception as exc:  # gaierror, timeouts: all mean "no new answer"
            log.warning("cluster dns %s did not resolve: %s", self._dns_name, exc)
            return
        self.update_dns(addresses)

    def _address_url(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address  # IPv6 literal
        return normalize_url(f"{self._scheme}://{host}:{self._port}")

    def _set_source(self, source: str, urls: set[str]) -> None:
        urls.discard(self.self_url)  # the peer list usually names this node too
        for url in urls:
            self._members.setdefault(url, _Member(url)).sources.add(source)
        for member in list(self._members.values()):
            if source in member.sources and member.url not in urls:
                member.sources.discard(source)
                if not member.sources:
                    del self._members[member.url]
        self._publish()

    # -- health ---------------------------------------------------------------

    def report_success(self, url: str) -> None:
        """A request to ``url`` worked (active probe or a peer fill)."""
        self._record(url, ok=True)
        self._publish()

    def report_failure(self, url: str) -> None:
        """A request to ``url`` failed to reach a working node: connection refused or
        reset, timeout, 5xx. Not an answer such as 404 or 403: those prove it alive."""
        self._record(url, ok=False)
        self._publish()

    async def probe_all(self) -> None:
        """Probe every peer once, concurrently, and apply the results together."""
        urls = [url for url in self._members if url != self.self_url]
        results = await asyncio.gather(*(self._probe_one(url) for url in urls))
        for url, ok in zip(urls, results, strict=True):
            self._record(url, ok)
        self._publish()

    async def refresh(self) -> None:
        """One DNS resolution and one probe round: await it for a first view at start-up
        (a worker that finds the leader's view takes it instead)."""
        if self._node is not None and self._adopt(self._node.read(self._max_age())):
            return
        await self.refresh_dns()
        await self.probe_all()

    async def _round(self) -> None:
        """A probe round by the node's leader (sharing its view), else the leader's view."""
        node = self._node
        if node is None:
            await self.probe_all()
            return
        if not node.leads:
            self._leading = False
            self._adopt(node.read(self._max_age()))
            return
        if not self._leading:  # just became the leader: carry on from the last view
            self._leading = True
            self._adopt(node.read())
            await self.refresh_dns()
        await self.probe_all()
        ever = [m.url for m in self._members.values() if m.ever_healthy]
        node.write({**self.snapshot(), "ever_healthy": ever})

    async def _dns_round(self) -> None:
        if self._node is None or self._node.leads:
            await self.refresh_dns()

    def _max_age(self) -> float:
        """How old the leader's view may be before it is not believed (the leader is gone)."""
        return 3 * self.probe_interval + self.probe_timeout

    def _adopt(self, view: dict[str, Any] | None) -> bool:
        """Take the leader's view (members, sources, health) as this worker's."""
        if view is None or view.get("self") != self.self_url:
            return False
        members, ever = {}, set(view.get("ever_healthy", []))
        for shown in view.get("members", []):
            member = _Member(shown["url"], set(shown["sources"]), shown["healthy"],
                             shown["url"] in ever, shown["consecutive_failures"],
                             shown["consecutive_successes"], shown["last_seen"])  # fmt: skip
            members[member.url] = member
            if member.successes and member.url != self.self_url:
                for listener in self._seen:
                    listener(member.url)
        members[self.self_url] = self._members[self.self_url]
        self._members = members
        self._publish()
        return True

    async def _probe_one(self, url: str) -> bool:
        try:
            return bool(await asyncio.wait_for(self._probe(url), self.probe_timeout))
        except Exception as exc:  # refused, reset, timed out: all mean "not healthy now"
            log.debug("cluster probe of %s failed: %r", url, exc)
            return False

    def _record(self, url: str, ok: bool) -> None:
        member = self._members.get(normalize_url(url))
        if member is None or member.url == self.self_url:
            return  # a report about a peer removed meanwhile, or about ourselves
        if ok:
            for listener in self._seen:
                listener(member.url)
            member.failures, member.successes = 0, member.successes + 1
            member.last_seen = self._clock()
            needed = self.rejoin_after if member.ever_healthy else 1
            if not member.healthy and member.successes >= needed:
                member.healthy = member.ever_healthy = True
                log.info("cluster peer %s joined the live set", url)
        else:
            member.failures, member.successes = member.failures + 1, 0
            if member.healthy and member.failures >= self.fail_after:
                member.healthy = False
                log.warning("cluster peer %s left the live set after %d failures", url,
                            member.failures)  # fmt: skip

    def _publish(self) -> None:
        live = sorted(url for url, member in self._members.items() if member.healthy)
        if live == self._live:
            return
        self._live = live
        self.version += 1
        for listener in list(self._listeners):
            try:
                listener(self.live())
            except Exception:  # one broken listener must not stop the others
                log.exception("cluster membership listener failed")

    # -- background tasks -----------------------------------------------------

    def start(self) -> None:
        """Start probing (and re-resolving DNS) in the background of the running loop."""
        if self._tasks:
            return
        self._tasks.spawn(self._every(self.probe_interval, self._round))
        if self._dns_name:
            self._tasks.spawn(self._every(self.dns_interval, self._dns_round))

    async def close(self) -> None:
        """Stop the background tasks and wait until they are gone."""
        await self._tasks.cancel()

    async def _every(self, interval: float, step: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await step()
            except Exception:  # a bug in one round must not end membership for good
                log.exception("cluster membership round failed")
            # Rounds start every interval: a hung peer's probe timeout does not slow detection.
            await asyncio.sleep(max(0.0, started + interval - loop.time()))
