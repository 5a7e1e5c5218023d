"""Watches: whether a key was invalidated since someone started looking.

A write-through (``gateway/write/through.py``) caches an upload's bytes after
the origin acknowledged it, in the background; a later write of the same key
(in this worker or a sibling) must stop it from storing what that write made
stale. The invalidator tells this registry of every change it applies
(``changed``, ``all_changed``), and the write-through asks its ``Watch``
right before each store.

A ``Watch`` is what a per-key generation counter would tell ("bumped since I
looked?"), kept only for keys someone watches: bounded by the write-throughs
in flight, not by every key ever written.
"""

from __future__ import annotations

WatchKey = tuple[str, str, str]  # (origin, origin bucket, origin key)


class Watch:
    """Whether a key was invalidated since watching began (``changed``); ``close()`` when done."""

    __slots__ = ("_registry", "changed", "key")

    def __init__(self, key: WatchKey, registry: dict[WatchKey, set[Watch]]) -> None:
        self.key = key
        self.changed = False
        self._registry = registry
        registry.setdefault(key, set()).add(self)

    def close(self) -> None:
        watching = self._registry.get(self.key)
        if watching is not None:
            watching.discard(self)
            if not watching:
                del self._registry[self.key]


class Watches:
    """The keys watched in this worker, told of every change the invalidator applies."""

    def __init__(self) -> None:
        self._watching: dict[WatchKey, set[Watch]] = {}

    def watch(self, scope: tuple[str, str], okey: str) -> Watch:
        """Start noticing invalidations of ``okey`` in ``scope`` (origin, origin bucket)."""
        return Watch((*scope, okey), self._watching)

    def changed(self, scope: tuple[str, str], okey: str, *, prefix: bool = False) -> None:
        """Tell every watch on ``okey`` (or, with ``prefix``, under it) that it changed."""
        if prefix:
            found = [w for k, ws in self._watching.items() if k[:2] == scope and
                     k[2].startswith(okey) for w in ws]  # fmt: skip
        else:
            found = list(self._watching.get((*scope, okey), ()))
        for watch in found:
            watch.changed = True

    def all_changed(self) -> None:
        for watches in self._watching.values():
            for watch in watches:
                watch.changed = True
