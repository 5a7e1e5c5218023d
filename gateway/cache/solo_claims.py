"""Fill claims of packed blocks held in memory, when one process alone writes the cache.

With sibling workers a fill is claimed with an ``flock``'ed part file
(``disk_files.claim``), which also carries the bytes to a sibling that tails
it. A node of one worker (Hoard's default) has no sibling, and there the part
file is cost alone, paid by every cold small block: a create, a lock, two
stats, a header's and the data's writes, and an unlink after the group commit
in the index thread (~37 µs of CPU on ext4 measured alone; more on a busy
node, whose creates and the batch's unlinks contend for the one ``tmp/``
directory). So a tier that writes its directory alone claims a packed block
here: a digest held in a dict, with the event its release sets. A second claim
of a held digest (a write-through's ``put`` meeting a fill, the same process's
only way to claim twice) is refused, as a sibling's part would refuse it, and
``wait`` stands in for tailing: a packed block's bytes reach the index whole,
at its group commit, so there is nothing to tail before then.

Alone is checked, not assumed. A tier claiming in memory holds an exclusive
``flock`` on ``disk.lock``, and the workers of a node hold it shared: a
single-worker Hoard started over the directory of a running node (or a second
one over the first's) cannot take it and claims with part files, as siblings
do. A tier that holds its lock shared and then finds a lone process holding it
exclusively can only say so: that process does not see its parts (the two may
fill the same block twice; each record is checked on its own, so nothing
wrong is served).

Large blocks keep their part files either way: they are renamed into place,
and a reader of the same process tails a part as a sibling would.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path


class NodeLock:
    """The tier's hold on ``disk.lock``: exclusive when alone, shared with siblings."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def hold(self, alone: bool) -> bool:
        """Take the lock (``alone``: exclusively); False if another process's hold refuses it."""
        self.close()
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # the kernel drops the flock with its last descriptor
            self._fd = -1


class SoloClaims:
    """Claims of packed blocks by digest, held by this process alone."""

    def __init__(self) -> None:
        self._held: dict[str, asyncio.Event] = {}

    def take(self, digest: str) -> bool:
        """Claim ``digest``'s fill; False if it is claimed already."""
        if digest in self._held:
            return False
        self._held[digest] = asyncio.Event()
        return True

    def release(self, digest: str) -> None:
        """End the claim (its block indexed, or not to be): waiters go on."""
        released = self._held.pop(digest, None)
        if released is not None:
            released.set()

    async def wait(self, digest: str, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for ``digest``'s claim to end; whether it was held."""
        held = self._held.get(digest)
        if held is None:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(held.wait(), timeout)
        return True

    def __len__(self) -> int:
        return len(self._held)
