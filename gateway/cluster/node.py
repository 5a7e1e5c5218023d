"""This node's part in a cluster: membership, peer client and server, placement.

``cli.py`` builds one ``ClusterNode`` per process when ``cluster.self`` is set
with ``peers`` or ``dns``; the server routes ``/_hoard/peer/`` to ``server``,
``BlockSource`` ranks blocks through ``placement`` and the writer calls
``broadcast`` after each write's local invalidation.

Not guaranteed: that every node dropped a key before a write's answer. A node
that does not answer within ``invalidation_timeout`` is skipped, and nothing
makes it drop its metadata cache when it comes back (its entries expire by
TTL); a node cut off from the others cannot tell that it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

from gateway.cluster.membership import Membership
from gateway.cluster.peers import Invalidation, PeerClient, PeerServer, PieceSender
from gateway.cluster.placement import Placement
from gateway.config import ClusterConfig
from gateway.metrics import Metrics

log = logging.getLogger(__name__)


class ClusterNode:
    def __init__(
        self,
        config: ClusterConfig,
        port: int,
        metrics: Metrics,
        read_block: Callable[..., AsyncIterator[Any]],
        invalidate: Callable[[list[Invalidation]], Awaitable[None]],
        body_sender: PieceSender | None = None,
        on_message: Callable[[str, bytes], Awaitable[None]] | None = None,
    ) -> None:
        """``on_message(name, body)`` takes other nodes' ``announce`` calls."""
        assert config.secret is not None
        secret = config.secret.get_secret_value()
        self.config = config
        self.metrics = metrics
        self._probe_session: aiohttp.ClientSession | None = None
        self.membership = Membership(
            config.self, config.peers, config.dns, port, probe=self._probe,
            probe_interval=config.probe_interval, probe_timeout=config.probe_timeout,
            fail_after=config.fail_after, rejoin_after=config.rejoin_after,
        )  # fmt: skip
        self.client = PeerClient(secret, read_timeout=config.peer_read_timeout)
        self.server = PeerServer(secret, read_block, invalidate, body_sender, on_message=on_message)
        self.placement = Placement(self.membership, self.client, metrics, config.replicas)
        self.membership.on_change(self._changed)

    def _changed(self, live: list[str]) -> None:
        self.metrics.membership_changes.inc()
        self.metrics.live_members.set(len(live))

    async def _probe(self, url: str) -> bool:
        if self._probe_session is None:
            self._probe_session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.probe_timeout)
            )
        async with self._probe_session.get(f"{url}/_hoard/health") as answer:
            return answer.status == 200

    async def start(self) -> None:
        """A first view of the peers (one probe round), then probing in the background."""
        self.metrics.live_members.set(1)
        await self.membership.refresh()
        self.membership.start()

    async def close(self) -> None:
        await self.membership.close()
        await self.client.close()
        if self._probe_session is not None:
            await self._probe_session.close()

    async def broadcast(self, items: list[Invalidation]) -> None:
        """Tell every other live node to drop ``items``; wait at most the configured time."""
        peers = [url for url in self.membership.live() if url != self.membership.self_url]
        if not peers or not items:
            return
        timeout = self.config.invalidation_timeout
        started = time.perf_counter()

        async def one(url: str) -> None:
            self.metrics.peer_requests.labels("invalidate").inc()
            if not await self.client.invalidate(url, items, timeout):
                self.metrics.peer_errors.labels("invalidate", "unavailable").inc()

        try:
            await asyncio.wait_for(asyncio.gather(*(one(url) for url in peers)), timeout + 0.5)
        except TimeoutError:
            log.warning("cluster invalidation not confirmed by every peer in %.1fs", timeout)
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
