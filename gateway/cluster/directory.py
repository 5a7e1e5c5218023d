"""Metadata ownership: a LIST or HEAD miss asks one node of the cluster, not the origin.

A storm of identical LISTs spread over every node would otherwise cost one origin
LIST per node (each node's metadata cache coalesces only its own callers). So a
miss is routed to the *metadata owner*, the first node of a rendezvous ranking:

- of (origin, bucket, prefix) for a LIST page: every page of one listing walk goes
  to the same node, which walks the origin once and answers the pages from its
  own cached whole listing;
- of (origin, bucket, key) for a HEAD. Not (bucket, prefix): data loaders HEAD the
  many files of one dataset, and ranking by key spreads those misses over every
  node instead of sending a whole dataset's HEADs to one; a single key's storm
  still lands on one owner, whose cache coalesces it into one origin HEAD.

The owner answers from its metadata cache or fills it through its own flight
(one origin call), never forwarding again: a node that disagrees about who owns
what costs one extra origin call, never a loop. The asking node stores the
answer in its own metadata cache under its own TTL and serves its own fresh
entries without asking anyone. A NoSuchKey travels as such and is cached as a
negative entry. When the owner cannot be reached or answers with an error, the
asking node asks the origin itself; only a failure to reach it (not an error
answer: that proves it alive) is reported to membership, as block fills do.

A write's broadcast reaches the nodes in no particular order, so for a moment
the owner may still hold the old answer when an asking node has already
dropped it; stored there, it would outlive the write by a TTL. So for
``settle`` seconds after an invalidation in a scope (origin, bucket) reaches
this node, its misses in that scope go to the origin, not to the owner.

Not guaranteed: one origin call per cluster while views of the live set differ,
the owner fails, or a scope was just written to; freshness beyond the TTL (the owner may answer with an
entry it learned up to a TTL ago, so an entry can be up to two TTLs old when the
asker's copy expires; writes through Hoard invalidate both copies).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.cluster.peer_client import PeerClient
from gateway.cluster.peers import PeerEvents, PeerNotFound, PeerUnavailable
from gateway.cluster.placement import Placement
from gateway.core import errors
from gateway.metadata import codec
from gateway.metadata.query import MetadataQuery
from gateway.origins.base import ListPage, ObjectInfo

log = logging.getLogger(__name__)

T = TypeVar("T")


class MetadataRouter:
    """The asking side: send a metadata miss to its owner, else to the origin."""

    def __init__(
        self,
        placement: Placement,
        client: PeerClient,
        events: PeerEvents,
        timeout: float,
        settle: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.placement = placement
        self.client = client
        self.events = events
        self.timeout = timeout  # an owner may walk a long listing before answering
        self.settle = settle  # how long a broadcast may take to reach every owner
        self._clock = clock
        self._invalidated: dict[tuple[str, str], float] = {}  # scope -> when, within settle

    def invalidated(self, scope: tuple[str, str]) -> None:
        """An invalidation in ``scope`` reached this node: let the owners catch up."""
        now = self._clock()
        for old in [s for s, at in self._invalidated.items() if at + self.settle <= now]:
            del self._invalidated[old]  # bounded by the scopes written to within settle
        self._invalidated[scope] = now

    async def head(
        self, query: MetadataQuery, origin: Callable[[], Awaitable[ObjectInfo]]
    ) -> ObjectInfo:
        """``query``'s object info from the owner of its key, else ``origin()``."""
        return await self._ask(query, codec.info_from, origin)

    async def page(
        self, query: MetadataQuery, origin: Callable[[], Awaitable[ListPage]]
    ) -> ListPage:
        """``query``'s listing page from the owner of its prefix, else ``origin()``."""
        return await self._ask(query, codec.page_from, origin)

    def owner(self, query: MetadataQuery) -> str:
        # "\0" cannot occur in a URL-safe origin name, so the fields cannot run together.
        return self.placement.owner(f"{query.kind}\0{query.origin}\0{query.bucket}\0{query.key}")

    async def _ask(
        self,
        query: MetadataQuery,
        decode: Callable[[dict[str, Any]], T],
        origin: Callable[[], Awaitable[T]],
    ) -> T:
        owner = self.owner(query)
        written = self._invalidated.get((query.origin, query.bucket))
        if owner == self.placement.self_url or (
            written is not None and self._clock() < written + self.settle
        ):
            return await origin()
        operation = query.kind  # "head" or "list": bounded labels
        self.events.requested(operation)
        started = time.perf_counter()
        try:
            answer = decode(await self.client.metadata(owner, query, self.timeout))
        except PeerNotFound as exc:
            self.placement.membership.report_success(owner)
            raise errors.NoSuchKey(query.key, exc.headers) from None
        except (PeerUnavailable, TypeError, KeyError, ValueError) as exc:
            log.warning("metadata owner %s did not answer %s %r: %s; asking the origin",
                        owner, query.kind, query.key, exc)  # fmt: skip
            self.events.failed(operation, "unavailable")
            if isinstance(exc, PeerUnavailable) and not exc.answered:
                self.placement.membership.report_failure(owner)
            return await origin()
        finally:
            self.events.took(operation, time.perf_counter() - started)
        self.placement.membership.report_success(owner)
        return answer
