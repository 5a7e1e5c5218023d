"""The memory tier: hot small blocks kept as bytes, least recently used out first.

Bounded by bytes (``capacity``), never by count. Only blocks up to
``max_item`` bytes are admitted, so one large shard cannot flush thousands of
small images; large blocks are served from the disk tier with sendfile, which
is as fast and costs no heap.

Not thread-safe: one event loop owns it. Per process: workers of a node each
have their own (the kernel's page cache is what they share).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class MemoryTier:
    def __init__(
        self,
        capacity: int,
        max_item: int,
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        self.capacity = capacity
        self.max_item = min(max_item, capacity)
        self.used = 0
        self.evictions = 0
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def admits(self, size: int) -> bool:
        return 0 < size <= self.max_item

    def put(self, key: Hashable, data: bytes, oversize: bool = False) -> bool:
        """Keep ``data`` under ``key`` if it is small enough; evict LRU blocks to fit.

        ``oversize`` takes a block above ``max_item`` too (up to a quarter of the
        capacity): one that has no other place to stay (see ``blocks.py``).
        """
        fits = oversize and 0 < len(data) <= self.capacity // 4
        if not (fits or self.admits(len(data))):
            return False
        self.discard(key)
        self._items[key] = data
        self.used += len(data)
        evicted = 0
        while self.used > self.capacity:
            _, old = self._items.popitem(last=False)
            self.used -= len(old)
            evicted += 1
        if evicted:
            self.evictions += evicted
            if self._on_evict is not None:
                self._on_evict(evicted)
        return True

    def discard(self, key: Hashable) -> None:
        data = self._items.pop(key, None)
        if data is not None:
            self.used -= len(data)

    def discard_where(self, predicate: Callable[[Hashable], bool]) -> int:
        """Drop every block whose key matches (used by prefix invalidation)."""
        doomed = [key for key in self._items if predicate(key)]
        for key in doomed:
            self.discard(key)
        return len(doomed)

    def clear(self) -> None:
        self._items.clear()
        self.used = 0
