"""A packed record lent again through a read's ticket, without its lookup: a lease.

A hit on a packed block (``disk_packed.py``) finds the block's place (in this
process's map, or the index), the segment's kept descriptor, the file's
``fstat``, the record's check for that fingerprint (``segment_trust.py``),
then lends the descriptor and marks the segment used: a dozen Python calls a
hit, most of a 128 KiB repeat's work in Python. A read's ticket
(``read/tickets.py``) whose object is one packed record keeps a *lease*: what
that lookup found, and the fingerprint the record was lent under. A repeat
through the ticket then asks only what can have changed since:

- the segment is still kept by this process (not dropped: evicted, found
  unlinked, or closed), so its descriptor is open and is the lease's;
- the block's place is still the lease's (not forgotten: the block evicted,
  or its place pushed out of the map);
- the file is still linked, still long enough, and shows the fingerprint the
  record was lent under (bytes changed in place are checked again, by the
  lookup, before they are lent).

Anything else is None, and the lookup decides as before (and checks, and
drops what is damaged). What a lease lends, it lends as the lookup does: one
more user of the segment's descriptor (``PackedFile``), the segment marked
used among the disk tier's touches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from gateway.cache import segment_files
from gateway.cache.block import HEADER_SIZE
from gateway.cache.segment_files import Fingerprint, PackedFile, Segment
from gateway.cache.segment_sql import Place


class Lease:
    """One packed record, lendable again while nothing it was lent under has changed."""

    __slots__ = ("_digest", "_end", "_fingerprint", "_place", "_places", "_segment",
                 "_touched", "_touched_as")  # fmt: skip

    def __init__(
        self, digest: str, place: Place, segment: Segment, fingerprint: Fingerprint,
        places: Mapping[str, Place | bool], touched: dict[str, float],
        touched_as: dict[str, str],
    ) -> None:  # fmt: skip
        """``places``: the live map of places (``Places.live``); ``touched`` and
        ``touched_as``: the disk tier's hits to write and who stands for a segment."""
        self._digest = digest
        self._place = place
        self._end = place.offset + HEADER_SIZE + place.length
        self._segment = segment
        self._fingerprint = fingerprint
        self._places = places
        self._touched = touched
        self._touched_as = touched_as

    def again(self) -> PackedFile | None:
        """The record lent again (the caller closes it), or None: the lookup decides."""
        segment, place = self._segment, self._place
        if not segment.kept or self._places.get(self._digest) is not place:
            return None
        try:
            stat = os.fstat(segment.fd)
        except OSError:
            return None
        if stat.st_nlink == 0 or stat.st_size < self._end:
            return None
        # (``segment_files.fingerprint``, spelled out: a call fewer a hit)
        if (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns) != self._fingerprint:
            return None
        # (``DiskTier._touch_packed``, spelled out: a call fewer a hit)
        self._touched[self._touched_as.setdefault(place.segment, self._digest)] = time.time()
        return segment_files.lend(segment, place)
