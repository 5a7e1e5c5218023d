"""Fill claims of packed blocks: a digest held in memory and a stripe of a lock file.

A block that has its own file is claimed with an ``flock``'ed part file
(``disk_files.claim``), which carries its bytes to a sibling worker that tails
it. For a packed block that part file was cost alone, paid by every cold
small block: a create, a lock, two stats, a header's and the data's writes,
and an unlink after the group commit (~37 µs of CPU on ext4 measured alone;
more on a busy node, whose creates and the batch's unlinks contend for the one
``tmp/`` directory), and the block in flight was on disk twice until its
group commit (its record and its part: a full disk filled again after its
first room-making pass). A packed block's bytes reach siblings whole, at the
group commit, so there is nothing to tail before then anyway.

So a packed block is claimed here instead:

- in this process, by its digest held in a dict with the event its release
  sets; a second claim of a held digest (a write-through's ``put`` meeting a
  fill) is refused;
- across the node's processes, by one byte of the ``claims`` file, the block's
  *stripe* (the digest's first 32 bits: 2**32 stripes, in a file that stays
  empty, since a lock needs no data), locked with an open file
  description lock (``F_OFD_SETLK``: it belongs to the tier's descriptor, so
  two tiers of one process exclude each other too, and the kernel drops it
  when its holder exits, however it exits). The tier counts its claims per
  stripe and holds the byte while any is held.

A reader that finds the block claimed waits (``wait``) for this process's
claim to end, or for the block to be indexed or the stripe to free (polled
every 2 ms) when a sibling holds it; then it looks again, and claims it
itself if it is still missing (its filler failed, or died).

Not guaranteed: that two blocks never share a stripe. A claim refused for
another block's stripe is served from the origin and not stored when its
filler already holds the origin's answer (a cold object's first block), and
a reader waits for the other block's fill (one fill's time at most). A
sibling holds ~3 claims at a time in a cold epoch of two workers (with 64
stripes, 219 of 5,000 objects were left unstored: 4.4 %, ~2.8 of 64); with
2**20 stripes that left one object in ~370,000 out of the cache, and a
100,000-object epoch was found missing one. With 2**32, one in ~1.5 billion.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

_POLL = 0.002  # seconds between looks at a stripe a sibling holds
_FLOCK = "hhqqi4x"  # struct flock on Linux: type, whence, start, len, pid (0 for OFD locks)


class PackedClaims:
    """The claims of one disk tier's packed blocks (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self._held: dict[str, asyncio.Event] = {}
        self._stripes: dict[int, int] = {}  # stripe -> this tier's claims in it

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def close(self) -> None:
        """Close the file: every stripe this tier held opens."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        self._stripes.clear()
        for event in self._held.values():
            event.set()
        self._held.clear()

    def take(self, digest: str) -> bool:
        """Claim ``digest``'s fill; False if it is claimed already, here or by a sibling."""
        if digest in self._held or self._fd < 0:
            return False
        stripe = _stripe(digest)
        count = self._stripes.get(stripe, 0)
        if count == 0 and not _lock(self._fd, stripe, fcntl.F_WRLCK):
            return False
        self._stripes[stripe] = count + 1
        self._held[digest] = asyncio.Event()
        return True

    def release(self, digest: str) -> None:
        """End the claim (its block indexed, or not to be): waiters go on."""
        released = self._held.pop(digest, None)
        if released is None:
            return
        stripe = _stripe(digest)
        count = self._stripes.get(stripe, 0) - 1
        if count > 0:
            self._stripes[stripe] = count
        else:
            self._stripes.pop(stripe, None)
            with contextlib.suppress(OSError):  # closed meanwhile: the lock went with it
                _lock(self._fd, stripe, fcntl.F_UNLCK)
        released.set()

    def holds(self, digest: str) -> bool:
        return digest in self._held

    async def wait(self, digest: str, landed: Callable[[], bool], timeout: float) -> None:
        """Wait at most ``timeout`` seconds for ``digest``'s claim to end: this tier's, or
        a sibling's stripe until it frees or ``landed()`` says the block is indexed."""
        held = self._held.get(digest)
        if held is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held.wait(), timeout)
            return
        stripe = _stripe(digest)
        deadline = time.monotonic() + timeout
        while self._fd >= 0 and stripe not in self._stripes and not _free(self._fd, stripe):
            if landed() or time.monotonic() >= deadline:
                return
            await asyncio.sleep(_POLL)


def _stripe(digest: str) -> int:
    """The digest's first 32 bits: a byte offset of the lock file (never written)."""
    return int(digest[:8], 16)


def _lock(fd: int, stripe: int, kind: int) -> bool:
    """Set (or clear) the stripe's byte lock without waiting; False if a sibling holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, stripe, 1, 0))
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held elsewhere
        return False
    return True


def _free(fd: int, stripe: int) -> bool:
    """Whether no other open file description holds the stripe's byte (nothing is taken)."""
    probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, stripe, 1, 0)
    found = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
    return struct.unpack(_FLOCK, found)[0] == fcntl.F_UNLCK
