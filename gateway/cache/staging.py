"""Blocks the admission policy keeps off the disk: staged in memory, promoted when read again.

With an admission policy (``admission.py``) a demand fill writes its block to
disk only if the policy admits it. Otherwise the block is served from the
origin and *staged* in the memory tier, even above the tier's item limit and
LRU within its bound, so a reader joining just after the fill still finds it.

Repeated memory hits on a staged block write it to disk (*promotion*), as a
second miss would have. It is the second memory hit, not the first: the
request whose miss staged the block may itself find it in memory (the
first-block fill of a metadata miss can finish before the reader asks), so the
first memory hit may be no second access at all. A block read once is never
promoted; one read again is, by its third access. Once on disk, memory keeps a
promoted block only as it keeps any block on disk (``memory_item_max_on_disk``):
bigger ones are then hit with sendfile from the disk copy.

Not thread-safe: one event loop owns it, as it owns the tiers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from gateway.cache.admission import Doorkeeper
from gateway.cache.block import BlockId
from gateway.cache.disk import DiskTier
from gateway.cache.memory import MemoryTier

_REMEMBERED = 65536  # staged block digests remembered (more than the memory tier holds)


class Refusals(Protocol):
    def admission_rejected(self) -> None: ...


class Staging:
    """The admission policy's word on each missed block, and the blocks it kept off the disk.

    ``digests``: digest -> memory hits so far, of the blocks staged now (a hit path
    checks it before calling ``hit``: empty, it costs one truth test).
    """

    def __init__(
        self, memory: MemoryTier, disk: DiskTier | None, admission: Doorkeeper | None,
        refusals: Refusals, spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:  # fmt: skip
        self.digests: OrderedDict[str, int] = OrderedDict()
        self._memory = memory
        self._disk = disk
        self._admission = admission  # None: every filled block goes to disk
        self._refusals = refusals
        self._spawn = spawn

    def admits(self, block: BlockId) -> bool:
        """Whether this missed block goes to disk (the policy records the miss)."""
        if self._disk is None or self._admission is None or self._admission.admit(block.digest):
            return True
        self._refusals.admission_rejected()
        return False

    def stage(self, block: BlockId, data: bytes) -> None:
        """Keep a block the policy refused in memory, as its only copy."""
        if self._memory.put(block, data, oversize=True):
            self.digests[block.digest] = 0
            if len(self.digests) > _REMEMBERED:
                self.digests.popitem(last=False)

    def hit(self, block: BlockId, data: bytes) -> None:
        """A memory hit on a staged block; the second one promotes it (see the module)."""
        digest = block.digest
        self.digests[digest] += 1
        if self.digests[digest] < 2:
            return
        del self.digests[digest]
        if self._disk is not None:
            self._spawn(self._promote(block, data))

    async def _promote(self, block: BlockId, data: bytes) -> None:
        assert self._disk is not None
        if await self._disk.put(block, data) and len(data) > self._memory.max_on_disk:
            self._memory.discard(block)
