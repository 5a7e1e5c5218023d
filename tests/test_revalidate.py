"""Bulk revalidation (gateway/metadata/revalidate.py) over the real memory cache.

The listing and HEAD callables stand in for the origin, as in test_metadata_cache.py;
the end-to-end proof with moto, counted requests and workers is
tests/test_bulk_revalidation.py.
"""

from __future__ import annotations

import logging

import pytest

from gateway.core.errors import OriginUnavailable
from gateway.metadata.memory import Aged, MetadataCache
from gateway.metadata.revalidate import Revalidator
from gateway.origins.base import ListEntry
from tests.fakes import Clock
from tests.test_metadata_cache import POLICY, SCOPE, T0, Fetch, Lister, info


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def outcomes() -> list[str]:
    return []


@pytest.fixture
def revalidator(clock: Clock, outcomes: list[str]) -> Revalidator:
    async def no_store(scope: object, key: str) -> None:
        return None

    cache = MetadataCache(
        clock=clock, whole_listing_bytes=100_000
    )  # ~650 keys with ETags like these
    return Revalidator(cache, None, no_store, lambda outcome, mount: outcomes.append(outcome))


def lister(*entries: ListEntry) -> Lister:
    listed = Lister([])
    listed.entries = sorted(entries, key=lambda e: e.key)
    return listed


async def test_an_unchanged_object_is_confirmed_by_its_directory_listing(
    revalidator: Revalidator, clock: Clock, outcomes: list[str]
) -> None:
    known = info("d/k", etag='"1"')
    pages = lister(ListEntry("d/k", 1, '"1"', T0), ListEntry("d/other", 1, '"9"', T0))
    head = Fetch(info("d/k"))
    learned = clock.now
    clock.advance(70)

    answers = [
        await revalidator.known(SCOPE, "d/k", known, learned, POLICY, pages, head) for _ in range(3)
    ]

    assert answers == [Aged(known, 0.0)] * 3
    assert head.calls == 0 and len(pages.calls) == 1  # one listing for the directory
    assert pages.calls[0][0] == "d/" and outcomes == ["confirmed"] * 3


@pytest.mark.parametrize(
    ("listed", "outcome"),
    [
        ([ListEntry("d/k", 1, '"2"', T0)], "changed"),
        ([ListEntry("d/k", 2, '"1"', T0)], "changed"),
        ([ListEntry("d/j", 1, '"1"', T0)], "unlisted"),
    ],
)
async def test_a_listing_that_disagrees_costs_one_head(
    revalidator: Revalidator, clock: Clock, outcomes: list[str], listed, outcome
) -> None:
    head = Fetch(info("d/k", etag='"2"'))
    answer = await revalidator.known(
        SCOPE, "d/k", info("d/k", etag='"1"'), clock.now, POLICY, lister(*listed), head
    )
    assert answer == info("d/k", etag='"2"') and head.calls == 1 and outcomes == [outcome]


async def test_a_directory_too_big_to_hold_whole_falls_back_to_head(
    revalidator: Revalidator, clock: Clock, outcomes: list[str]
) -> None:
    pages = lister(*(ListEntry(f"big/{i:05d}", 1, '"1"', T0) for i in range(2500)))
    head = Fetch(info("big/00001"))
    await revalidator.known(SCOPE, "big/00001", info("big/00001"), clock.now, POLICY, pages, head)
    assert head.calls == 1 and outcomes == ["too_big"]


async def test_a_failing_listing_falls_back_to_head_and_is_logged_once(
    revalidator: Revalidator, clock: Clock, outcomes: list[str], caplog
) -> None:
    pages = lister()
    pages.error = OriginUnavailable("listing refused")
    head = Fetch(info("d/k"))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            await revalidator.known(SCOPE, "d/k", info("d/k"), clock.now, POLICY, pages, head)
    assert head.calls == 3 and outcomes == ["list_failed"] * 3
    assert sum("bulk revalidation failed" in r.message for r in caplog.records) == 1


async def test_a_key_at_the_top_lists_the_bucket_root(
    revalidator: Revalidator, clock: Clock
) -> None:
    pages = lister(ListEntry("k", 1, '"1"', T0))
    await revalidator.known(SCOPE, "k", info("k"), clock.now, POLICY, pages, Fetch(info("k")))
    assert pages.calls[0][0] == ""
