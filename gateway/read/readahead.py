"""How many blocks to fetch ahead of a sequential reader: a window that adapts to its pace.

A fixed read-ahead is either too short for a fast reader (it catches up with
the fills and waits on the origin at every block) or wasteful for a slow or
random one. The window here starts at ``initial`` blocks and doubles each time
the reader *catches up*: it reaches a block that read-ahead had asked for and
that is not there yet, i.e. it consumes faster than fills complete. It never
exceeds ``maximum``. It falls back to ``initial`` when the stream turns random
(a read that does not continue the previous one) or goes idle for longer than
``idle`` seconds, so a stream that pauses or jumps does not keep a large
window of blocks in flight for nothing.

This is the shape of the Linux page cache's read-ahead (ramp up on sequential
hits of the async marker, reset on a random read), with "caught up" as the
signal because a Hoard block is a network fetch, not a disk read.

Not guaranteed: that the window matches the reader's rate exactly; it only
moves in powers of two between its bounds. One window per object a reader
streams (the reader keeps a bounded number of them).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class Window:
    """The read-ahead state of one sequential stream."""

    blocks: int
    last: float  # clock time of the stream's last read
    # The last block read ahead of the stream: each is asked for once, not once per block
    # read before it (a cached block's check opens its file; a 256 MiB object of 8 MiB
    # blocks took ~5 opens a block, 45 ms of CPU a read, where nginx spends 1).
    asked: int = -1


class ReadAheadPolicy:
    def __init__(
        self,
        initial: int,
        maximum: int,
        idle: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if maximum < initial:
            raise ValueError("the read-ahead maximum must be at least the initial window")
        self.initial = initial
        self.maximum = maximum
        self.idle = idle
        self._clock = clock

    def new(self) -> Window:
        """The window of a stream seen for the first time."""
        return Window(self.initial, self._clock())

    def resume(self, window: Window, sequential: bool) -> int:
        """A read of the stream begins: its window, reset if it went random or idle."""
        now = self._clock()
        if not sequential or now - window.last > self.idle:
            window.blocks = self.initial
            window.asked = -1  # a jump or a pause: what was read ahead may be gone since
        window.last = now
        return window.blocks

    def ahead(self, window: Window, index: int, limit: int) -> range:
        """The blocks to read ahead as block ``index`` is read (up to ``limit``, the last one
        the read may run to): the window past it, without those already asked for."""
        blocks = range(max(index, window.asked) + 1, min(index + window.blocks, limit) + 1)
        if blocks:
            window.asked = blocks[-1]
        return blocks

    def caught_up(self, window: Window) -> int:
        """The reader reached a block read-ahead had not landed yet: widen the window."""
        if self.initial > 0:  # read-ahead switched off stays off
            window.blocks = min(self.maximum, max(1, window.blocks * 2))
        window.last = self._clock()
        return window.blocks


class Streams:
    """Per object a reader streams: where its last read ended, and its window.

    Bounded to the ``remembered`` most recently read objects: a stream
    forgotten starts again from the initial window, which costs only a
    ramp-up.
    """

    def __init__(self, policy: ReadAheadPolicy, remembered: int = 4096) -> None:
        self.policy = policy
        self._remembered = remembered
        self._ends: OrderedDict[Hashable, tuple[int, Window]] = OrderedDict()

    def follow(
        self, stream: Hashable, start: int, end: int, block_size: int
    ) -> tuple[Window, bool, int]:
        """A read of bytes ``start``..``end`` begins: the stream's window, whether this
        read continues the previous one (then read-ahead runs past ``end``), and the
        window's size now."""
        previous = self._ends.pop(stream, None)
        window = previous[1] if previous is not None else self.policy.new()
        self._ends[stream] = (end, window)
        if len(self._ends) > self._remembered:
            self._ends.popitem(last=False)
        sequential = previous is not None and previous[0] < start <= previous[0] + block_size
        return window, sequential, self.policy.resume(window, sequential)
