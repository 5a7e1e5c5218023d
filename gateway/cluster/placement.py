"""Where one node gets the blocks it does not own: from their owners, then the origin.

``Placement`` joins the three cluster mechanisms for ``blocks/source.py``: it ranks the
live members of ``Membership`` for a block digest (a new ``Ranking`` only when
the membership version moved), says whether this node is among the first
``replicas`` (an owner, which serves from its tiers and fills from the origin),
and otherwise fills a flight from the nodes ranked before this one, in order.

Failover resumes at the byte where the previous source stopped: a peer that
fails after ``n`` bytes leaves ``flight.received`` at ``n``, the next peer is
asked for the rest of the block, and so is the origin after the last peer. A
failed peer is reported to ``Membership`` (passive failure detection); an
answer such as "no such key" proves the peer alive and ends the fill.

An owner that lacks a block asks the ``handoff_peers`` nodes ranked right
after it whether they hold it (``handoff``, cached only: they never fill for
it). After a node joins, the previous owner of each block it took over is
among them (it ranks right after the newcomer), so growing the cluster moves
blocks between nodes instead of fetching them again from the origin.

Not guaranteed: that a block is fetched from the origin once when views of
the live set disagree (each node asks the owner it sees; see ``__init__``).
A handoff costs up to ``handoff_peers`` quick "not cached" answers before each
cold origin fill; a block that moved further down the ranking (several joins
at once) is not found and is fetched again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from gateway.cache.singleflight import Flight
from gateway.cluster.membership import Membership
from gateway.cluster.peer_client import PeerClient
from gateway.cluster.peers import (
    BlockRequest,
    PeerChanged,
    PeerError,
    PeerEvents,
    PeerNotFound,
    PeerUnavailable,
)
from gateway.cluster.rendezvous import Ranking
from gateway.core import errors
from gateway.pieces import BlockRef

log = logging.getLogger(__name__)


class Placement:
    """This node's view of block ownership, and peer fills along it."""

    def __init__(
        self,
        membership: Membership,
        client: PeerClient,
        events: PeerEvents,
        replicas: int = 1,
        handoff_peers: int = 3,
    ) -> None:
        self.membership = membership
        self.client = client
        self.events = events
        self.replicas = replicas
        self.handoff_peers = handoff_peers
        self._version = -1
        self._ranking = Ranking([membership.self_url])

    @property
    def self_url(self) -> str:
        return self.membership.self_url

    def _current(self) -> Ranking:
        if self._version != self.membership.version:
            self._ranking = Ranking(self.membership.live())
            self._version = self.membership.version
        return self._ranking

    @property
    def clustered(self) -> bool:
        """Whether another node is live: only then can a block be owned elsewhere."""
        return len(self._current()) > 1

    def ranked(self, digest: str) -> list[str]:
        """The live nodes for a block digest, best first."""
        return [node.name for node in self._current().rank(digest)]

    def owner(self, key: str) -> str:
        """The first live node for ``key`` (replicas aside)."""
        return self._current().owner(key).name

    def owns(self, digest: str) -> bool:
        ranking = self._current()
        if len(ranking) == 1:
            return True
        return any(n.name == self.self_url for n in ranking.owners(digest, self.replicas))

    async def fetch(self, ref: BlockRef, flight: Flight) -> None:
        """Append ``ref``'s block to ``flight`` from the nodes ranked before this one.

        Returns with ``flight.received`` short of the block when every one of
        them failed (the caller continues from the origin); raises ``NoSuchKey``
        or ``OriginChanged`` when an owner's origin said so.
        """
        for url in self.ranked(ref.block.digest):
            if url == self.self_url or flight.received >= ref.length:
                return
            try:
                await self._from_peer(url, ref, flight)
            except PeerUnavailable as exc:
                log.warning("peer fill of block %s from %s stopped at byte %d: %s",
                            ref.block.digest, url, flight.received, exc)  # fmt: skip
                self.events.failed("block", "unavailable")
                if not exc.answered:  # an error answer (its origin failing) proves it alive
                    self.membership.report_failure(url)
                continue
            except PeerNotFound:
                self.events.failed("block", "not_found")
                raise errors.NoSuchKey(ref.block.key) from None
            except PeerChanged:
                self.events.failed("block", "changed")
                raise errors.OriginChanged(f"{ref.block.key} changed at the origin") from None
            self.membership.report_success(url)
            return

    async def handoff(self, ref: BlockRef) -> AsyncIterator[bytes]:
        """The block's bytes from the first of the nodes ranked after this one that
        holds it cached, resuming at the byte with the next one if it fails; may
        end short (nobody had the rest) or empty."""
        ranked = self.ranked(ref.block.digest)
        after = ranked[ranked.index(self.self_url) + 1 :][: self.handoff_peers]
        received = 0
        for url in after:
            request = BlockRequest(
                *_identity(ref), offset=received, length=ref.length - received, cached_only=True
            )
            self.events.requested("handoff")
            try:
                async with aclosing(self.client.read_block(url, request)) as chunks:
                    async for chunk in chunks:
                        received += len(chunk)
                        self.events.received(len(chunk))
                        yield chunk
            except PeerUnavailable as exc:
                self.events.failed("handoff", "unavailable")
                if not exc.answered:
                    self.membership.report_failure(url)
                continue
            except PeerError:  # not cached there (or gone from its origin): ask the next
                self.membership.report_success(url)
                continue
            self.membership.report_success(url)
            return

    async def _from_peer(self, url: str, ref: BlockRef, flight: Flight) -> None:
        request = BlockRequest(
            *_identity(ref), offset=flight.received, length=ref.length - flight.received
        )
        self.events.requested("block")
        started = time.perf_counter()
        try:
            async with aclosing(self.client.read_block(url, request)) as chunks:
                async for chunk in chunks:
                    flight.append(chunk)
                    self.events.received(len(chunk))
        finally:
            self.events.took("block", time.perf_counter() - started)


def _identity(ref: BlockRef) -> tuple[str, str, str, str, int, int, int]:
    """The fields of a ``BlockRequest`` naming ``ref``'s block and its range."""
    block = ref.block
    return block.origin, block.bucket, block.key, block.etag, block.index, ref.first, ref.last
