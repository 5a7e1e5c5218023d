"""MetadataCache: coalescing, TTLs, stale-while-revalidate, stale-if-error, bounds.

A fake clock moves time; counting fetch functions stand in for the origin (the
listing one answers with paginate(), so its pages are S3's), and one test pages
through a real moto bucket with the S3 origin as ``fetch_page``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import uuid
from datetime import UTC, datetime

import pytest

from gateway.config.settings import S3OriginConfig
from gateway.core.errors import NoSuchKey, OriginThrottled, OriginUnavailable
from gateway.metadata.memory import Aged, Lookup, MetadataCache, Policy
from gateway.metadata.snapshot import snapshot
from gateway.origins.base import ListEntry, ListPage, ObjectInfo
from gateway.origins.listing import paginate
from gateway.origins.s3 import S3Origin
from tests.fakes import Clock

T0 = datetime(2024, 1, 1, tzinfo=UTC)
SCOPE = ("aws", "corp-ml-data")
POLICY = Policy(ttl=60, negative_ttl=10)


def info(key: str = "k", etag: str = '"1"') -> ObjectInfo:
    return ObjectInfo(key=key, size=1, etag=etag, last_modified=T0)


def entries(keys: list[str]) -> list[ListEntry]:
    return [ListEntry(key, 1, '"e"', T0) for key in sorted(keys)]


class Fetch:
    """A HEAD at the origin: counts calls, optionally held on ``gate``; ``answer``
    is returned, or raised if it is an exception."""

    def __init__(self, answer: ObjectInfo | Exception) -> None:
        self.answer = answer
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> ObjectInfo:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Lister:
    """ListObjects at the origin, answered by paginate() over ``keys``."""

    def __init__(self, keys: list[str]) -> None:
        self.entries = entries(keys)
        self.calls: list[tuple[str, str, str, int]] = []
        self.gate: asyncio.Event | None = None
        self.error: Exception | None = None

    async def __call__(self, prefix: str, delimiter: str, start_after: str, max_keys: int):
        self.calls.append((prefix, delimiter, start_after, max_keys))
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return paginate(self.entries, prefix, delimiter, start_after, max_keys)


async def settle() -> None:
    """Let background tasks that are ready run to completion (no wall-clock wait)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def held(gate: asyncio.Event, coros: list) -> list:
    """Start every call, let each reach the origin's gate, then open it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    await settle()
    gate.set()
    return await asyncio.gather(*tasks)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def events() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def cache(clock: Clock, events: list[tuple[str, str]]) -> MetadataCache:
    return MetadataCache(
        clock=clock, on_event=lambda kind, state, _mount, _times: events.append((kind, state))
    )


def listing(cache: MetadataCache, lister: Lister, prefix: str = "", delimiter: str = "",
            start_after: str = "", max_keys: int = 1000, policy: Policy = POLICY):  # fmt: skip
    return cache.listing(SCOPE, prefix, delimiter, start_after, max_keys, policy, lister)


# --- HEAD --------------------------------------------------------------------


async def test_concurrent_identical_head_misses_share_one_fetch(cache: MetadataCache) -> None:
    fetch = Fetch(info())
    fetch.gate = asyncio.Event()

    results = await held(fetch.gate, [cache.head(SCOPE, "k", POLICY, fetch) for _ in range(64)])

    assert fetch.calls == 1
    assert {r.state for r in results} == {"miss"} and all(r.value == info() for r in results)
    assert cache.stats()["misses"] == 64 and cache.stats()["heads"] == 1


async def test_concurrent_misses_all_get_the_fetch_error(cache: MetadataCache) -> None:
    fetch = Fetch(OriginUnavailable("down"))
    fetch.gate = asyncio.Event()
    tasks = [asyncio.ensure_future(cache.head(SCOPE, "k", POLICY, fetch)) for _ in range(64)]
    await settle()
    fetch.gate.set()

    results = await asyncio.gather(*tasks, return_exceptions=True)

    assert fetch.calls == 1
    assert all(isinstance(r, OriginUnavailable) for r in results)


async def test_a_cancelled_caller_does_not_cancel_the_shared_fetch(cache: MetadataCache) -> None:
    fetch = Fetch(info())
    fetch.gate = asyncio.Event()
    first = asyncio.ensure_future(cache.head(SCOPE, "k", POLICY, fetch))
    second = asyncio.ensure_future(cache.head(SCOPE, "k", POLICY, fetch))
    await settle()
    first.cancel()
    fetch.gate.set()

    assert (await second).value == info()
    assert first.cancelled() and fetch.calls == 1


async def test_hit_within_ttl_does_not_fetch(cache: MetadataCache, clock: Clock) -> None:
    fetch = Fetch(info())
    await cache.head(SCOPE, "k", POLICY, fetch)
    clock.advance(59.9)

    hit = await cache.head(SCOPE, "k", POLICY, fetch)

    assert hit == Lookup(info(), "hit") and fetch.calls == 1
    assert cache.stats()["hits"] == 1


async def test_an_answer_from_a_slower_tier_keeps_its_age(
    cache: MetadataCache, clock: Clock
) -> None:
    """The TTL rule: an entry the node's store learned 50 s ago, in a 60 s TTL, is
    revalidated 10 s after it reached memory, not 60: no tier restarts the clock."""

    async def from_store() -> Aged:
        return Aged(info(etag='"1"'), age=50.0)

    await cache.head(SCOPE, "k", POLICY, from_store)
    clock.advance(9.9)
    assert (await cache.head(SCOPE, "k", POLICY, Fetch(info()))).state == "hit"
    clock.advance(0.2)
    refresh = Fetch(info(etag='"2"'))
    assert (await cache.head(SCOPE, "k", POLICY, refresh)).state == "stale"
    await settle()
    assert refresh.calls == 1
    assert (await cache.head(SCOPE, "k", POLICY, refresh)).value.etag == '"2"'


async def test_known_tells_what_is_held_and_when_it_was_learned(
    cache: MetadataCache, clock: Clock
) -> None:
    assert cache.known(SCOPE, "k") is None
    learned_at = clock.now
    await cache.head(SCOPE, "k", POLICY, Fetch(info()))
    clock.advance(100)
    assert cache.known(SCOPE, "k") == (info(), learned_at)  # stale, still known
    with pytest.raises(NoSuchKey):
        await cache.head(SCOPE, "gone", POLICY, Fetch(NoSuchKey("gone")))
    assert cache.known(SCOPE, "gone") is None


async def test_whole_listing_is_one_walk_asked_after_since(
    cache: MetadataCache, clock: Clock
) -> None:
    lister = Lister([f"d/{i}" for i in range(2500)] + ["e/1"])
    lister.gate = asyncio.Event()
    since = clock.now
    results = await held(
        lister.gate, [cache.whole_listing(SCOPE, "d/", since, POLICY, lister) for _ in range(20)]
    )
    assert len(lister.calls) == 3  # 2,500 keys: three origin pages, walked once for all
    assert all(r == results[0] for r in results) and len(results[0][0]) == 2500
    assert results[0][1] == since

    clock.advance(5)
    again = await cache.whole_listing(SCOPE, "d/", since, POLICY, lister)  # still recent enough
    assert again == results[0] and len(lister.calls) == 3
    newer = await cache.whole_listing(SCOPE, "d/", clock.now, POLICY, lister)  # must be newer
    assert newer[1] == clock.now and len(lister.calls) == 6


async def test_whole_listing_of_a_prefix_too_big_is_none(clock: Clock) -> None:
    lister = Lister([f"d/{i}" for i in range(2500)])
    cache = MetadataCache(
        clock=clock, whole_listing_bytes=snapshot("d/", lister.entries[:1000]).nbytes
    )
    assert await cache.whole_listing(SCOPE, "d/", clock.now, POLICY, lister) is None


async def test_scopes_are_separate(cache: MetadataCache) -> None:
    fetch = Fetch(info())
    await cache.head(("a", "b"), "k", POLICY, fetch)
    await cache.head(("a", "c"), "k", POLICY, fetch)
    assert fetch.calls == 2


async def test_expired_entry_is_served_stale_while_one_refresh_runs(
    cache: MetadataCache, clock: Clock, events: list
) -> None:
    fetch = Fetch(info(etag='"1"'))
    await cache.head(SCOPE, "k", POLICY, fetch)
    clock.advance(61)
    fetch.answer, fetch.gate = info(etag='"2"'), asyncio.Event()

    stale = await asyncio.gather(*[cache.head(SCOPE, "k", POLICY, fetch) for _ in range(50)])

    assert {r.state for r in stale} == {"stale"} and {r.value.etag for r in stale} == {'"1"'}
    assert fetch.calls == 2  # the first fill and exactly one refresh
    fetch.gate.set()
    await settle()
    fresh = await cache.head(SCOPE, "k", POLICY, fetch)
    assert fresh == Lookup(info(etag='"2"'), "hit") and fetch.calls == 2
    assert events.count(("head", "stale")) == 50 and cache.stats()["stale"] == 50


async def test_failed_refresh_keeps_the_stale_entry_and_logs(
    cache: MetadataCache, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fetch = Fetch(info())
    await cache.head(SCOPE, "k", POLICY, fetch)
    clock.advance(61)
    fetch.answer = OriginUnavailable("down")

    with caplog.at_level(logging.WARNING, logger="gateway.metadata.memory"):
        first = await cache.head(SCOPE, "k", POLICY, fetch)
        await settle()
    second = await cache.head(SCOPE, "k", POLICY, fetch)

    assert first == second == Lookup(info(), "stale")
    assert "refresh" in caplog.text and "stale entry kept" in caplog.text
    assert cache.stats()["heads"] == 1


async def test_origin_error_past_revalidation_window_serves_stale(
    cache: MetadataCache, clock: Clock
) -> None:
    policy = Policy(ttl=60, stale_while_revalidate=0, stale_if_error=3600)
    fetch = Fetch(info())
    await cache.head(SCOPE, "k", policy, fetch)
    clock.advance(61)
    fetch.answer = OriginThrottled("SlowDown")

    lookup = await cache.head(SCOPE, "k", policy, fetch)

    assert lookup == Lookup(info(), "stale_error") and fetch.calls == 2
    assert cache.stats()["stale_error"] == 1
    clock.advance(3600)  # now past stale_if_error as well: the error surfaces
    with pytest.raises(OriginThrottled):
        await cache.head(SCOPE, "k", policy, fetch)


async def test_origin_error_without_stale_entry_is_raised(cache: MetadataCache) -> None:
    with pytest.raises(OriginUnavailable):
        await cache.head(SCOPE, "k", POLICY, Fetch(OriginUnavailable("down")))
    assert cache.stats()["misses"] == 1 and cache.stats()["heads"] == 0


async def test_missing_key_is_cached_for_negative_ttl(cache: MetadataCache, clock: Clock) -> None:
    fetch = Fetch(NoSuchKey("k"))
    for _ in range(3):
        with pytest.raises(NoSuchKey):
            await cache.head(SCOPE, "k", POLICY, fetch)
    assert fetch.calls == 1 and cache.stats()["negative"] == 1

    clock.advance(10)
    fetch.answer = info()
    assert await cache.head(SCOPE, "k", POLICY, fetch) == Lookup(info(), "miss")
    assert fetch.calls == 2 and cache.stats()["negative"] == 0


async def test_a_negative_entry_keeps_what_the_origin_said(cache: MetadataCache) -> None:
    marker = {"x-amz-delete-marker": "true", "x-amz-version-id": "v9"}
    fetch = Fetch(NoSuchKey("k", marker))
    for _ in range(2):  # the miss, then the negative hit
        with pytest.raises(NoSuchKey) as raised:
            await cache.head(SCOPE, "k", POLICY, fetch)
        assert raised.value.headers == marker
    assert fetch.calls == 1


async def test_refresh_that_finds_the_key_deleted_stores_a_negative(
    cache: MetadataCache, clock: Clock
) -> None:
    fetch = Fetch(info())
    await cache.head(SCOPE, "k", POLICY, fetch)
    clock.advance(61)
    fetch.answer = NoSuchKey("k")
    assert (await cache.head(SCOPE, "k", POLICY, fetch)).state == "stale"
    await settle()
    with pytest.raises(NoSuchKey):
        await cache.head(SCOPE, "k", POLICY, fetch)
    assert fetch.calls == 2


async def test_forever_never_refetches(cache: MetadataCache, clock: Clock) -> None:
    forever = Policy(ttl=math.inf)
    fetch, lister = Fetch(info()), Lister(["a", "b"])
    await cache.head(SCOPE, "k", forever, fetch)
    await listing(cache, lister, policy=forever)
    clock.advance(1e12)

    assert (await cache.head(SCOPE, "k", forever, fetch)).state == "hit"
    assert (await listing(cache, lister, delimiter="/", policy=forever)).state == "hit"
    assert fetch.calls == 1 and len(lister.calls) == 1


async def test_put_head_is_served(cache: MetadataCache) -> None:
    cache.put_head(SCOPE, "k", info(etag='"9"'), POLICY)
    fetch = Fetch(OriginUnavailable("never asked"))
    assert await cache.head(SCOPE, "k", POLICY, fetch) == Lookup(info(etag='"9"'), "hit")
    assert fetch.calls == 0


async def test_put_head_wins_over_a_head_already_at_the_origin(cache: MetadataCache) -> None:
    fetch = Fetch(info(etag='"old"'))
    fetch.gate = asyncio.Event()
    racing = asyncio.ensure_future(cache.head(SCOPE, "k", POLICY, fetch))
    await settle()
    cache.put_head(SCOPE, "k", info(etag='"new"'), POLICY)
    fetch.gate.set()
    assert (await racing).value.etag == '"old"'  # its caller asked before the GET answered
    assert (await cache.head(SCOPE, "k", POLICY, fetch)).value.etag == '"new"'


# --- invalidation ------------------------------------------------------------


async def test_invalidate_key_drops_head_and_listings_containing_it(cache: MetadataCache) -> None:
    fetch, lister = Fetch(info("a/x")), Lister(["a/x", "a/y", "b/z"])
    await cache.head(SCOPE, "a/x", POLICY, fetch)
    for prefix in ("a/", "b/", ""):  # "" last: it would answer the other two
        await listing(cache, lister, prefix=prefix)
    await cache.listing(("other",), "a/", "", "", 1000, POLICY, lister)
    assert len(lister.calls) == 4

    cache.invalidate_key(SCOPE, "a/x")

    assert (await cache.head(SCOPE, "a/x", POLICY, fetch)).state == "miss"
    assert (await listing(cache, lister, prefix="b/")).state == "hit"
    assert (await cache.listing(("other",), "a/", "", "", 1000, POLICY, lister)).state == "hit"
    assert len(lister.calls) == 4
    assert (await listing(cache, lister, prefix="a/")).state == "miss"
    assert (await listing(cache, lister, prefix="")).state == "miss"
    assert len(lister.calls) == 6


async def test_invalidate_prefix_drops_heads_under_it_and_overlapping_listings(
    cache: MetadataCache,
) -> None:
    lister = Lister(["a/b/1", "a/c", "d"])
    for key in ("a/b/1", "a/c", "d"):
        cache.put_head(SCOPE, key, info(key), POLICY)
    for prefix in ("a/", "a/b/", "d"):
        await listing(cache, lister, prefix=prefix)

    cache.invalidate_prefix(SCOPE, "a/b/")

    assert cache.stats()["heads"] == 2
    calls = len(lister.calls)
    assert (await listing(cache, lister, prefix="d")).state == "hit"
    assert (await listing(cache, lister, prefix="a/")).state == "miss"
    assert len(lister.calls) == calls + 1


async def test_fetch_in_flight_during_invalidation_does_not_store(cache: MetadataCache) -> None:
    fetch = Fetch(info(etag='"old"'))
    fetch.gate = asyncio.Event()
    before = asyncio.ensure_future(cache.head(SCOPE, "k", POLICY, fetch))
    await settle()
    cache.invalidate_key(SCOPE, "k")  # a write lands while the HEAD is at the origin
    fetch.gate.set()
    assert (await before).value.etag == '"old"'

    fetch.answer, fetch.gate = info(etag='"new"'), None
    assert (await cache.head(SCOPE, "k", POLICY, fetch)).value.etag == '"new"'


async def test_clear_forgets_everything(cache: MetadataCache) -> None:
    cache.put_head(SCOPE, "k", info(), POLICY)
    await listing(cache, Lister(["a"]))
    cache.clear()
    stats = cache.stats()
    assert (stats["heads"], stats["listings"], stats["listing_bytes"]) == (0, 0, 0)


# --- listings ----------------------------------------------------------------

KEYS = [
    "a", "a/", "a/b", "a/b/c", "a/b/d/e", "a/bb", "a/c", "a/d/e", "ab", "b/x", "b/y/z",
    "c", "d/1", "d/2", "d/2/3", "é/x", "z",
]  # fmt: skip
PREFIXES = ["", "a", "a/", "a/b", "a/b/", "b/", "d/", "zz"]
DELIMITERS = ["", "/", "b"]
MARKERS = ["", "a", "a/", "a/b", "a/b/", "b", "d/2"]


async def test_concurrent_identical_listings_walk_the_origin_once(cache: MetadataCache) -> None:
    lister = Lister([f"data/{i:05d}" for i in range(2500)])
    lister.gate = asyncio.Event()

    pages = await held(
        lister.gate, [listing(cache, lister, "data/", "/", "", 100) for _ in range(64)]
    )

    assert lister.calls == [
        ("data/", "", "", 1000),
        ("data/", "", "data/00999", 1000),
        ("data/", "", "data/01999", 1000),
    ]
    assert all(p.value == pages[0].value for p in pages)
    assert [e.key for e in pages[0].value.entries] == [f"data/{i:05d}" for i in range(100)]


async def test_whole_listing_answers_any_page_like_paginate(cache: MetadataCache) -> None:
    lister = Lister(KEYS)
    await listing(cache, lister)  # the whole bucket: a superset of every prefix below

    for prefix, delimiter, marker, max_keys in itertools.product(
        PREFIXES, DELIMITERS, MARKERS, [0, 1, 2, 3, 1000]
    ):
        got = await listing(cache, lister, prefix, delimiter, marker, max_keys)
        assert got.state == "hit"
        assert got.value == paginate(lister.entries, prefix, delimiter, marker, max_keys)
    assert len(lister.calls) == 1


async def test_longer_prefix_is_answered_from_a_cached_ancestor(cache: MetadataCache) -> None:
    lister = Lister(KEYS)
    await listing(cache, lister, prefix="a/")
    got = await listing(cache, lister, prefix="a/b/d", delimiter="/")
    assert got == Lookup(paginate(lister.entries, "a/b/d", "/"), "hit")
    assert len(lister.calls) == 1
    await listing(cache, lister, prefix="b/")  # not under a/: its own walk
    assert len(lister.calls) == 2


async def test_expired_listing_is_revalidated_in_the_background(
    cache: MetadataCache, clock: Clock
) -> None:
    lister = Lister(["a/1"])
    await listing(cache, lister, prefix="a/")
    clock.advance(61)
    lister.entries = entries(["a/1", "a/2"])
    lister.gate = asyncio.Event()

    stale = await asyncio.gather(*[listing(cache, lister, "a/", "/") for _ in range(50)])

    assert {len(s.value.entries) for s in stale} == {1} and {s.state for s in stale} == {"stale"}
    assert len(lister.calls) == 2
    lister.gate.set()
    await settle()
    fresh = await listing(cache, lister, "a/b")  # answered by the refreshed a/ listing
    assert fresh.state == "hit" and len((await listing(cache, lister, "a/")).value.entries) == 2


async def test_listing_origin_error_serves_stale_or_raises(
    cache: MetadataCache, clock: Clock
) -> None:
    policy = Policy(ttl=60, stale_while_revalidate=0)
    lister = Lister(["a/1"])
    await listing(cache, lister, prefix="a/", policy=policy)
    clock.advance(61)
    lister.error = OriginUnavailable("down")

    got = await listing(cache, lister, prefix="a/x", policy=policy)  # stale ancestor
    assert got.state == "stale_error" and got.value == paginate(lister.entries, "a/x")
    with pytest.raises(OriginUnavailable):
        await listing(cache, lister, prefix="b/", policy=policy)


async def test_prefix_over_the_limit_stops_early_and_caches_pages(
    clock: Clock, events: list
) -> None:
    lister = Lister([f"big/{i:05d}" for i in range(5000)])
    limit = snapshot("big/", lister.entries[:1500]).nbytes  # the bytes of 1,500 keys
    cache = MetadataCache(
        whole_listing_bytes=limit, clock=clock, on_event=lambda *e: events.append(e[:2])
    )
    lister.gate = asyncio.Event()

    pages = await held(
        lister.gate, [listing(cache, lister, "big/", "/", "", 10) for _ in range(64)]
    )

    assert lister.calls == [
        ("big/", "", "", 1000),
        ("big/", "", "big/00999", 1000),  # 2000 > 1500: no third page
        ("big/", "/", "", 10),
    ]
    assert all(p.value == paginate(lister.entries, "big/", "/", "", 10) for p in pages)
    assert (await listing(cache, lister, "big/", "/", "", 10)).state == "hit"
    nxt = await listing(cache, lister, "big/", "/", pages[0].value.next_marker or "", 10)
    assert nxt.value == paginate(lister.entries, "big/", "/", "big/00009", 10)
    assert len(lister.calls) == 4  # the too-big verdict is remembered: no second walk
    assert events.count(("list", "too_big")) == 1

    clock.advance(61)
    assert (await listing(cache, lister, "big/", "/", "", 10)).state == "stale"
    await settle()
    assert (await listing(cache, lister, "big/", "/", "", 10)).state == "hit"


# --- memory bounds -------------------------------------------------------------


async def test_heads_are_bounded_least_recently_used_first(clock: Clock, events: list) -> None:
    one = MetadataCache()
    one.put_head(SCOPE, "k0", info("k0"), POLICY)
    limit = 3 * one.stats()["head_bytes"] + 10  # room for three such entries, not four
    cache = MetadataCache(head_bytes=limit, clock=clock, on_event=lambda *e: events.append(e[:2]))
    for key in ("k1", "k2", "k3"):
        cache.put_head(SCOPE, key, info(key), POLICY)
    await cache.head(SCOPE, "k1", POLICY, Fetch(info("k1")))  # k2 is now the oldest
    cache.put_head(SCOPE, "k4", info("k4"), POLICY)

    fetch = Fetch(info("k2"))
    assert (await cache.head(SCOPE, "k2", POLICY, fetch)).state == "miss"  # evicted k3 in turn
    assert (await cache.head(SCOPE, "k1", POLICY, fetch)).state == "hit"
    assert cache.stats()["heads"] == 3 and events.count(("head", "evicted")) == 2


async def test_listings_are_bounded_by_their_bytes(clock: Clock, events: list) -> None:
    lister = Lister(["a/1", "a/2", "a/3", "b/1", "b/2", "c/1", "c/2"])
    a, b = snapshot("a/", lister.entries[:3]).nbytes, snapshot("b/", lister.entries[3:5]).nbytes
    cache = MetadataCache(
        listing_bytes=a + b,
        page_body_bytes=0,
        clock=clock,
        on_event=lambda *e: events.append(e[:2]),
    )
    await listing(cache, lister, "a/")
    await listing(cache, lister, "b/")
    await listing(cache, lister, "a/")  # b/ is now the least recently used
    await listing(cache, lister, "c/")

    assert cache.stats()["listing_bytes"] == a + b and events.count(("list", "evicted")) == 1
    assert (await listing(cache, lister, "a/")).state == "hit"
    assert (await listing(cache, lister, "b/")).state == "miss"


# --- against a real bucket -------------------------------------------------------


@pytest.mark.parametrize("whole_listing_bytes", [1 << 20, 600])  # whole; pages (5 keys)
async def test_pages_match_moto_list_objects_v2(
    moto_endpoint: str, origin_client, whole_listing_bytes: int
) -> None:
    bucket = f"hoard-{uuid.uuid4().hex[:16]}"
    origin_client.create_bucket(Bucket=bucket)
    for key in KEYS:
        origin_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    origin = S3Origin("moto", S3OriginConfig(
        type="s3", endpoint=moto_endpoint, access_key="origin-access", secret_key="origin-secret",
    ))  # fmt: skip
    cache = MetadataCache(whole_listing_bytes=whole_listing_bytes)

    async def fetch_page(prefix: str, delimiter: str, start_after: str, max_keys: int) -> ListPage:
        return await origin.list_objects(bucket, prefix, delimiter, start_after, max_keys)

    try:
        for prefix, delimiter, max_keys in itertools.product(["", "a/", "d"], ["", "/"], [1, 2, 7]):
            ours = await all_pages(cache, fetch_page, prefix, delimiter, max_keys)
            assert ours == moto_pages(origin_client, bucket, prefix, delimiter, max_keys)
    finally:
        await origin.close()


async def all_pages(cache: MetadataCache, fetch_page, prefix: str, delimiter: str, max_keys: int):
    pages, marker = [], ""
    while True:
        page = (
            await cache.listing(SCOPE, prefix, delimiter, marker, max_keys, POLICY, fetch_page)
        ).value
        pages.append(([e.key for e in page.entries], page.common_prefixes, page.is_truncated))
        if not page.is_truncated:
            return pages
        marker = page.next_marker


def moto_pages(client, bucket: str, prefix: str, delimiter: str, max_keys: int) -> list:
    paginator = client.get_paginator("list_objects_v2")
    params = {"Bucket": bucket, "Prefix": prefix, "PaginationConfig": {"PageSize": max_keys}}
    if delimiter:
        params["Delimiter"] = delimiter
    return [
        (
            [c["Key"] for c in page.get("Contents", [])],
            [p["Prefix"] for p in page.get("CommonPrefixes", [])],
            page["IsTruncated"],
        )
        for page in paginator.paginate(**params)
    ]
