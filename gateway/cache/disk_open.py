"""Hot block files kept open: a disk hit without a thread hop, an open or a check.

Like nginx's ``open_file_cache``. Opening a block file means a path walk, a
header read and an fstat, in a worker thread because the event loop must not
wait on the disk; for a small object that costs more than the rest of a
cached GET (measured: 2,400 vs 3,100 GETs/s of 160 KiB objects on one core).
Block files never change once renamed into place, so a hot block's descriptor
can be kept and shared: sendfile takes an explicit offset, so concurrent
responses reading one descriptor do not disturb each other.

A kept descriptor is used only while its file is the one that was verified
and still has a name: each hit ``fstat``s it on the event loop (no disk I/O:
the inode of an open file is in memory) and compares (inode, size, mtime,
ctime) with the fingerprint taken when its checksum passed, and
``st_nlink > 0``. A file rewritten in place, truncated, or unlinked (evicted
or dropped by any worker of the node) is forgotten, and that hit takes the
normal path, which verifies the file again or finds it gone.

Bounded: at most ``entries`` descriptors, of blocks up to ``max_block`` data
bytes (a large block amortises its open over megabytes). The space of an
unlinked file returns only when its last descriptor closes: unlinks by this
process forget their descriptors at once (``forget``); unlinks by sibling
workers are found by the next hit or by ``sweep``, which the disk tier runs
every touch interval. Until then the disk holds at most
``entries * max_block`` bytes beyond the tier's capacity. A descriptor still
sending when it is forgotten is closed by its last user.

A sweep checks at most ``SWEEP_SLICE`` descriptors, taking up where the last
one stopped, so a pass over the table takes ``entries / SWEEP_SLICE``
intervals (4 at the default). It runs on the loop: one pass over the whole
table at once (an ``fstat`` and a compare each) stalled every request for
~4 ms a second at the default 4,096 entries, and for ~1/4 s a second at
262,144 (``open_files`` raised, within a quarter of a 1,048,576-descriptor
limit).

Every open runs in a worker thread; ``opening`` awaits one so that a caller
cancelled meanwhile does not leak what the thread opened after all: the
result is closed when the thread finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from collections import OrderedDict
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.cache.disk_files import BlockFile, PartFollower, fingerprint_of

T = TypeVar("T")

SWEEP_SLICE = 1024  # kept descriptors one sweep checks (~1 ms on the loop)


class _Kept:
    """One kept descriptor and how many responses are using it."""

    __slots__ = ("file", "kept", "users")

    def __init__(self, file: BlockFile) -> None:
        self.file = file
        self.users = 0
        self.kept = True  # still in the table; when False, the last user closes it

    def release(self) -> None:
        self.users -= 1
        if not self.kept and self.users == 0:
            self.file.close()


@dataclass(slots=True)
class SharedBlockFile(BlockFile):
    """A kept block file lent to one response; ``close`` hands it back."""

    kept: _Kept | None = None

    def close(self) -> None:
        if self.kept is not None:
            kept, self.kept = self.kept, None
            kept.release()


class OpenBlocks:
    """Descriptors of recently served block files, by block digest (least recent first)."""

    def __init__(self, entries: int, max_block: int) -> None:
        self.entries = entries
        self.max_block = max_block
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._unswept: list[str] = []  # this sweep pass's digests still to check, last first

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, digest: str) -> SharedBlockFile | None:
        """The block's kept file, lent to the caller (``close`` it), or None."""
        kept = self._kept.get(digest)
        if kept is None:
            return None
        if not _unchanged(kept.file):
            self._drop(digest)
            return None
        self._kept.move_to_end(digest)
        return self._lend(kept)

    def keep(self, digest: str, file: BlockFile) -> BlockFile:
        """Take ``file`` (just opened and verified) into the table if it fits the bounds.

        Returns what the caller should use and close: a lent copy if kept,
        else ``file`` itself.
        """
        if self.entries <= 0 or file.length > self.max_block or not file.fingerprint:
            return file
        if digest in self._kept:  # a concurrent first hit kept it already
            return file
        kept = _Kept(file)
        self._kept[digest] = kept
        while len(self._kept) > self.entries:
            self._drop(next(iter(self._kept)))
        return self._lend(kept)

    def forget(self, digests: Iterable[str]) -> None:
        """These blocks' files are being removed: stop lending their descriptors."""
        for digest in digests:
            if digest in self._kept:
                self._drop(digest)

    def sweep(self, limit: int = SWEEP_SLICE) -> int:
        """Forget descriptors of files removed or changed meanwhile, checking at most
        ``limit`` of them, where the last sweep stopped; returns how many it forgot."""
        if not self._unswept:
            self._unswept = list(reversed(self._kept))  # a pass: every digest kept now
        batch = self._unswept[-limit:]
        del self._unswept[-limit:]
        stale = [d for d in batch if (kept := self._kept.get(d)) and not _unchanged(kept.file)]
        self.forget(stale)
        return len(stale)

    def clear(self) -> None:
        self.forget(list(self._kept))

    def _lend(self, kept: _Kept) -> SharedBlockFile:
        kept.users += 1
        file = kept.file
        return SharedBlockFile(file.fd, file.data_offset, file.length, file.fingerprint, kept)

    def _drop(self, digest: str) -> None:
        kept = self._kept.pop(digest)
        kept.kept = False
        if kept.users == 0:
            kept.file.close()


def raise_fd_limit() -> None:
    """Lift this process's soft open-file limit to its hard limit, as servers do
    (nginx's ``worker_rlimit_nofile``): the default soft limit of 1,024 would
    leave room for few connections and kept block files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def within_fd_limit(entries: int) -> int:
    """``entries``, capped at a quarter of the open-file limit: connections need the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return entries
    return max(0, min(entries, soft // 4))


def _unchanged(file: BlockFile) -> bool:
    try:
        stat = os.fstat(file.fd)
    except OSError:
        return False
    return stat.st_nlink > 0 and fingerprint_of(stat) == file.fingerprint


async def opening(job: Awaitable[T]) -> T:
    """Await a thread job that opens descriptors; if cancelled, close what it opened."""
    future = asyncio.ensure_future(job)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_close_result)
        raise


def _close_result(future: asyncio.Future[Any]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    result = future.result()
    if isinstance(result, int):
        os.close(result)
    elif isinstance(result, BlockFile | PartFollower):
        result.close()
