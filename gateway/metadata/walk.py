"""A whole listing being walked, and the pages its keys so far already settle.

A cold ``ListObjectsV2`` of a prefix of a million keys walks the whole prefix
(a thousand origin pages) before the metadata cache holds it, and a client
asking for the first page used to wait for all of it: a minute at the
origin's pace for a page that the first origin page already answers.

The walk reads the prefix in key order, into a ``SnapshotBuilder``. A page
``(prefix, delimiter, start_after, max_keys)`` is *settled* by the keys so far
when its items and one item after them have arrived (it is truncated, and a
later key can only sort after all of it), or when the walk has passed the
end of the page's prefix (nothing more can join it). A settled page is what
the finished snapshot would answer, byte for byte, and it is as old (learned
when the walk began); so it may be answered at once, while the walk goes on
for the callers who need more (``MetadataCache._join``).

NOT guaranteed: a page needing the walk's last key (a prefix's last page, or a
``start_after`` near its end) waits for the whole walk, as before. A prefix
too big to hold whole stops its walk early; pages it settled stand, the rest
are asked of the origin page by page.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.metadata.snapshot import SnapshotBuilder
from gateway.origins.base import ListPage
from gateway.origins.listing import paginate

# A page settled by a walk's keys so far (``settled_page``), or None.
Early = Callable[[SnapshotBuilder], ListPage | None]


class Walk:
    """A whole listing being walked: what has arrived so far, and ``growth``, a future
    done when more arrives (then replaced)."""

    def __init__(self, builder: SnapshotBuilder) -> None:
        self.builder = builder
        self.growth: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def grown(self) -> None:
        self.growth.set_result(None)
        self.growth = asyncio.get_running_loop().create_future()


def settled_page(query: tuple[str, str, str, int], so_far: SnapshotBuilder) -> ListPage | None:
    """The page of ``query`` if the keys walked so far settle it, else ``None``.

    Settled: the page and one more item have arrived (so it is truncated, and no
    later key can change it), or the walk is past the query's prefix.
    """
    prefix, delimiter, start_after, max_keys = query
    if not so_far.sizes:
        return None
    view = so_far.so_far()
    ahead = paginate(view, prefix, delimiter, start_after, max(0, max_keys) + 1)
    last = view.keys[len(view) - 1]
    past = last > prefix and not last.startswith(prefix)
    if not past and max_keys > 0 and len(ahead.entries) + len(ahead.common_prefixes) <= max_keys:
        return None
    return paginate(view, prefix, delimiter, start_after, max_keys)
