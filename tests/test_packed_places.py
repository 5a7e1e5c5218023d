"""The places a worker remembers for packed blocks: bounded, and forgotten a segment at a time."""

from __future__ import annotations

from gateway.cache.packed_places import Places
from gateway.cache.segment_sql import Place


def _place(segment: str, offset: int = 0) -> Place:
    return Place(segment, offset, 4096, 0)


def test_dropping_a_segment_forgets_its_places_and_no_other() -> None:
    places = Places(limit=100)
    places.remember("a", _place("s1"))
    places.remember("b", _place("s1", 4200))
    places.remember("c", _place("s2"))
    places.remember("d", True)  # a block with its own file
    places.forget_segment("s1")
    assert places.get("a") is None and places.get("b") is None
    assert places.get("c") == _place("s2")
    assert places.get("d") is True
    assert len(places) == 2


def test_a_block_appended_again_belongs_to_its_new_segment_only() -> None:
    places = Places(limit=100)
    places.remember("a", _place("old"))
    places.remember("a", _place("new"))  # refilled into another segment
    places.forget_segment("old")
    assert places.get("a") == _place("new")
    places.forget_segment("new")
    assert places.get("a") is None


def test_the_least_recently_used_place_goes_first_and_leaves_its_segment() -> None:
    places = Places(limit=2)
    places.remember("a", _place("s1"))
    places.remember("b", _place("s1", 4200))
    places.get("a")
    places.remember("a", _place("s1"))  # used again: now the most recent
    places.remember("c", _place("s2"))  # over the limit: "b" goes
    assert places.get("b") is None and len(places) == 2
    places.forget("a")
    places.forget_segment("s1")  # nothing left of s1; "c" stays
    assert places.get("c") == _place("s2") and len(places) == 1
    assert places._by_segment == {"s2": {"c"}}
