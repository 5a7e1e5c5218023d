"""The segments one process holds open: one descriptor each, shared by every hit.

A packed hit is a ``sendfile`` from its segment's descriptor, so the
descriptor is opened once per process and kept (``segment_files.Segment``,
counted by the responses using it). This table holds them by segment name:
opened on the loop when a hit may not wait (a local file: as cheap as the
claims made there), or in a thread; closed when the segment is dropped (by
its last user, never under a response still sending from it); and swept for
segments a sibling worker unlinked.

``disk_packed.py`` decides when a segment is dropped; this module only keeps
the descriptors.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gateway.cache.segment_files import Segment

_FLAGS = os.O_RDONLY | os.O_CLOEXEC


class KeptSegments:
    """Segment descriptors of this process, by segment name."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._open: dict[str, Segment] = {}

    def get(self, name: str) -> Segment | None:
        return self._open.get(name)

    def names(self) -> list[str]:
        return list(self._open)

    def open_now(self, name: str) -> Segment | None:
        """The segment opened on the loop; None if it is gone, or cannot be opened here
        (``open`` tells)."""
        try:
            fd = os.open(self._directory / name, _FLAGS)
        except OSError:
            return None
        segment = self._open[name] = Segment(fd)
        return segment

    async def open(self, name: str) -> Segment | None:
        """The segment opened in a thread; None if it is gone."""
        try:
            fd = await asyncio.to_thread(os.open, self._directory / name, _FLAGS)
        except FileNotFoundError:
            return None
        if name in self._open:  # opened meanwhile by a concurrent hit
            os.close(fd)
            return self._open[name]
        segment = self._open[name] = Segment(fd)
        return segment

    def close(self, name: str) -> None:
        """Stop keeping the segment; its descriptor closes with its last user."""
        segment = self._open.pop(name, None)
        if segment is not None:
            segment.kept = False
            if segment.users == 0:
                os.close(segment.fd)

    def unlinked(self) -> list[str]:
        """The segments whose file is gone (unlinked by a sibling worker, or unreadable)."""
        gone = []
        for name, segment in self._open.items():
            try:
                unlinked = os.fstat(segment.fd).st_nlink == 0
            except OSError:
                unlinked = True
            if unlinked:
                gone.append(name)
        return gone
