"""Rendered listing pages, kept as bytes per (snapshot version, query).

A herd of data-loader workers pages the same prefix the same way: a thousand
clients asking for the same thousand-key page of ImageNet's ``train/``. With a
whole listing cached, each page is still paginated out of the snapshot and
rendered as XML per request (1-2 ms of the server's one core for a thousand
keys, more with a delimiter). nginx pays for a stored page what it costs to
send it; so should Hoard: the first request for a page renders it, the next
ones get the same bytes.

A body is keyed by the snapshot it was rendered from (its ``version``, a
number its cache never gives twice) and everything else the body depends on
(the page's prefix, delimiter, marker and size in origin terms, and the
caller's own *variant*: API version, bucket name, encoding, echoed
parameters). A body is therefore never served for another snapshot: a
refreshed or invalidated listing is a new version, and the old version's
bodies are dropped with it (``drop``) or, at worst, never asked for again and
evicted. Least recently used bodies go first beyond ``limit`` bytes.

NOT guaranteed: not thread-safe; bodies of pages cached page by page (a prefix
too big for one snapshot) are not kept (those pages have no version).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Hashable

_SLOT = 200  # a body's key tuple, its dict slots and the version's index entry


class PageBodies:
    """Rendered page bodies by (version, query), LRU, at most ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.weight = 0
        self._bodies: OrderedDict[tuple[int, Hashable], bytes] = OrderedDict()
        self._queries: dict[int, set[Hashable]] = {}  # version -> its bodies' queries

    def __len__(self) -> int:
        return len(self._bodies)

    def get(self, version: int, query: Hashable) -> bytes | None:
        """The body rendered for ``query`` from snapshot ``version``, marked recently used."""
        body = self._bodies.get((version, query))
        if body is not None:
            self._bodies.move_to_end((version, query))
        return body

    def put(self, version: int, query: Hashable, body: bytes) -> None:
        """Keep ``body`` unless it alone exceeds the limit; evict the oldest beyond it."""
        if _weigh(body) > self.limit:
            return
        self._pop((version, query))
        self._bodies[version, query] = body
        self._queries.setdefault(version, set()).add(query)
        self.weight += _weigh(body)
        while self.weight > self.limit:
            self._pop(next(iter(self._bodies)))

    def drop(self, version: int) -> None:
        """Forget every body rendered from snapshot ``version`` (it was replaced or dropped)."""
        for query in list(self._queries.get(version, ())):
            self._pop((version, query))

    def _pop(self, k: tuple[int, Hashable]) -> None:
        body = self._bodies.pop(k, None)
        if body is None:
            return
        self.weight -= _weigh(body)
        queries = self._queries[k[0]]
        queries.discard(k[1])
        if not queries:
            del self._queries[k[0]]


def _weigh(body: bytes) -> int:
    return sys.getsizeof(body) + _SLOT
