"""The node's invalidation journal: a write seen by one worker is seen by all of them.

With ``workers: N`` every worker process keeps its own memory tiers (object and
listing metadata, hot blocks), and all of them share the disk tier and the
metadata store. A write through one worker drops what it makes stale in its
own memory and in the shared store; S3's promise — every request that starts
after the write is acknowledged sees it — also needs the siblings' memories
dropped before the acknowledgement. Asking each sibling and waiting for its
answer would put N round trips and a failure mode (a stuck sibling) on every
write. Instead the write is *published* in a file every worker maps, and each
worker *catches up* at the start of every request: one 8-byte read when
nothing changed, which is the hit path's price.

The file (``cache.dir/journal``, mapped shared):

  header   magic, ``seq`` (invalidations ever published), the ``everything``
           mark (seq of the last drop-all)
  ring     the last ``RING`` invalidations, a fixed slot each:
           seq, publishing pid, kind (key, prefix, all), origin, bucket, name
  marks    per hash of (origin, bucket, key), and per hash of (origin,
           bucket), the seq of the last invalidation that touched it

Publishing takes an exclusive ``flock`` on the file, writes the slot and the
marks, then bumps ``seq``; catching up reads ``seq`` without a lock and, only
when it moved, reads the new slots under a shared lock. A worker that fell
more than ``RING`` invalidations behind cannot know what it missed and drops
all its memory metadata — slower for a while, never wrong. A record too long
for a slot is published as its whole bucket (a prefix of ""): conservative.

The marks guard the shared metadata store, whose rows outlive any one
worker's catching up: a row remembers the ``seq`` read before the origin
request that taught it (``learned``), and is trusted only while no
invalidation of its key, its bucket or everything came after that
(``current``). So a sibling's fetch that raced a write can store its old
answer and nobody will believe it; hash collisions only cost a revalidation.

``seq`` starts, for a new file, at the wall clock in microseconds, so it
keeps growing across a deleted journal and a kept store (rows from before are
then older than any mark that matters, or — if the clock went back — merely
revalidated too early, never trusted too long).

Not a lock service: the file holds no state a worker must read to serve a
hit except ``seq``; it lives beside the block index and is rebuilt empty if
damaged (wrong magic or size).
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
import zlib
from pathlib import Path

from gateway.core.invalidation import Invalidation
from gateway.core.mapped import MappedFile

MAGIC = b"HOARDJ01"
RING = 4096  # invalidations a worker may fall behind before it drops all
SLOT = 2048  # bytes per ring slot: an S3 key is at most 1024 UTF-8 bytes
KEY_MARKS = 1 << 16
SCOPE_MARKS = 1 << 12

_HEADER = 64
_RING_AT = 4096
_KEY_MARKS_AT = _RING_AT + RING * SLOT
_SCOPE_MARKS_AT = _KEY_MARKS_AT + KEY_MARKS * 8
_SIZE = _SCOPE_MARKS_AT + SCOPE_MARKS * 8
_SEQ_AT, _ALL_AT = 8, 16
_RECORD = struct.Struct("<QIBHHH")  # seq, pid, kind, then the three name lengths
_KEY, _PREFIX, _ALL = 0, 1, 2
_U64 = struct.Struct("<Q")

EVERYTHING = Invalidation("", "", prefix="")  # what a drop-all is published as


class Journal(MappedFile):
    """One worker's view of the node's journal file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path
        self._applied = 0  # the seq this worker has caught up to
        self._pid = os.getpid()

    def open(self) -> None:
        """Map the file, creating (or re-creating, if damaged) it; start caught up."""
        self._open_mapped(self._path, _SIZE, MAGIC, self._fresh)
        self._applied = self.seq()
        self._pid = os.getpid()

    def _fresh(self) -> None:
        # ``seq`` starts at the wall clock in µs: it keeps growing across a new file.
        os.pwrite(self._fd, MAGIC + _U64.pack(time.time_ns() // 1000), 0)

    def seq(self) -> int:
        """Invalidations ever published: read before an origin request as its ``learned``."""
        assert self._map is not None
        return _U64.unpack_from(self._map, _SEQ_AT)[0]

    def publish(self, items: list[Invalidation]) -> None:
        """Make ``items`` known to every worker; returns once they can all see it."""
        assert self._map is not None
        with self._locked(fcntl.LOCK_EX):
            seq = self.seq()
            for item in items:
                seq += 1
                self._write(seq, item)
            _U64.pack_into(self._map, _SEQ_AT, seq)

    def news(self) -> list[Invalidation] | None:
        """What siblings published since the last call, oldest first; ``None``: too
        much to know (fell behind the ring, or someone dropped everything)."""
        assert self._map is not None
        if _U64.unpack_from(self._map, _SEQ_AT)[0] == self._applied:  # a hit's: no change
            return []
        with self._locked(fcntl.LOCK_SH):
            last = self.seq()
            first, self._applied = self._applied + 1, last
            if last - first + 1 > RING:
                return None
            found: list[Invalidation] = []
            for seq in range(first, last + 1):
                pid, item = self._read(seq)
                if item is EVERYTHING:
                    return None
                if pid != self._pid:  # our own were applied when we published them
                    found.append(item)
            return found

    def current(self, origin: str, bucket: str, key: str, learned: int) -> bool:
        """Whether what was learned of ``key`` at ``learned`` is still believable."""
        assert self._map is not None
        marks = (
            _ALL_AT,
            _KEY_MARKS_AT + 8 * (_hash(origin, bucket, key) % KEY_MARKS),
            _SCOPE_MARKS_AT + 8 * (_hash(origin, bucket) % SCOPE_MARKS),
        )
        return all(_U64.unpack_from(self._map, at)[0] <= learned for at in marks)

    # -- the file ----------------------------------------------------------------------

    def _write(self, seq: int, item: Invalidation) -> None:
        assert self._map is not None
        kind = _ALL if item is EVERYTHING else _KEY if item.key is not None else _PREFIX
        names = [s.encode("utf-8", "surrogatepass") for s in _names(item)]
        if _RECORD.size + sum(map(len, names)) > SLOT:  # too long: the whole bucket
            kind, names[2] = _PREFIX, b""
        at = _RING_AT + (seq % RING) * SLOT
        _RECORD.pack_into(self._map, at, seq, self._pid, kind, *map(len, names))
        self._map[at + _RECORD.size : at + _RECORD.size + sum(map(len, names))] = b"".join(names)
        origin, bucket, name = item.origin, item.bucket, item.key or ""
        if kind == _ALL:
            _U64.pack_into(self._map, _ALL_AT, seq)
        elif kind == _KEY:
            _U64.pack_into(
                self._map, _KEY_MARKS_AT + 8 * (_hash(origin, bucket, name) % KEY_MARKS), seq
            )
        else:  # a prefix: every key of the bucket is suspect (prefix writes are rare)
            _U64.pack_into(
                self._map, _SCOPE_MARKS_AT + 8 * (_hash(origin, bucket) % SCOPE_MARKS), seq
            )

    def _read(self, seq: int) -> tuple[int, Invalidation]:
        assert self._map is not None
        at = _RING_AT + (seq % RING) * SLOT
        stored, pid, kind, *lengths = _RECORD.unpack_from(self._map, at)
        if stored != seq:  # cannot happen under the lock; be safe rather than wrong
            return 0, EVERYTHING
        if kind == _ALL:
            return pid, EVERYTHING
        at += _RECORD.size
        origin, bucket, name = (
            bytes(self._map[at + sum(lengths[:i]) : at + sum(lengths[: i + 1])]).decode(
                "utf-8", "surrogatepass"
            )
            for i in range(3)
        )
        if kind == _KEY:
            return pid, Invalidation(origin, bucket, key=name)
        return pid, Invalidation(origin, bucket, prefix=name)


def _names(item: Invalidation) -> list[str]:
    return [item.origin, item.bucket, item.key if item.key is not None else item.prefix or ""]


def _hash(*parts: str) -> int:
    return zlib.crc32("\0".join(parts).encode("utf-8", "surrogatepass"))


class SoloJournal:
    """The journal of a process with no siblings (tests, tools): nothing to tell anyone."""

    def seq(self) -> int:
        return 0

    def publish(self, items: list[Invalidation]) -> None:
        pass

    def news(self) -> list[Invalidation] | None:
        return []

    def current(self, origin: str, bucket: str, key: str, learned: int) -> bool:
        return True
