"""Scan-resistant admission to the disk tier: a block is written on its second miss.

One pass over a cold dataset larger than the cache would, under plain LRU,
replace the whole hot working set with blocks that are never read again. With
``second_hit`` admission a block is written to disk only when it is missed a
second time within the *window* (the last ``window`` distinct blocks missed):
the first miss is served from the origin (and may stay in the memory tier) and
only leaves a trace in the *doorkeeper*. This is TinyLFU's doorkeeper, without
the frequency sketch behind it: one-hit wonders are kept out, anything seen
twice is admitted and LRU decides the rest.

The doorkeeper is two Bloom filters, each sized for ``window`` blocks: misses
are recorded in the current one; when it has taken ``window`` blocks it
becomes the previous one and a fresh filter takes over, so a block is
remembered for between one and two windows. Memory is fixed by the window
(about 1.2 bytes per remembered block per filter), never by the dataset.

Not guaranteed: exactness. A Bloom filter has false positives (about 1% at a
full window with these parameters), so a few first misses are admitted; that
costs disk writes, never correctness. Per process: workers of a node each keep
their own doorkeeper (a block missed once on each of two workers counts as
seen once on each).
"""

from __future__ import annotations

from typing import Literal

Mode = Literal["always", "second_hit"]

_BITS_PER_ENTRY = 10  # with 4 probes: about 1% false positives at a full window
_PROBES = 4


class BloomFilter:
    """A fixed-size set of 40-hex-digit block digests, with false positives."""

    def __init__(self, entries: int) -> None:
        self.size = max(64, entries * _BITS_PER_ENTRY)
        self._bits = bytearray((self.size + 7) // 8)

    def _positions(self, digest: str) -> list[int]:
        # The digest is already a uniform hash: two 64-bit halves make every probe
        # (Kirsch-Mitzenmacher double hashing), with no hashing of our own.
        value = int(digest[:32], 16)
        h1, h2 = value >> 64, (value & ((1 << 64) - 1)) | 1
        return [(h1 + i * h2) % self.size for i in range(_PROBES)]

    def __contains__(self, digest: str) -> bool:
        return all(self._bits[p >> 3] & (1 << (p & 7)) for p in self._positions(digest))

    def add(self, digest: str) -> None:
        for p in self._positions(digest):
            self._bits[p >> 3] |= 1 << (p & 7)


class Doorkeeper:
    """Decides, at each fill, whether a block goes to disk (see the module docstring)."""

    def __init__(self, mode: Mode = "always", window: int = 1_000_000) -> None:
        if window < 1:
            raise ValueError("the admission window must hold at least one block")
        self.mode = mode
        self.window = window
        self._current = BloomFilter(window)
        self._previous = BloomFilter(window)
        self._added = 0  # blocks recorded in the current filter

    def admit(self, digest: str) -> bool:
        """Record a miss of ``digest``; True if the block should be written to disk."""
        if self.mode == "always":
            return True
        if self.seen(digest):
            return True
        self._record(digest)
        return False

    def seen(self, digest: str) -> bool:
        """Whether a miss of ``digest`` is remembered (asks without recording one)."""
        return digest in self._current or digest in self._previous

    def _record(self, digest: str) -> None:
        if self._added >= self.window:
            self._previous, self._current = self._current, BloomFilter(self.window)
            self._added = 0
        self._current.add(digest)
        self._added += 1
