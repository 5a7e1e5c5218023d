"""Rendered listing pages: one rendering per snapshot and query, never served for another
snapshot, bounded in bytes; and ``/``-delimited pages skipping whole directory runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gateway.metadata.bodies import PageBodies
from gateway.metadata.memory import MetadataCache, Policy
from gateway.metadata.snapshot import snapshot
from gateway.origins.base import ListEntry, ListPage
from gateway.origins.listing import paginate

T0 = datetime(2026, 11, 25, tzinfo=UTC)
SCOPE = ("origin", "bucket")
POLICY = Policy(ttl=60)


class Origin:
    """A listing origin over ``keys``, counting the pages asked of it."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.pages = 0
        self.listed = asyncio.Event()  # set as each page is answered

    async def __call__(self, prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
        self.pages += 1
        self.listed.set()
        listed = [ListEntry(k, 1, '"' + "ab" * 16 + '"', T0) for k in sorted(self.keys)]
        return paginate(listed, prefix, delimiter, after, limit)


class Renderer:
    """Renders a page as its keys and prefixes, counting renderings."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, page: ListPage) -> bytes:
        self.calls += 1
        return " ".join([e.key for e in page.entries] + page.common_prefixes).encode()


async def body(cache: MetadataCache, origin: Origin, render: Renderer, variant: str = "v2",
               query: tuple[str, str, str, int] = ("d/", "/", "", 1000)) -> bytes:  # fmt: skip
    return (await cache.listing_body(SCOPE, query, POLICY, origin, render, variant)).value


async def test_a_page_is_rendered_once_per_snapshot_query_and_variant() -> None:
    now = [0.0]
    cache = MetadataCache(clock=lambda: now[0])
    origin, render = Origin(["d/a", "d/b", "d/e/1", "d/e/2"]), Renderer()
    assert await body(cache, origin, render) == b"d/a d/b d/e/"
    assert await body(cache, origin, render) == b"d/a d/b d/e/"
    assert (render.calls, origin.pages) == (1, 1)
    await body(cache, origin, render, variant="v1")  # another rendering of the same page
    await body(cache, origin, render, query=("d/", "", "", 1000))
    assert render.calls == 3 and cache.stats()["page_bodies"] == 3

    origin.keys.append("d/c")  # written behind Hoard's back: seen at the next snapshot
    now[0] = 61.0  # past the TTL: the stale page is served while one refresh runs
    origin.listed.clear()
    assert await body(cache, origin, render) == b"d/a d/b d/e/"
    await origin.listed.wait()  # the refresh's one page: its snapshot is stored with it
    assert await body(cache, origin, render) == b"d/a d/b d/c d/e/"  # a new version, rendered


async def test_a_write_drops_the_pages_rendered_from_its_listing() -> None:
    cache = MetadataCache()
    origin, render = Origin(["d/a", "d/b"]), Renderer()
    await body(cache, origin, render)
    assert cache.stats()["page_bodies"] == 1
    origin.keys.append("d/c")
    cache.invalidate_key(SCOPE, "d/c")
    assert cache.stats()["page_bodies"] == 0 and cache.stats()["page_body_bytes"] == 0
    assert await body(cache, origin, render) == b"d/a d/b d/c"


async def test_pages_too_big_to_hold_whole_are_rendered_each_time() -> None:
    cache = MetadataCache(whole_listing_bytes=1)  # every prefix is cached page by page
    origin, render = Origin(["d/a", "d/b"]), Renderer()
    assert await body(cache, origin, render) == await body(cache, origin, render) == b"d/a d/b"
    assert render.calls == 2 and cache.stats()["page_bodies"] == 0


def test_bodies_are_bounded_by_bytes_least_recently_used_first() -> None:
    one = PageBodies(1 << 20)
    one.put(1, "q", b"x" * 100)
    bodies = PageBodies(2 * one.weight)
    bodies.put(1, "a", b"x" * 100)
    bodies.put(1, "b", b"x" * 100)
    assert bodies.get(1, "a") is not None  # b is now the least recently used
    bodies.put(2, "c", b"x" * 100)
    assert (bodies.get(1, "b"), len(bodies), bodies.weight) == (None, 2, 2 * one.weight)
    bodies.drop(1)
    assert (bodies.get(1, "a"), bodies.get(2, "c")) == (None, b"x" * 100)
    bodies.put(3, "huge", b"x" * (4 * one.weight))  # larger than the bound: not kept
    assert bodies.get(3, "huge") is None and len(bodies) == 1


def test_delimited_pages_skip_directory_runs_exactly_as_a_plain_listing() -> None:
    """Runs of one directory, nested ones, and prefixes that end in / or do not."""
    keys = sorted(
        [f"t/{d:02d}/{i}" for d in range(40) for i in range(d % 7)]
        + ["t/05/sub/x", "t/05/sub/y", "t/05/z", "t/06", "t/07/", "t/x/y/z/1", "u/1", "t/a/b"]
        + [f"t/{d:02d}/deep/{i}/f" for d in (3, 9) for i in range(12)]
    )
    listed = [ListEntry(k, 1, '"' + "ab" * 16 + '"', T0) for k in keys]
    snap = snapshot("", listed)
    for prefix in ("", "t/", "t/05/", "t/03/deep/", "t/0"):
        for delimiter in ("/", "e/", "b"):
            for after in ("", "t/03/", "t/05/s", "t/09/deep/1/f"):
                for max_keys in (1, 3, 1000):
                    assert paginate(snap, prefix, delimiter, after, max_keys) == paginate(
                        listed, prefix, delimiter, after, max_keys
                    ), (prefix, delimiter, after, max_keys)
