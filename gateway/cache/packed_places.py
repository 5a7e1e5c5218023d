"""Where this process last saw each block: a bounded map from digest to its place, by segment too.

A hit on a packed block must not ask the index each time, so ``disk_packed.py``
remembers each block's place (its segment, offset, length and checksum; or True
for a block with its own file) for the most recently used ``limit`` blocks.

When a segment goes (evicted, unlinked by a sibling, found deleted), every
place in it must be forgotten at once. Found by scanning the whole map, that
was one pass over up to 262,144 entries on the event loop for each segment
dropped: 30-110 ms measured on this machine, at every segment an eviction took.
So each segment keeps the set of its digests here, and dropping one costs as
many steps as it had blocks remembered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from gateway.cache.segment_sql import Place


class Places:
    """digest -> Place (a packed block) or True (its own file), least recently used first out."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._places: OrderedDict[str, Place | bool] = OrderedDict()
        self._by_segment: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._places)

    def get(self, digest: str) -> Place | bool | None:
        return self._places.get(digest)

    @property
    def live(self) -> Mapping[str, Place | bool]:
        """The map itself, as it changes (a lease's check: ``segment_leases.py``)."""
        return self._places

    def remember(self, digest: str, place: Place | bool) -> None:
        """``place`` is where ``digest`` is now, and the most recently used."""
        self._unlink(digest, self._places.get(digest))
        self._places[digest] = place
        self._places.move_to_end(digest)
        if isinstance(place, Place):
            self._by_segment.setdefault(place.segment, set()).add(digest)
        if len(self._places) > self._limit:
            oldest, gone = self._places.popitem(last=False)
            self._unlink(oldest, gone)

    def forget(self, digest: str) -> None:
        self._unlink(digest, self._places.pop(digest, None))

    def forget_segment(self, name: str) -> None:
        """Every place in segment ``name``."""
        for digest in self._by_segment.pop(name, ()):
            self._places.pop(digest, None)

    def _unlink(self, digest: str, place: Place | bool | None) -> None:
        if not isinstance(place, Place):
            return
        members = self._by_segment.get(place.segment)
        if members is not None:
            members.discard(digest)
            if not members:
                del self._by_segment[place.segment]
