"""The backlog of invalidations a peer missed: bounded, deduplicated, taken once."""

from __future__ import annotations

from gateway.cluster.backlog import Backlog
from gateway.core.invalidation import Invalidation

B, C = "http://10.0.0.2:9000", "http://10.0.0.3:9000"


def _items(*keys: str) -> list[Invalidation]:
    return [Invalidation("aws", "data", key=key) for key in keys]


def test_missed_items_are_kept_per_peer_deduplicated_and_taken_once():
    backlog = Backlog()
    backlog.add(B, _items("a", "b"))
    backlog.add(B, _items("b", "c"))
    backlog.add(C, _items("z"))
    assert B in backlog and len(backlog) == 2
    assert backlog.take(B) == (_items("a", "b", "c"), False)
    assert B not in backlog and backlog.take(B) == ([], False)
    assert C in backlog


def test_overflow_turns_into_drop_everything_until_taken():
    backlog = Backlog(limit=3)
    backlog.add(B, _items("a", "b", "c", "d"))
    backlog.add(B, _items("e"))  # after an overflow, listing more is pointless
    assert backlog.take(B) == ([], True)
    backlog.add(B, _items("a"))
    assert backlog.take(B) == (_items("a"), False)


def test_a_failed_delivery_goes_back_and_removed_peers_are_forgotten():
    backlog = Backlog()
    backlog.add(B, _items("a"))
    backlog.add(C, [], drop_all=True)
    items, drop_all = backlog.take(B)
    backlog.add(B, items, drop_all)  # delivery failed
    assert backlog.take(B) == (_items("a"), False)
    backlog.add(B, _items("a"))
    backlog.keep_only([B])
    assert B in backlog and C not in backlog
