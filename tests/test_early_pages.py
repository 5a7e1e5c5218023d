"""A cold listing's first pages are answered as soon as the origin pages covering them
arrive, while the walk of the whole prefix goes on, once for every lister."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gateway.metadata.memory import MetadataCache, Policy
from gateway.metadata.snapshot import SnapshotBuilder
from gateway.metadata.walk import settled_page
from gateway.origins.base import ListEntry, ListPage
from gateway.origins.listing import paginate

T0 = datetime(2026, 11, 25, tzinfo=UTC)
SCOPE = ("origin", "bucket")
POLICY = Policy(ttl=60)
KEYS = [f"d/{i:05d}" for i in range(2500)]  # three origin pages of up to 1,000


def entries(keys: list[str]) -> list[ListEntry]:
    return [ListEntry(k, 1, '"' + "ab" * 16 + '"', T0) for k in keys]


class GatedOrigin:
    """Lists ``KEYS``; after its first page it waits for ``release`` before each next one."""

    def __init__(self) -> None:
        self.pages = 0
        self.waiting = asyncio.Event()  # set when a page waits for ``release``
        self.release = asyncio.Event()

    async def __call__(self, prefix: str, delimiter: str, after: str, limit: int) -> ListPage:
        if self.pages:
            self.waiting.set()
            await self.release.wait()
        self.pages += 1
        return paginate(entries(KEYS), prefix, delimiter, after, limit)


async def test_first_pages_come_before_the_walk_ends_and_the_walk_is_shared() -> None:
    cache, origin = MetadataCache(), GatedOrigin()

    def page(after: str = "", max_keys: int = 100) -> asyncio.Task:
        return asyncio.ensure_future(
            cache.listing(SCOPE, "d/", "", after, max_keys, POLICY, origin)
        )

    first, again = page(), page()
    deep = page(after=KEYS[950])  # needs keys of the second origin page
    await origin.waiting.wait()  # one origin page in; the walk waits for the next
    got = await asyncio.wait_for(first, 60)  # a guard: without early pages, this never ends
    assert got.state == "miss" and origin.pages == 1
    assert [e.key for e in got.value.entries] == KEYS[:100] and got.value.is_truncated
    assert (await again).value == got.value  # shared: still one origin page
    await asyncio.sleep(0)  # give the deep page a turn: it must still be waiting
    assert not deep.done()

    origin.release.set()
    assert [e.key for e in (await deep).value.entries] == KEYS[951:1051]
    last = await cache.listing(SCOPE, "d/", "", KEYS[-2], 100, POLICY, origin)  # the walk's end
    assert [e.key for e in last.value.entries] == [KEYS[-1]] and not last.value.is_truncated
    assert (await cache.listing(SCOPE, "d/", "", "", 100, POLICY, origin)).state == "hit"
    assert origin.pages == 3  # the prefix was walked once for all five listings


def test_a_page_is_settled_by_one_item_more_or_by_the_walk_passing_its_prefix() -> None:
    walked = SnapshotBuilder("")
    walked.add(entries(["a/1", "a/2", "a/3"]))
    assert settled_page(("a/", "", "", 3), walked) is None  # a 4th a/ key may still come
    assert settled_page(("a/", "", "", 2), walked).is_truncated  # type: ignore[union-attr]
    assert settled_page(("a/", "", "", 0), walked) == ListPage([], [], False, None)
    walked.add(entries(["b/1"]))  # past a/: nothing more can join its pages
    whole = paginate(entries(["a/1", "a/2", "a/3", "b/1"]), "a/", "", "", 3)
    assert settled_page(("a/", "", "", 3), walked) == whole and not whole.is_truncated
    assert settled_page(("", "/", "", 1), walked) == ListPage([], ["a/"], True, "a/")
    assert settled_page(("", "/", "", 2), walked) is None  # b/ may hold more keys
