"""Every place a change reaches on this node, before the write is acknowledged.

S3's consistency is the rule: a write acknowledged by any worker of any node is
seen by every request that starts after it. On this node a change of a key (or
of everything under a prefix) must reach, before the writer answers:

  * this worker's memory of the key's metadata and listings, and the
    write-throughs under way for it (their watches, ``watch.py``: they must
    not store what the change made stale);
  * the sibling workers, through the node's journal (``metadata/journal.py``):
    each applies what it missed as its next request starts (``catch_up``);
  * the node's metadata store (``metadata/store.py``);
  * the key's blocks, in memory and on disk (new metadata would name new
    blocks anyway, since blocks are named by ETag; dropping them frees room).

``apply`` is the one method that names them all. The other nodes of a cluster
are told by the writer's broadcast (``cluster/node.py``), which arrives here as
``invalidate_origin``.

A change made at the origin behind Hoard's back shows when a fill's
``If-Match`` fails (a 412): ``heal`` forgets the key here as ``apply`` does, and
tells the other nodes too, in the background (the read that met the 412 retries
at once and does not wait for them): otherwise each node would go on serving
its cached version until its metadata TTL, or its own 412.
"""

from __future__ import annotations

import logging

from gateway.blocks.source import BlockSource
from gateway.coherence.watch import Watches
from gateway.core.invalidation import Broadcast, Invalidation
from gateway.core.tasks import TaskSet
from gateway.metadata.journal import Journal, SoloJournal
from gateway.metadata.source import MetadataSource, scope_of
from gateway.origins.namespace import Mount, Namespace

log = logging.getLogger(__name__)


class Invalidator:
    """Forgets what a change made stale, in every tier of this node."""

    def __init__(self, namespace: Namespace, source: MetadataSource, blocks: BlockSource,
                 watches: Watches, journal: Journal | SoloJournal,
                 broadcast: Broadcast | None = None) -> None:  # fmt: skip
        self._namespace = namespace
        self._source = source
        self._blocks = blocks
        self._watches = watches
        self._journal = journal
        self._broadcast = broadcast  # a cluster's other nodes, told of what ``heal`` forgets
        self._telling = TaskSet()

    async def invalidate(self, bucket: str, key: str) -> None:
        """A write changed ``key``: forget its metadata, its listings and its blocks."""
        await self.apply(self._namespace.resolve(bucket).invalidation(key))

    async def invalidate_prefix(self, bucket: str, prefix: str) -> None:
        """A bucket-level change: forget metadata under ``prefix`` (blocks stay valid by ETag)."""
        await self.apply(self._namespace.resolve(bucket).invalidation(None, prefix=prefix))

    async def invalidate_origin(self, items: list[Invalidation]) -> None:
        """Another node's write: the same drops, named by origin, origin bucket and key."""
        for item in items:
            await self.apply(item)

    async def drop(self, bucket: str, prefix: str) -> dict[str, int]:
        """Forget cached blocks and metadata of ``bucket`` under ``prefix`` (an operator's
        drop); the blocks dropped, by tier."""
        item = self._namespace.resolve(bucket).invalidation(None, prefix=prefix)
        await self.apply(item)
        return await self._blocks.drop_prefix(*item.scope, item.prefix or "")

    async def forget_metadata(self) -> None:
        """Drop every metadata entry, in memory and on disk, in every worker (this node
        missed more invalidations than another node could remember for it). Blocks
        stay: they are named by ETag, and fresh metadata names the right ones."""
        self._watches.all_changed()
        await self._source.forget_all()

    def catch_up(self) -> None:
        """Apply what sibling workers invalidated since this worker last looked.

        Called as every read starts: a write any worker acknowledged before is
        then forgotten here too.
        """
        news = self._journal.news()
        if news is None:  # more than the journal remembers: forget everything
            self._watches.all_changed()
            self._source.forget_memory()
            return
        for item in news:
            self._forget_locally(item)

    async def apply(self, item: Invalidation) -> None:
        """Every place a change of ``item`` reaches on this node (the module docstring)."""
        self._forget_locally(item)  # first: a write-through under way must not land after this
        self._journal.publish([item])
        await self._source.drop_stored(item)
        if item.key is None:
            return  # blocks are named by ETag: new metadata names new blocks
        await self._blocks.drop_object(*item.scope, item.key)

    async def heal(self, mount: Mount, okey: str) -> None:
        """The origin refused a fill of ``okey``'s version (a 412: it changed there): forget
        it on this node, and have the other nodes of a cluster forget it (background)."""
        item = Invalidation(*scope_of(mount), key=okey)
        await self.apply(item)
        if self._broadcast is not None:
            self._telling.spawn(self._tell_others([item]))

    async def close(self) -> None:
        """Stop telling other nodes (shutdown)."""
        await self._telling.cancel()

    async def _tell_others(self, items: list[Invalidation]) -> None:
        assert self._broadcast is not None
        try:
            await self._broadcast(items)  # a node it misses gets it later, from the backlog
        except Exception:  # the read was answered; the nodes' TTLs still bound what they serve
            log.exception("could not tell the cluster of an origin change")

    def _forget_locally(self, item: Invalidation) -> None:
        self._watches.changed(item.scope, item.key or item.prefix or "", prefix=item.key is None)
        self._source.forget_locally(item)
