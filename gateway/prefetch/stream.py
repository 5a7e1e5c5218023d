"""One registered order and where its reader is: the accounting of a prefetch stream.

Pure state, no I/O, so the window rules can be read (and tested) on their own.
The *position* is the index of the key the reader last asked for; the
*ahead* bytes are the blocks prefetch has taken on (fetched or in flight) for
keys after the position. Prefetch takes on a block only while ``ahead_bytes``
plus the block stays within the window, so bytes fetched ahead of the reader
never exceed ``max(window, one block)``; they are released as the position
moves past their key.

A key may appear several times in an order (and in several streams): a GET
moves the position to the first occurrence after the current position, else
to the last occurrence before it, so a reader going round an order with
repeats keeps moving forward.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import TYPE_CHECKING, Any

from gateway.prefetch.order import Order

if TYPE_CHECKING:
    from gateway.blocks import BlockRef


class Stream:
    def __init__(self, order: Order, active: bool, now: float) -> None:
        self.order = order
        self.active = active  # whether this node fetches for it (see the package docstring)
        self.last_used = now
        self.position = -1  # index of the key the reader last asked for
        self.next_key = 0  # the next key whose blocks prefetch will look up
        self.pending: deque[tuple[int, BlockRef]] = deque()  # looked up, not yet taken on
        self.ahead_bytes = 0
        self._ahead: deque[tuple[int, int]] = deque()  # (key index, bytes), in order
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
            self.ahead_bytes -= self._ahead.popleft()[1]
        if self.next_key <= index:  # the reader overtook prefetch: skip what it read itself
            self.next_key = index + 1
            self.pending.clear()
        while self.pending and self.pending[0][0] <= index:
            self.pending.popleft()

    def room(self, size: int) -> bool:
        """Whether ``size`` more bytes fit in the window (one block always fits)."""
        return self.ahead_bytes == 0 or self.ahead_bytes + size <= self.order.window

    def take(self, index: int, size: int) -> None:
        """Count ``size`` bytes of the key at ``index`` as fetched ahead."""
        self._ahead.append((index, size))
        self.ahead_bytes += size

    def status(self, now: float) -> dict[str, Any]:
        return {
            "stream": self.order.stream, "bucket": self.order.bucket, "keys": len(self.keys),
            "position": self.position, "next_key": self.next_key, "window": self.order.window,
            "ahead_bytes": self.ahead_bytes, "in_flight_bytes": self.in_flight_bytes,
            "fetched_bytes": self.fetched_bytes, "errors": self.errors, "active": self.active,
            "idle_seconds": round(now - self.last_used, 3),
        }  # fmt: skip
