"""Invalidations a peer missed, kept by the node that broadcast them until it is back.

A write's broadcast skips a peer that is down or does not answer in time; that
peer (or its restarted process, which reloads metadata from its disk store) would
then serve the old metadata until the TTL ran out, forever with ``forever``. So
the sending node remembers, per peer, what that peer missed and delivers it when
the peer answers a probe again (sender-side replay). Bounded: past ``limit``
items for one peer the list is dropped and the peer is told instead to drop its
whole metadata cache, which costs it refetches, never a wrong answer.

Not thread-safe (one event loop). Items are deduplicated, unordered: an
invalidation is an idempotent drop, so order does not matter.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.core.invalidation import Invalidation


class Backlog:
    """Per peer URL: the invalidations it missed, or "drop everything" after an overflow."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._missed: dict[str, dict[Invalidation, None]] = {}  # an ordered set per peer
        self._overflowed: set[str] = set()

    def __contains__(self, url: str) -> bool:
        return url in self._missed or url in self._overflowed

    def __len__(self) -> int:
        """Peers with something to deliver."""
        return len(self._missed.keys() | self._overflowed)

    def add(self, url: str, items: Iterable[Invalidation], drop_all: bool = False) -> None:
        """``url`` missed ``items`` (or, with ``drop_all``, more than can be listed)."""
        if drop_all or url in self._overflowed:
            self._overflow(url)
            return
        missed = self._missed.setdefault(url, {})
        missed.update(dict.fromkeys(items))
        if len(missed) > self.limit:
            self._overflow(url)

    def take(self, url: str) -> tuple[list[Invalidation], bool]:
        """What ``url`` missed and whether it must drop everything; forgets both
        (``add`` them back if delivery fails)."""
        drop_all = url in self._overflowed
        self._overflowed.discard(url)
        return list(self._missed.pop(url, {})), drop_all

    def keep_only(self, urls: Iterable[str]) -> None:
        """Forget peers that are no longer members (membership changed)."""
        members = set(urls)
        for url in [u for u in self._missed if u not in members]:
            del self._missed[url]
        self._overflowed &= members

    def _overflow(self, url: str) -> None:
        self._missed.pop(url, None)
        self._overflowed.add(url)
