"""What a write makes stale: one key, or every key under a prefix, of one origin bucket.

A value type with no imports above it, shared by the write path, the node's
invalidation journal (``metadata/journal.py``: sibling workers) and the cluster
(``cluster/peers.py``: other nodes), so none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Invalidation:
    """One key, or every key under a prefix ("" is the whole bucket), to drop."""

    origin: str
    bucket: str
    key: str | None = None
    prefix: str | None = None

    def __post_init__(self) -> None:
        if (self.key is None) == (self.prefix is None):
            raise ValueError("an invalidation names a key or a prefix, not both or neither")
        optional = [v for v in (self.key, self.prefix) if v is not None]
        if not all(isinstance(v, str) for v in (self.origin, self.bucket, *optional)):
            raise TypeError("the fields of an invalidation are strings")

    @property
    def scope(self) -> tuple[str, str]:
        return (self.origin, self.bucket)


# Tells every other live node of a cluster to drop these, waiting a bounded time.
Broadcast = Callable[[list[Invalidation]], Awaitable[None]]
