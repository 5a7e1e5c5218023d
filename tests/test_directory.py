"""Metadata ownership, the asking side: who is asked, and when the origin is asked instead.

The owner here is a loopback port nobody listens on, so asking it fails at once;
what the tests check is whom the router asks and what it tells membership.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.cluster.directory import MetadataRouter
from gateway.cluster.membership import Membership
from gateway.cluster.peer_client import PeerClient
from gateway.cluster.placement import Placement
from gateway.metadata.codec import info_from, jsonable, page_from
from gateway.metadata.query import MetadataQuery
from gateway.obs.events import PeerMetrics
from gateway.obs.metrics import Metrics
from gateway.origins.base import ListEntry, ListPage, ObjectInfo
from tests.fakes import Clock
from tests.harness import free_port

pytestmark = pytest.mark.timeout(30)

ME = "http://127.0.0.1:1"
INFO = ObjectInfo("k", 3, '"e"', datetime(2024, 1, 2, tzinfo=UTC), metadata={"a": "b"},
                  headers={"x-amz-server-side-encryption": "aws:kms", "x-amz-tagging-count": "2"})  # fmt: skip


async def _never(url: str) -> bool:
    return False


def _failures(membership: Membership, url: str) -> int:
    (member,) = [m for m in membership.snapshot()["members"] if m["url"] == url]
    return member["consecutive_failures"]


def _query(router: MetadataRouter, owner: str) -> MetadataQuery:
    """A HEAD query whose metadata owner is ``owner``."""
    for i in range(1000):
        query = MetadataQuery("head", "aws", "data", f"key-{i}", 60.0, 10.0)
        if router.owner(query) == owner:
            return query
    raise AssertionError(f"no key owned by {owner}")


@pytest.fixture
async def setup():
    peer = f"http://127.0.0.1:{free_port()}"  # nobody listens: unreachable at once
    membership = Membership(ME, [peer], probe=_never, fail_after=5)
    membership.report_success(peer)  # live
    client = PeerClient("secret")
    metrics = Metrics()
    clock = Clock(100.0)
    router = MetadataRouter(Placement(membership, client, PeerMetrics(metrics)), client, PeerMetrics(metrics), 5.0, 3.0,
                            clock)  # fmt: skip
    yield router, membership, peer, clock
    await client.close()


def test_answers_roundtrip_through_json():
    assert info_from(jsonable(INFO)) == INFO
    page = ListPage([ListEntry("a", 1, '"x"', INFO.last_modified)], ["p/"], True, "p/")
    assert page_from(jsonable(page)) == page


async def test_an_unreachable_owner_means_the_origin_and_a_reported_failure(setup):
    router, membership, peer, _ = setup
    asked: list[str] = []

    async def origin() -> ObjectInfo:
        asked.append("origin")
        return INFO

    assert await router.head(_query(router, peer), origin) == INFO
    assert asked == ["origin"]
    assert _failures(membership, peer) == 1
    assert await router.head(_query(router, ME), origin) == INFO  # this node owns it
    assert _failures(membership, peer) == 1  # not asked


async def test_after_an_invalidation_the_scope_goes_to_the_origin_until_it_settles(setup):
    router, membership, peer, clock = setup

    async def origin() -> ObjectInfo:
        return INFO

    def failures() -> int:
        return _failures(membership, peer)

    router.invalidated(("aws", "data"))
    await router.head(_query(router, peer), origin)
    assert failures() == 0  # the owner was not asked: it may not have the write yet
    router.invalidated(("aws", "other"))  # another scope settles on its own
    clock.now += 3.0
    await router.head(_query(router, peer), origin)
    assert failures() == 1  # settled: the owner is asked again
