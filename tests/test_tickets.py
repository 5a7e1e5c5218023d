"""A hit's lookups kept per key (gateway/read/tickets.py), over a real MetadataCache.

A ticket is good exactly while the lookups it stands for would find the same
answer fresh: used, it marks and counts the metadata as a hit; any new answer
stored for the key (a refresh, a write, an invalidation, an eviction) voids
it, and so does the answer going stale. A fake clock moves time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from gateway.metadata.memory import MetadataCache
from gateway.metadata.source import policy_of, scope_of
from gateway.origins.base import ObjectInfo
from gateway.origins.namespace import Mount
from gateway.read.first_block import block_ref
from gateway.read.tickets import Tickets
from tests.fakes import Clock

T0 = datetime(2024, 1, 1, tzinfo=UTC)
MOUNT = Mount("data", SimpleNamespace(name="o"), "origin-bucket", prefix="p/",  # type: ignore[arg-type]
              metadata_ttl=60, label="m0")  # fmt: skip


def info(etag: str = '"1"') -> ObjectInfo:
    return ObjectInfo(key="p/k", size=10, etag=etag, last_modified=T0)


def held(
    clock: Clock, limit: int = Tickets.LIMIT
) -> tuple[MetadataCache, Tickets, list[tuple[str, str, str]]]:
    """A table holding ``p/k`` fresh, with a ticket for it (as ``Reader.held_now`` makes
    one), and the lookups counted from then on."""
    events: list[tuple[str, str, str]] = []
    cache = MetadataCache(clock=clock, on_event=lambda *event: events.append(event))
    cache.put_head(scope_of(MOUNT), "p/k", info(), policy_of(MOUNT))
    entry = cache.known_entry(scope_of(MOUNT), "p/k")
    assert entry is not None
    tickets = Tickets(cache, limit)
    ref = block_ref(MOUNT, "p/k", entry.value, 0, 1 << 20)
    client = ObjectInfo(key="k", size=10, etag='"1"', last_modified=T0)
    tickets.keep("data", "k", (MOUNT, "p/k", entry.value, entry), ref, client)
    return cache, tickets, events


def test_a_ticket_stands_for_the_lookups_while_they_hold() -> None:
    clock = Clock()
    _, tickets, events = held(clock)
    for _ in range(3):
        ticket = tickets.valid("data", "k")
        assert ticket is not None and ticket.info.key == "k" and ticket.ref.block.index == 0
        tickets.used(ticket)
    assert events == [("head", "hit", "m0", 1)] * 3  # counted as the lookups count a hit
    assert tickets.valid("data", "other") is None


def test_any_new_answer_for_the_key_voids_its_ticket() -> None:
    clock = Clock()
    cache, tickets, _ = held(clock)
    cache.put_head(scope_of(MOUNT), "p/k", info('"2"'), policy_of(MOUNT))  # a write, a refresh
    assert tickets.valid("data", "k") is None
    assert len(tickets) == 0  # thrown away, not kept to be checked again

    cache, tickets, _ = held(clock)
    cache.put_head(scope_of(MOUNT), "p/k", info(), policy_of(MOUNT))  # the same answer, anew
    assert tickets.valid("data", "k") is None

    cache, tickets, _ = held(clock)
    cache.invalidate_key(scope_of(MOUNT), "p/k")  # a sibling's write, caught up
    assert tickets.valid("data", "k") is None


def test_a_stale_answer_voids_its_ticket() -> None:
    clock = Clock()
    _, tickets, events = held(clock)
    clock.advance(59)
    assert tickets.valid("data", "k") is not None
    clock.advance(1)  # the TTL is up: the lookups would refresh, so the ticket is void
    assert tickets.valid("data", "k") is None
    assert events == []  # nothing counted until a ticket answers (``used``)


def test_tickets_are_a_bounded_hot_set() -> None:
    clock = Clock()
    cache, tickets, _ = held(clock, limit=2)
    entry = cache.known_entry(scope_of(MOUNT), "p/k")
    assert entry is not None
    ref = block_ref(MOUNT, "p/k", entry.value, 0, 1 << 20)
    known = (MOUNT, "p/k", entry.value, entry)
    for key in ("a", "b"):
        tickets.keep("data", key, known, ref, entry.value)
    assert len(tickets) == 2
    # Full: "b" is turned away at its first sight (``core/hot_sets.py``'s doorkeeper),
    # taken in at its second, and the oldest goes first.
    assert tickets.valid("data", "b") is None and tickets.valid("data", "k") is not None
    tickets.keep("data", "b", known, ref, entry.value)
    assert len(tickets) == 2
    assert tickets.valid("data", "k") is None
    assert tickets.valid("data", "b") is not None
