"""A metadata question one node asks the owner of a key: a HEAD, or a LIST page.

The value lives with the metadata it asks about, so the metadata tiers can
name it without knowing the cluster's wire; how it travels (its URL form) is
``cluster/peers.py``'s (``metadata_target``, ``parse_metadata_query``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetadataQuery:
    """A HEAD (``key``) or a LIST page (``key`` is the prefix) asked of its owner.

    ``ttl`` and ``negative_ttl`` are the asking node's mount policy, so the owner
    caches the answer as the asker would (``inf``: forever).
    """

    kind: str  # "head" | "list"
    origin: str
    bucket: str
    key: str
    ttl: float
    negative_ttl: float
    delimiter: str = ""
    start_after: str = ""
    max_keys: int = 1000

    def __post_init__(self) -> None:
        if self.kind not in ("head", "list") or self.max_keys < 1:
            raise ValueError(f"bad metadata query {self}")
        if not (self.ttl >= 0 and self.negative_ttl >= 0):  # also refuses NaN
            raise ValueError(f"bad metadata query {self}")
