"""The memory tier: hot small blocks kept as bytes, least recently used out first.

Bounded by bytes (``capacity``), never by count. Only blocks up to
``max_item`` bytes are admitted, so one large shard cannot flush thousands of
small images; large blocks are served from the disk tier with sendfile, which
is as fast and costs no heap.

A block that also went to disk is kept here only up to ``max_on_disk`` bytes
(64 KiB by default). Above that, a hit sent with ``sendfile`` from the disk
copy (in the page cache after its write) costs less CPU than one copied out
of Python bytes: measured per 128 KiB hit, 107-112 µs against 129-140, the
system time halved; at 64 KiB and below the copy still wins (89-99 against
104-106). The bytes are then held once (the page cache) instead of twice, and
the memory tier's room goes to the small blocks it serves best. Blocks with no
disk copy (no disk tier, a full disk, admission kept them off it, a peer's
block) are kept up to ``max_item`` as before.

A block's bytes may be *lent* (``lend``): the borrower holds a ``Loan`` whose
``data`` is the block's bytes while the tier holds them, and None from the
moment the block leaves it (evicted, discarded, replaced, cleared). A hit
repeated from a loan checks one field instead of looking the block up, and
never holds bytes the tier let go: the tier's bound stays the bound. One loan
per block (a new one ends the last); a loan costs a dict entry while its block
is here.

Not thread-safe: one event loop owns it. Per process: workers of a node each
have their own (the kernel's page cache is what they share).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class Loan:
    """A block's bytes, lent while the tier holds them: ``data`` is None once it does not.
    ``key`` is the tier's own key object: renewing by it finds the entry by identity, where
    an equal key would be compared field by field."""

    __slots__ = ("data", "key")

    def __init__(self, key: Hashable, data: bytes) -> None:
        self.key = key
        self.data: bytes | None = data


class MemoryTier:
    def __init__(
        self,
        capacity: int,
        max_item: int,
        on_evict: Callable[[int], None] | None = None,
        max_on_disk: int | None = None,
    ) -> None:
        self.capacity = capacity
        self.max_item = min(max_item, capacity)
        self.max_on_disk = self.max_item if max_on_disk is None else min(max_on_disk, self.max_item)
        self.used = 0
        self.evictions = 0
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._loans: dict[Hashable, Loan] = {}  # the blocks lent now (``lend``)
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def renew(self, loan: Loan) -> None:
        """``loan``'s block marked recently used, as ``get`` marks it, if it is still here."""
        if loan.data is not None:  # then its key is the tier's, as lent (``_ended``)
            self._items.move_to_end(loan.key)

    def lend(self, key: Hashable, size: int) -> Loan | None:
        """``key``'s bytes as a ``Loan`` (see the module), marked recently used; None if
        the tier does not hold them, or they are not ``size`` bytes."""
        data = self._items.get(key)
        if data is None or len(data) != size:
            return None
        del self._items[key]
        self._items[key] = data  # held under this very key object from now on, most recent
        old = self._loans.pop(key, None)
        if old is not None:
            old.data = None
        loan = self._loans[key] = Loan(key, data)
        return loan

    def _ended(self, key: Hashable) -> None:
        """``key``'s block left the tier: its loan, if any, ends."""
        loan = self._loans.pop(key, None)
        if loan is not None:
            loan.data = None

    def admits(self, size: int) -> bool:
        return 0 < size <= self.max_item

    def put(
        self, key: Hashable, data: bytes, oversize: bool = False, on_disk: bool = False
    ) -> bool:
        """Keep ``data`` under ``key`` if it is small enough; evict LRU blocks to fit.

        ``oversize`` takes a block above ``max_item`` too (up to a quarter of the
        capacity): one that has no other place to stay (see ``staging.py``).
        ``on_disk``: the block is stored on disk too, so only up to ``max_on_disk``.
        """
        if on_disk and len(data) > self.max_on_disk:
            self.discard(key)  # a copy kept earlier would be served before the disk's
            return False
        fits = oversize and 0 < len(data) <= self.capacity // 4
        if not (fits or self.admits(len(data))):
            return False
        self.discard(key)
        self._items[key] = data
        self.used += len(data)
        evicted = 0
        while self.used > self.capacity:
            gone, old = self._items.popitem(last=False)
            self.used -= len(old)
            if self._loans:
                self._ended(gone)
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
            if self._loans:
                self._ended(key)

    def discard_where(self, predicate: Callable[[Hashable], bool]) -> int:
        """Drop every block whose key matches (used by prefix invalidation)."""
        doomed = [key for key in self._items if predicate(key)]
        for key in doomed:
            self.discard(key)
        return len(doomed)

    def clear(self) -> None:
        self._items.clear()
        self.used = 0
        for loan in self._loans.values():
            loan.data = None
        self._loans.clear()
