"""Coalescing mechanics, tested by holding callers on events (never with sleeps)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.cache.memory import MemoryTier
from gateway.cache.singleflight import Flight, FlightGroup, Group


async def test_group_runs_work_once_for_concurrent_callers():
    release = asyncio.Event()
    calls = 0

    async def work() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "value"

    group: Group[str, str] = Group()
    waiters = [asyncio.create_task(group.do("k", work)) for _ in range(64)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiters) == ["value"] * 64
    assert calls == 1 and len(group) == 0


async def test_group_cancelled_waiter_does_not_cancel_the_work():
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        return 7

    group: Group[str, int] = Group()
    first = asyncio.create_task(group.do("k", work))
    second = asyncio.create_task(group.do("k", work))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == 7


async def test_group_error_reaches_every_waiter_and_is_not_kept():
    async def failing() -> int:
        await asyncio.sleep(0)
        raise RuntimeError("origin down")

    group: Group[str, int] = Group()
    results = await asyncio.gather(
        *(group.do("k", failing) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)

    async def ok() -> int:
        return 1

    assert await group.do("k", ok) == 1  # a failure is not cached


async def test_flight_streams_bytes_before_the_fill_completes():
    flight = Flight(6)
    received: list[bytes] = []
    got_first = asyncio.Event()

    async def reader() -> None:
        async for piece in flight.read():
            received.append(bytes(piece))
            got_first.set()

    task = asyncio.create_task(reader())
    flight.append(b"abc")
    await asyncio.wait_for(got_first.wait(), 5)
    assert received == [b"abc"] and not flight.done  # bytes arrived mid-fill
    flight.append(b"def")
    flight.finish()
    await task
    assert b"".join(received) == b"abcdef"


async def test_flight_reader_at_an_offset_and_failure():
    flight = Flight(10)
    flight.append(b"0123456789")
    flight.finish()
    assert b"".join([p async for p in flight.read(3, 4)]) == b"3456"
    split = Flight(10)
    for part in (b"012", b"3", b"45678", b"9"):
        split.append(part)
    split.finish()
    for offset in range(10):
        for length in range(10 - offset + 1):
            got = b"".join([p async for p in split.read(offset, length)])
            assert got == b"0123456789"[offset : offset + length], (offset, length)
    broken = Flight(10)
    broken.append(b"01")
    broken.fail(RuntimeError("boom"))
    with pytest.raises(RuntimeError):
        [p async for p in broken.read()]


async def test_flight_group_fill_outlives_a_cancelled_leader():
    release = asyncio.Event()
    fills = 0

    async def fill(flight: Flight) -> None:
        nonlocal fills
        fills += 1
        flight.append(b"ab")
        await release.wait()
        flight.append(b"cd")

    group: FlightGroup[str] = FlightGroup()
    leader, started = group.join_or_start("block", 4, fill)
    follower, joined_started = group.join_or_start("block", 4, fill)
    assert started and not joined_started and leader is follower

    async def read(f: Flight) -> bytes:
        return b"".join([p async for p in f.read()])

    leader_task = asyncio.create_task(read(leader))
    follower_task = asyncio.create_task(read(follower))
    await asyncio.sleep(0)
    leader_task.cancel()  # the first client hangs up
    release.set()
    assert await follower_task == b"abcd"
    assert fills == 1 and group.started == 1 and group.joined == 1
    assert group.get("block") is None


async def test_a_fill_that_ran_since_a_moment_is_told_from_one_before_it():
    release = asyncio.Event()

    async def fill(flight: Flight) -> None:
        await release.wait()
        flight.append(b"ab")

    group: FlightGroup[str] = FlightGroup()
    before = time.monotonic()
    group.join_or_start("early", 2, fill)
    release.set()
    await group.settled("early")
    looked = time.monotonic()
    assert group.get("early") is None  # ended, and gone from the running flights
    assert group.ran_since("early", before)  # it ran while the caller looked elsewhere
    assert not group.ran_since("early", looked)  # it was there before the caller looked
    release.clear()
    group.join_or_start("running", 2, fill)
    assert group.ran_since("running", looked) and not group.ran_since("never", before)
    release.set()
    await group.settled("running")


async def test_flight_short_fill_is_an_error():
    async def short(flight: Flight) -> None:
        flight.append(b"ab")

    group: FlightGroup[str] = FlightGroup()
    flight, _ = group.join_or_start("b", 4, short)
    with pytest.raises(ValueError):
        [p async for p in flight.read()]


def test_memory_tier_is_bounded_by_bytes_lru():
    evicted: list[int] = []
    tier = MemoryTier(capacity=10, max_item=4, on_evict=evicted.append)
    assert not tier.put("big", b"12345")  # over max_item: not admitted
    for key in "abc":
        assert tier.put(key, b"xxx")
    assert tier.get("a") == b"xxx"  # a is now most recently used
    tier.put("d", b"yyy")  # 12 bytes > 10: the LRU one (b) goes
    assert tier.get("b") is None and tier.get("a") == b"xxx"
    assert tier.used <= tier.capacity and sum(evicted) == tier.evictions == 1
    assert tier.discard_where(lambda key: key in ("a", "c")) == 2
    assert tier.used == 3


async def test_a_detached_call_runs_on_for_its_waiters_but_no_longer_owns_its_key() -> None:
    group: Group[str, str] = Group()
    release = asyncio.Event()
    owned: list[bool] = []

    async def work() -> str:
        await release.wait()
        owned.append(group.owns("k"))
        return "old"

    waiting = asyncio.ensure_future(group.do("k", work))
    await asyncio.sleep(0)  # the call has started
    group.detach("k")
    assert "k" not in group

    async def fresh() -> str:
        owned.append(group.owns("k"))
        return "new"

    assert await group.do("k", fresh) == "new"  # the next caller starts a call of its own
    release.set()
    assert await waiting == "old"  # the detached call's waiter still gets its answer
    assert owned == [True, False]  # and only the attached call may store what it read
