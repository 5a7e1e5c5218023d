"""Fetch locks: one fetch of a key's metadata at a time across a node's workers.

Sibling workers share the node's metadata store (``store.py``); without a
lock, a cold key asked of two workers at once costs two origin requests. The
worker that takes a key's lock fetches it and saves the answer in the store;
a sibling that waited for the lock then reads the store instead of the origin.

The locks are striped (a fixed set, chosen by hash): one byte each of a
single lock file, taken with ``fcntl.lockf`` at its offset, so a cache of
millions of objects has one lock file, not a thousand. Two keys may share a
stripe and briefly wait for each other. A record lock belongs to the process,
not to a descriptor (a second ``lockf`` by the same process succeeds at once,
and one unlock ends both), so tasks of this process first queue on an
``asyncio.Lock`` per stripe, and only the one holding it holds the byte.

The holder writes what it learned to the store before it lets go (a
sibling waiting for the lock reads it next); that is the caller's part. Then
it adds one to the stripe's *version* (``bump``), a byte of the same file past
the locks: a worker that found a key absent and reads it again (a cold GET
reads the store on the hit path, then under the lock) asks SQLite only if the
version moved in between, since only a holder's write could have added the
row (``MetadataStore.load_now``). The byte wraps at 256, far more fetches of
one stripe than fit between two reads of one request.

Not guaranteed: fairness between processes (a waiting process polls the
byte every 2 ms, a task of the holding process may take it first).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

Scope = tuple[str, str]
_STRIPES = 1 << 16  # stripes per kind: byte offsets of one lock file, so no file each
_KINDS = {"meta": 0, "list": 1, "page": 2}  # a HEAD, a directory walk, a shared origin page
_VERSIONS = len(_KINDS) * _STRIPES  # where the "meta" stripes' version bytes start
_POLL = 0.002  # seconds between tries of a byte a sibling process holds


class FetchLocks:
    """The striped locks of one lock file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        # Stripes this process's tasks hold or await: the lock and how many use it.
        self._stripes: dict[int, tuple[asyncio.Lock, list[int]]] = {}

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    def close(self) -> None:
        """Close the file: every byte this process held opens."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def offset(scope: Scope, key: str, kind: str = "meta") -> int:
        """The byte of the lock file that ``hold(scope, key, kind)`` locks."""
        digest = zlib.crc32("\0".join((*scope, key)).encode("utf-8", "surrogatepass"))
        return _KINDS[kind] * _STRIPES + digest % _STRIPES

    def version(self, scope: Scope, key: str) -> int:
        """How many times (mod 256) holders of ``key``'s "meta" stripe wrote a row for
        siblings (``bump``); always 0 for one worker (no lock file)."""
        if self._fd is None:
            return 0
        found = os.pread(self._fd, 1, _VERSIONS + self.offset(scope, key))
        return found[0] if found else 0

    def bump(self, scope: Scope, key: str) -> None:
        """Tell siblings a row of ``key``'s stripe was written: while holding its lock."""
        if self._fd is not None:
            version = (self.version(scope, key) + 1) % 256
            os.pwrite(self._fd, bytes((version,)), _VERSIONS + self.offset(scope, key))

    @contextlib.asynccontextmanager
    async def hold(self, scope: Scope, key: str, kind: str = "meta") -> AsyncIterator[bool]:
        """Hold ``key``'s stripe of ``kind``; yields whether it was taken when asked
        (another task or process held it)."""
        if self._fd is None:
            yield False
            return
        stripe = self.offset(scope, key, kind)
        local, users = self._stripes.setdefault(stripe, (asyncio.Lock(), [0]))
        users[0] += 1
        waited = local.locked()
        try:
            await local.acquire()
        except BaseException:
            self._leave(stripe, users)
            raise
        try:
            waited = await self._take_byte(stripe) or waited
        except BaseException:
            local.release()
            self._leave(stripe, users)
            raise
        try:
            yield waited
        finally:
            self._unlock(stripe, local, users)

    async def _take_byte(self, stripe: int) -> bool:
        """Lock the stripe's byte of the file; whether another process held it first."""
        assert self._fd is not None
        waited = False
        while True:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, stripe)
                return waited
            except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held
                waited = True
                await asyncio.sleep(_POLL)

    def _unlock(self, stripe: int, local: asyncio.Lock, users: list[int]) -> None:
        assert self._fd is not None
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, stripe)
        local.release()
        self._leave(stripe, users)

    def _leave(self, stripe: int, users: list[int]) -> None:
        users[0] -= 1
        if not users[0]:
            del self._stripes[stripe]
