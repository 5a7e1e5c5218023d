"""Membership: probes and reports with hysteresis, static and DNS sources, lifecycle.

Rounds are driven by hand (``probe_all``, ``refresh_dns``) against a fake probe
and a fake clock; the one background test waits on events with a bound, and
never asserts on how fast anything happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from gateway.cluster.membership import Membership, normalize_url
from gateway.node.shared import SharedDocument
from tests.fakes import Clock

SELF = "http://10.0.0.1:9000"
B = "http://10.0.0.2:9000"
C = "http://10.0.0.3:9000"


class FakeProbe:
    """Answers from ``up``; a URL missing from it raises (like a refused connection)."""

    def __init__(self) -> None:
        self.up: dict[str, bool] = {}
        self.calls: list[str] = []

    async def __call__(self, url: str) -> bool:
        self.calls.append(url)
        if url not in self.up:
            raise ConnectionRefusedError(url)
        return self.up[url]


class FakeResolver:
    def __init__(self, *addresses: str) -> None:
        self.addresses: list[str] | Exception = list(addresses)
        self.names: list[str] = []

    async def __call__(self, name: str) -> Iterable[str]:
        self.names.append(name)
        if isinstance(self.addresses, Exception):
            raise self.addresses
        return self.addresses


def _membership(peers=(B, C), **kwargs) -> tuple[Membership, FakeProbe]:
    probe = kwargs.pop("probe", FakeProbe())
    return Membership(SELF, peers, probe=probe, clock=kwargs.pop("clock", Clock()),
                      **kwargs), probe  # fmt: skip


async def _rounds(membership: Membership, probe: FakeProbe, url: str, results: list[bool]):
    """One probe round per result for ``url``; the live state after each round."""
    states = []
    for ok in results:
        probe.up[url] = ok
        await membership.probe_all()
        states.append(url in membership.live())
    return states


async def test_self_is_live_and_new_peers_join_on_first_success():
    membership, probe = _membership()
    assert membership.live() == [SELF] and membership.version == 0
    probe.up = {B: True, C: True}
    await membership.probe_all()
    assert membership.live() == [SELF, B, C]
    assert membership.version == 1  # one round, one change
    assert SELF not in probe.calls  # this node is never probed: it is live by definition


async def test_a_failing_peer_leaves_after_fail_after_and_rejoins_after_rejoin_after():
    membership, probe = _membership(fail_after=2, rejoin_after=3)
    probe.up = {B: True, C: True}
    await membership.probe_all()
    assert await _rounds(membership, probe, B, [False, False, False]) == [True, False, False]
    assert await _rounds(membership, probe, B, [True, True, True, True]) == [
        False, False, True, True,
    ]  # fmt: skip
    assert membership.version == 3  # joined, left, rejoined
    assert C in membership.live()


async def test_flapping_peer_does_not_churn_ownership():
    membership, probe = _membership(fail_after=2, rejoin_after=3)
    probe.up = {B: True, C: True}
    await membership.probe_all()
    # Alternating: never two failures in a row, so it never leaves.
    assert all(await _rounds(membership, probe, B, [False, True] * 20))
    assert membership.version == 1
    # Two down, one up: leaves once, and never strings three successes to come back.
    states = await _rounds(membership, probe, B, [False, False, True] * 20)
    assert not any(states[1:])
    assert membership.version == 2


async def test_passive_reports_count_like_probes():
    membership, probe = _membership(fail_after=3, rejoin_after=2)
    probe.up = {B: True, C: True}
    await membership.probe_all()
    membership.report_failure(B)
    membership.report_failure(B + "/")  # any spelling of the URL counts for the node
    assert B in membership.live()
    membership.report_failure(B)
    assert B not in membership.live()
    membership.report_success(B)
    assert B not in membership.live()
    membership.report_success(B)
    assert B in membership.live()
    membership.report_failure(SELF)  # ignored: this node is always live
    membership.report_failure("http://10.9.9.9:9000")  # ignored: not a member
    assert membership.live() == [SELF, B, C]


async def test_a_probe_that_raises_or_hangs_is_a_failure():
    async def hang(url: str) -> bool:
        await asyncio.Event().wait()
        return True

    membership, _ = _membership(peers=[B], probe=hang, probe_timeout=0.01)
    await membership.probe_all()
    assert membership.snapshot()["members"][1]["consecutive_failures"] == 1
    membership2, _ = _membership(peers=[B])  # B is missing from the probe: it raises
    await membership2.probe_all()
    assert membership2.live() == [SELF]


async def test_update_static_adds_and_removes_peers_and_keeps_health():
    membership, probe = _membership(peers=[SELF, B])  # the peer list names this node too
    probe.up = {B: True, C: True}
    await membership.probe_all()
    assert membership.members() == [SELF, B] and membership.live() == [SELF, B]
    membership.update_static([B, C])
    assert membership.members() == [SELF, B, C]
    assert membership.live() == [SELF, B]  # C is pending until probed; B kept its health
    await membership.probe_all()
    assert membership.live() == [SELF, B, C]
    membership.update_static([C])
    assert membership.live() == [SELF, C]
    version = membership.version
    membership.update_static(["HTTP://10.0.0.3:9000/"])  # same node, another spelling
    assert membership.version == version


async def test_dns_refresh_adds_and_removes_peers():
    resolver = FakeResolver("10.0.0.1", "10.0.0.2")
    membership, probe = _membership(peers=[], dns_name="hoard.ns.svc", resolver=resolver)
    probe.up = {B: True, C: True, "http://[fd00::4]:9000": True}
    await membership.refresh()
    assert resolver.names == ["hoard.ns.svc"]
    assert membership.live() == [SELF, B]  # 10.0.0.1 is this node, not a second one
    resolver.addresses = ["10.0.0.2", "10.0.0.3", "fd00::4"]
    await membership.refresh()
    assert membership.live() == [SELF, B, C, "http://[fd00::4]:9000"]
    resolver.addresses = ["10.0.0.3"]
    await membership.refresh_dns()
    assert membership.live() == [SELF, C]
    assert membership.snapshot()["members"][1]["sources"] == ["dns"]


async def test_dns_failure_keeps_the_last_answer():
    resolver = FakeResolver("10.0.0.2")
    membership, probe = _membership(peers=[], dns_name="hoard", resolver=resolver)
    probe.up = {B: True}
    await membership.refresh()
    resolver.addresses = OSError("temporary failure in name resolution")
    await membership.refresh()
    assert membership.live() == [SELF, B]


async def test_a_peer_from_both_sources_stays_until_both_drop_it():
    resolver = FakeResolver("10.0.0.2")
    membership, probe = _membership(peers=[B], dns_name="hoard", resolver=resolver)
    probe.up = {B: True}
    await membership.refresh()
    membership.update_static([])
    assert membership.live() == [SELF, B]
    resolver.addresses = []
    await membership.refresh_dns()
    assert membership.live() == [SELF]


async def test_version_and_listeners_move_only_on_real_changes():
    membership, probe = _membership()
    seen: list[list[str]] = []
    membership.on_change(seen.append)
    membership.on_change(lambda live: 1 / 0)  # a broken listener harms no other
    probe.up = {B: True, C: True}
    for _ in range(5):
        await membership.probe_all()
    membership.update_static([C, B])
    membership.report_success(B)
    assert membership.version == 1 and seen == [[SELF, B, C]]


async def test_snapshot_shows_members_health_and_last_seen():
    clock = Clock()
    membership, probe = _membership(clock=clock)
    probe.up = {B: True}
    await membership.probe_all()
    clock.now += 5
    snapshot = membership.snapshot()
    assert snapshot["self"] == SELF and snapshot["live"] == [SELF, B]
    by_url = {m["url"]: m for m in snapshot["members"]}
    assert by_url[SELF]["self"] and by_url[SELF]["healthy"]
    assert by_url[B]["last_seen"] == 1000.0 and by_url[B]["seen_ago"] == 5.0
    assert by_url[C] == {
        "url": C, "self": False, "sources": ["static"], "healthy": False, "last_seen": None,
        "seen_ago": None, "consecutive_failures": 1, "consecutive_successes": 0,
    }  # fmt: skip


async def test_background_tasks_probe_resolve_and_stop_on_close():
    resolver = FakeResolver("10.0.0.3")
    membership, probe = _membership(
        peers=[B], dns_name="hoard", resolver=resolver, probe_interval=0.001, dns_interval=0.001
    )
    changed = asyncio.Event()
    membership.on_change(lambda live: changed.set())
    probe.up = {B: True, C: True}
    membership.start()
    membership.start()  # a second start does not start a second set of loops
    while membership.live() != [SELF, B, C]:
        await asyncio.wait_for(changed.wait(), timeout=10)
        changed.clear()
    probe.up[B] = False
    while B in membership.live():
        await asyncio.wait_for(changed.wait(), timeout=10)
        changed.clear()
    await membership.close()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    calls = len(probe.calls)
    await asyncio.sleep(0.01)
    assert len(probe.calls) == calls  # nothing probes after close
    await membership.close()  # closing twice is harmless


def test_urls_are_validated_and_normalized():
    assert normalize_url(" HTTP://Node-1:9000/ ") == "http://node-1:9000"
    for bad in ("10.0.0.1:9000", "", "ftp://x:1"):
        with pytest.raises(ValueError):
            normalize_url(bad)
    with pytest.raises(ValueError):
        Membership(SELF, ["nope"], probe=FakeProbe())
    with pytest.raises(ValueError):
        Membership(SELF, probe=FakeProbe(), fail_after=0)


class Worker:
    """What ``gateway/node/`` gives one worker: whether it leads, and the shared view."""

    def __init__(self, document: SharedDocument, leads: bool) -> None:
        self.document = document
        self.leads = leads

    def write(self, body: dict) -> None:
        self.document.write(body)

    def read(self, max_age: float | None = None) -> dict | None:
        return self.document.read(max_age)


async def test_one_worker_probes_for_the_node_and_the_others_take_its_view(tmp_path):
    document = SharedDocument(tmp_path / "membership.json")
    leader, follower = Worker(document, True), Worker(document, False)
    a, probe_a = _membership(node=leader, rejoin_after=2)
    b, probe_b = _membership(node=follower, rejoin_after=2)
    probe_a.up = {B: True, C: False}
    await a._round()
    await b._round()
    assert a.live() == b.live() == [SELF, B]
    assert probe_b.calls == [] and len(probe_a.calls) == 2
    assert b.snapshot()["members"] == a.snapshot()["members"]
    probe_a.up = {B: False, C: True}
    for _ in range(2):  # fail_after=2: B leaves
        await a._round()
    await b._round()
    assert a.live() == b.live() == [SELF, C]
    # The leader dies; b leads from the shared view: B, which left, needs two successes.
    follower.leads = True
    probe_b.up = {B: True, C: True}
    await b._round()
    assert b.live() == [SELF, C]
    await b._round()
    assert b.live() == [SELF, B, C]
    assert len(probe_b.calls) == 4


async def test_a_worker_without_the_leaders_view_probes_by_itself_at_start(tmp_path):
    follower = Worker(SharedDocument(tmp_path / "membership.json"), False)
    membership, probe = _membership(node=follower)
    probe.up = {B: True, C: True}
    await membership.refresh()
    assert membership.live() == [SELF, B, C] and len(probe.calls) == 2
