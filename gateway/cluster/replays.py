"""Refusing replayed peer requests: every sender's counters, remembered node-wide.

A signed peer request (``peers.py``) names its sender (8 random bytes a
``PeerClient`` draws when it starts) and a counter that sender never uses
twice. The receiving node remembers, per sender, the highest counter it
accepted and which of the ``WINDOW`` counters below it it has seen: the
anti-replay window of IPsec (RFC 4303, section 3.4.3). A counter seen before
is a replay; one more than ``WINDOW`` below the highest is too old to tell,
and refused as well (a sender keeps far fewer requests in flight, so only a
replay lands there). Memory is fixed whatever the request rate: ``SLOTS``
senders of ``_SLOT`` bytes each, about half a megabyte.

Why node-wide: the workers of a node share its port, so a replay may reach a
sibling of the worker that accepted the original. The table is a file every
worker maps (``core/mapped.py``) and changes under its ``flock``; a check is a
hash, a few probes and one slot's bytes. Without a path (tests, a single
process) the table is a plain buffer.

A sender's slot can be taken by another sender only once it has been silent
for ``2 * MAX_SKEW`` (``reusable_after``): by then every request it signed is
outside the date window and refused for its date alone, so forgetting it
opens no replay. A new sender that finds every probed slot held by a live one
is refused (fail closed): the asking node falls back to the next one or its
origin.

Not guaranteed: a sender whose requests arrive more than ``WINDOW`` counters
out of order sees the oldest refused (a retry signs a new counter); more than
``SLOTS`` senders alive at once (restarts within ten minutes included) are
refused until slots free up.
"""

from __future__ import annotations

import os
import struct
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from gateway.core.mapped import MappedFile

SLOTS = 1024  # senders remembered at once (a node's workers, times nodes, times restarts)
WINDOW = 4096  # counters below the highest that are remembered one by one
_PROBES = 16  # slots looked at for one sender (open addressing)
_MAGIC = b"HRPLAY01"
_HEAD = struct.Struct("<8sQd")  # sender, highest counter, last seen (epoch seconds)
_BITS = WINDOW // 8
_SLOT = _HEAD.size + _BITS
_SIZE = len(_MAGIC) + SLOTS * _SLOT
_EMPTY = bytes(8)


class SeenCounters(MappedFile):
    """Which (sender, counter) pairs this node accepted; ``accept`` records one."""

    def __init__(self, path: Path | None, reusable_after: float) -> None:
        """``path``: the node-shared file (None: this process alone);
        ``reusable_after``: seconds of silence after which a sender's slot may be reused."""
        super().__init__()
        self._reusable_after = reusable_after
        self._buffer: bytearray | None = None
        if path is None:
            self._buffer = bytearray(_SIZE)
        else:
            self._open_mapped(path, _SIZE, _MAGIC, lambda: _write_magic(self._fd))

    def _table(self) -> bytearray | memoryview:
        if self._buffer is not None:
            return self._buffer
        assert self._map is not None, "closed"
        return memoryview(self._map)

    def _lock(self) -> AbstractContextManager[None]:
        return nullcontext() if self._buffer is not None else self._locked()

    def accept(self, sender: bytes, counter: int, now: float) -> bool:
        """Record ``counter`` of ``sender`` if it was never accepted; False for a replay,
        a counter too old to tell, or no room for a new sender."""
        if len(sender) != 8 or sender == _EMPTY or counter < 1:
            return False
        with self._lock():
            table = self._table()
            slot = self._slot(table, sender, now)
            if slot is None:
                return False
            return _record(table, slot, sender, counter, now)

    def _slot(self, table: bytearray | memoryview, sender: bytes, now: float) -> int | None:
        """The offset of ``sender``'s slot, or of a free one it may take; None if full."""
        start = int.from_bytes(sender, "little") % SLOTS
        free = None
        for probe in range(_PROBES):
            offset = len(_MAGIC) + ((start + probe) % SLOTS) * _SLOT
            owner, _, seen = _HEAD.unpack_from(table, offset)
            if owner == sender:
                return offset
            if free is None and (owner == _EMPTY or now - seen > self._reusable_after):
                free = offset
        return free


def _record(table: bytearray | memoryview, offset: int, sender: bytes, counter: int,
            now: float) -> bool:  # fmt: skip
    owner, highest, _ = _HEAD.unpack_from(table, offset)
    bits_at = offset + _HEAD.size
    if owner != sender:  # a fresh slot: this is the first counter remembered
        highest, bits = counter, 1
    elif counter > highest:
        window = int.from_bytes(table[bits_at : bits_at + _BITS], "little")
        bits = ((window << (counter - highest)) | 1) & ((1 << WINDOW) - 1)
        highest = counter
    else:
        behind = highest - counter
        window = int.from_bytes(table[bits_at : bits_at + _BITS], "little")
        if behind >= WINDOW or window >> behind & 1:
            return False  # seen before, or too far behind to tell
        bits = window | 1 << behind
    _HEAD.pack_into(table, offset, sender, highest, now)
    table[bits_at : bits_at + _BITS] = bits.to_bytes(_BITS, "little")
    return True


def _write_magic(fd: int) -> None:
    os.pwrite(fd, _MAGIC, 0)
