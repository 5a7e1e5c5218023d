"""A file every worker of a node maps: created, checked and mapped under one ``flock``.

The node's invalidation journal (``metadata/journal.py``) and the prefetch
registry (``prefetch/registry.py``) are fixed-size files that each worker maps
and changes under an exclusive ``flock`` on the file. Opening one is the same
for both: under the lock, a file that is not its size or does not begin with its
magic bytes (new, or left damaged by a crash while it was being created) is
emptied, grown sparse to its size and given a fresh header by its owner before
any worker maps it. Closing unmaps it and closes the descriptor.

Not thread-safe: ``flock`` is per open file, so one process holds one of these
per file and uses it from one thread.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class MappedFile:
    """The descriptor and the mapping of one node-shared file (``_fd``, ``_map``)."""

    def __init__(self) -> None:
        self._fd = -1
        self._map: mmap.mmap | None = None

    def _open_mapped(self, path: Path, size: int, magic: bytes, fresh: Callable[[], None]) -> None:
        """Map ``path``, first (re)creating it when damaged: ``fresh()`` writes the new
        header (through ``_fd``, under the lock) before anyone maps it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._locked():
            if os.fstat(self._fd).st_size != size or os.pread(self._fd, len(magic), 0) != magic:
                os.ftruncate(self._fd, 0)
                os.ftruncate(self._fd, size)  # sparse: only written parts take disk
                fresh()
            self._map = mmap.mmap(self._fd, size)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @contextmanager
    def _locked(self, how: int = fcntl.LOCK_EX) -> Iterator[None]:
        fcntl.flock(self._fd, how)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
