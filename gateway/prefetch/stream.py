"""One registered order and where its reader is: the accounting of a prefetch stream.

Pure state, no I/O, so the window rules can be read (and tested) on their own.
The *position* is the index of the key the reader last asked for; the
*ahead* bytes are what prefetch has committed to for keys after the position:
blocks taken on (fetched or in flight) plus, for each key whose lookup is in
flight, a reservation of one block. A lookup (``Reader.block_refs``) fetches
at most block 0 of its key, so the reservation covers what it brings before
its size is known; when it answers, the reservation becomes the size of block
0 (``found``) and the key's other blocks wait in ``pending`` to be taken on.

The bound: prefetch reserves or takes on bytes only while ``room`` says they
fit, that is while ``ahead_bytes`` plus them stays within the window, or
nothing is ahead; a reservation only ever shrinks to the real size. So
``ahead_bytes``, and with it the bytes fetched ahead of the reader
(reservations included, in flight or landed), never exceed
``max(window, one block)``. Bytes are released as the position moves past
their key.

Which work comes first: the pending blocks of keys already looked up, nearest
key first (they are all nearer the reader than any key not looked up yet),
then the lookup of the next key. Lookups run concurrently and answer in any
order, so a key's later blocks may become known after farther keys' lookups
took the room they need: with a window of only a few objects, such a block
waits until the reader frees room, or the reader fetches it itself. The
bound holds all the same, and no block is fetched twice.

A key may appear several times in an order (and in several streams): a GET
moves the position to the first occurrence after the current position, else
to the last occurrence before it, so a reader going round an order with
repeats keeps moving forward.
"""

from __future__ import annotations

import bisect
from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from gateway.prefetch.order import Order

if TYPE_CHECKING:
    from gateway.pieces import BlockRef


class Stream:
    def __init__(self, order: Order, active: bool, now: float) -> None:
        self.order = order
        self.active = active  # whether this node fetches for it (see the package docstring)
        self.last_used = now
        self.position = -1  # index of the key the reader last asked for
        self.next_key = 0  # the next key whose blocks prefetch will look up
        # Looked up, not yet taken on: (key index, block), in key order whatever
        # order the lookups answered in, so nearer keys are taken on first.
        self.pending: list[tuple[int, BlockRef]] = []
        self.ahead_bytes = 0
        # Bytes ahead per key, in key order: keys are reserved in order, and a key's
        # later blocks add to its own entry, so the entries the reader passed lead.
        self._ahead: deque[list[int]] = deque()  # [key index, bytes]
        self._by_key: dict[int, list[int]] = {}
        self.lookups = 0  # lookups in flight
        self.in_flight_bytes = 0
        self.fetched_bytes = 0  # bytes of blocks that were not cached when prefetch got there
        self.errors = 0
        self._where: dict[str, list[int]] = {}
        for index, key in enumerate(order.keys):
            self._where.setdefault(key, []).append(index)

    @property
    def keys(self) -> tuple[str, ...]:
        return self.order.keys

    def index_of(self, key: str) -> int | None:
        """Where a GET of ``key`` puts the reader, or None if the order lacks it."""
        found = self._where.get(key)
        if found is None:
            return None
        after = bisect.bisect_right(found, self.position)
        return found[after] if after < len(found) else found[-1]

    def move(self, index: int, now: float) -> None:
        """The reader asked for the key at ``index``: release what it has passed."""
        self.last_used = now
        self.position = index
        while self._ahead and self._ahead[0][0] <= index:
            passed = self._ahead.popleft()
            del self._by_key[passed[0]]
            self.ahead_bytes -= passed[1]
        if self.next_key <= index:  # the reader overtook prefetch: skip what it read itself
            self.next_key = index + 1
        passed_blocks = bisect.bisect_right(self.pending, index, key=itemgetter(0))
        del self.pending[:passed_blocks]

    def room(self, size: int) -> bool:
        """Whether ``size`` more bytes fit in the window (one block always fits)."""
        return self.ahead_bytes == 0 or self.ahead_bytes + size <= self.order.window

    def reserve(self, index: int, size: int) -> None:
        """Start looking up the key at ``index``, holding ``size`` bytes for what it brings."""
        entry = [index, size]
        self._ahead.append(entry)
        self._by_key[index] = entry
        self.ahead_bytes += size
        self.next_key = index + 1
        self.lookups += 1

    def found(self, index: int, first: int, rest: list[BlockRef]) -> bool:
        """The lookup of ``index`` answered: block 0 has ``first`` bytes, ``rest`` wait.

        False when the reader has passed the key meanwhile: nothing is kept for it.
        """
        self.lookups -= 1
        entry = self._by_key.get(index)
        if entry is None:
            return False
        self.ahead_bytes += first - entry[1]
        entry[1] = first
        for ref in rest:
            bisect.insort(self.pending, (index, ref), key=_pending_order)
        return True

    def take(self, index: int, size: int) -> None:
        """Count ``size`` more bytes of the key at ``index`` as fetched ahead."""
        entry = self._by_key.get(index)
        if entry is not None:  # else the reader passed it: released already
            entry[1] += size
            self.ahead_bytes += size

    def status(self, now: float) -> dict[str, Any]:
        return {
            "stream": self.order.stream, "bucket": self.order.bucket, "keys": len(self.keys),
            "position": self.position, "next_key": self.next_key, "window": self.order.window,
            "ahead_bytes": self.ahead_bytes, "in_flight_bytes": self.in_flight_bytes,
            "lookups": self.lookups, "fetched_bytes": self.fetched_bytes, "errors": self.errors,
            "active": self.active,
            "idle_seconds": round(now - self.last_used, 3),
        }  # fmt: skip


def _pending_order(item: tuple[int, BlockRef]) -> tuple[int, int]:
    return item[0], item[1].block.index
