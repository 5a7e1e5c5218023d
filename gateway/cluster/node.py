"""This node's part in a cluster: membership, peer client and server, placement.

``app/wiring.py`` builds one ``ClusterNode`` per process when ``cluster.self`` is set
with ``peers`` or ``dns``; the server routes ``/_hoard/peer/`` to ``server``,
``BlockSource`` ranks blocks through ``placement``, the reader routes metadata
misses through ``directory`` and the writer calls ``broadcast`` after each
write's local invalidation.

``broadcast`` waits at most ``invalidation_timeout`` for the live peers. What a
member did not confirm (it timed out, failed, or was not live) goes to the
``backlog`` and is delivered when that peer next answers a probe; a peer that
missed more than ``replay_limit`` items is told to drop its whole metadata
cache instead.

Not guaranteed: that every node dropped a key before a write's answer. A node
that missed it serves its old metadata until the replay reaches it: while it
is cut off (it cannot tell), and, once back, until the first probe from the
writing node (``probe_interval``). The backlog lives in the writing node's
memory: if that node restarts too, or the missed peer comes back under another
URL (a new pod IP), nothing is replayed and its entries expire by TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.cluster.backlog import Backlog
from gateway.cluster.directory import MetadataRouter
from gateway.cluster.membership import Membership, NodeShare
from gateway.cluster.peer_client import PeerClient
from gateway.cluster.peer_server import PeerServer, PieceSender
from gateway.cluster.peers import MAX_SKEW
from gateway.cluster.placement import Placement
from gateway.cluster.replays import SeenCounters
from gateway.config.settings import ClusterConfig
from gateway.core import tls
from gateway.core.invalidation import Invalidation
from gateway.core.tasks import TaskSet
from gateway.obs.events import PeerMetrics
from gateway.obs.metrics import Metrics

log = logging.getLogger(__name__)


class ClusterNode:
    def __init__(
        self,
        config: ClusterConfig,
        port: int,
        metrics: Metrics,
        body_sender: PieceSender | None = None,
        *,
        node: NodeShare | None = None,
        node_dir: Path | None = None,
    ) -> None:
        """``node`` shares one membership among the workers of this node; ``node_dir``
        holds what they share of the peer server (the nonces accepted: replays are
        refused whichever worker they reach). What the server answers with is handed
        to ``server.serve`` once the reader exists."""
        assert config.secret is not None
        secret = config.secret.get_secret_value()
        self.config = config
        self.metrics = metrics
        self._probe_session: aiohttp.ClientSession | None = None
        self.membership = Membership(
            config.self, config.peers, config.dns, port, probe=self._probe,
            probe_interval=config.probe_interval, probe_timeout=config.probe_timeout,
            fail_after=config.fail_after, rejoin_after=config.rejoin_after, node=node,
        )  # fmt: skip
        self._ssl = tls.client_context(config.ca_bundle)  # for https:// peers
        self.client = PeerClient(secret, read_timeout=config.peer_read_timeout, ssl=self._ssl)
        seen = SeenCounters(node_dir / "peer-nonces" if node_dir else None, 2 * MAX_SKEW + 1)
        # The audience: this node's URL spelled as its peers' membership spells it.
        audience = self.membership.self_url
        self.server = PeerServer(secret, body_sender, audience=audience, seen=seen)
        self.placement = Placement(
            self.membership,
            self.client,
            PeerMetrics(metrics),
            config.replicas,
            config.handoff_peers,
        )
        settle = config.invalidation_timeout + 1.0  # a broadcast's longest wait, and some
        self.directory = MetadataRouter(
            self.placement, self.client, PeerMetrics(metrics), config.metadata_timeout, settle
        )
        self.backlog = Backlog(config.replay_limit)
        self._replays = TaskSet()  # running deliveries, one per peer (named by its URL)
        self.membership.on_change(self._changed)
        self.membership.on_seen(self._seen)

    def _changed(self, live: list[str]) -> None:
        self.metrics.membership_changes.inc()
        self.metrics.live_members.set(len(live))
        self.backlog.keep_only(self.membership.members())

    async def _probe(self, url: str) -> bool:
        if self._probe_session is None:
            self._probe_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=self.config.probe_timeout),
            )
        async with self._probe_session.get(f"{url}/_hoard/health") as answer:
            return answer.status == 200

    def _seen(self, url: str) -> None:
        """``url`` answered (this worker's probe, or the node leader's round)."""
        if url in self.backlog and url not in self._replays:
            # At the first sign of life, before it rejoins the live set: the sooner
            # a restarted peer drops what it missed, the shorter it serves it.
            self._replays.spawn(self._replay(url), name=url)

    async def _replay(self, url: str) -> None:
        """Deliver what ``url`` missed; on failure keep it for the next probe."""
        items, drop_all = self.backlog.take(url)
        self.metrics.peer_requests.labels("replay").inc()
        timeout = self.config.invalidation_timeout
        if await self.client.invalidate(url, items, timeout, drop_all=drop_all):
            log.info("replayed %d missed invalidations to %s%s", len(items), url,
                     " (drop all)" if drop_all else "")  # fmt: skip
        else:
            self.metrics.peer_errors.labels("replay", "unavailable").inc()
            self.backlog.add(url, items, drop_all)

    async def start(self) -> None:
        """A first view of the peers (one probe round), then probing in the background."""
        self.metrics.live_members.set(1)
        await self.membership.refresh()
        self.membership.start()

    async def close(self) -> None:
        await self._replays.cancel()
        await self.membership.close()
        await self.client.close()
        self.server.close()
        if self._probe_session is not None:
            await self._probe_session.close()

    async def broadcast(self, items: list[Invalidation]) -> None:
        """Tell every other live node to drop ``items``; wait at most the configured time.

        Members that are not live, and live ones that do not confirm in time, get
        ``items`` later from the backlog.
        """
        if not items:
            return
        me, live = self.membership.self_url, set(self.membership.live())
        others = [url for url in self.membership.members() if url != me]
        for url in others:
            if url not in live:
                self.backlog.add(url, items)
        peers = [url for url in others if url in live]
        if not peers:
            return
        timeout = self.config.invalidation_timeout
        started = time.perf_counter()
        confirmed: set[str] = set()

        async def one(url: str) -> None:
            self.metrics.peer_requests.labels("invalidate").inc()
            if await self.client.invalidate(url, items, timeout):
                confirmed.add(url)
            else:
                self.metrics.peer_errors.labels("invalidate", "unavailable").inc()

        try:
            await asyncio.wait_for(asyncio.gather(*(one(url) for url in peers)), timeout + 0.5)
        except TimeoutError:
            log.warning("cluster invalidation not confirmed by every peer in %.1fs", timeout)
        for url in peers:
            if url not in confirmed:
                self.backlog.add(url, items)
        self.metrics.peer_duration.labels("invalidate").observe(time.perf_counter() - started)

    async def announce(self, name: str, body: bytes) -> None:
        """Hand a message to every other live node (best effort, within invalidation_timeout)."""
        peers = [url for url in self.membership.live() if url != self.membership.self_url]
        timeout = self.config.invalidation_timeout

        async def one(url: str) -> None:
            self.metrics.peer_requests.labels("message").inc()
            if not await self.client.message(url, name, body, timeout):
                self.metrics.peer_errors.labels("message", "unavailable").inc()

        await asyncio.gather(*(one(url) for url in peers))

    def snapshot(self) -> dict[str, Any]:
        return {**self.membership.snapshot(), "replicas": self.config.replicas}
