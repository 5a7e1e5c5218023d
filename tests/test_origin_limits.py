"""Token buckets on a controllable clock, and the priority gate's order of admission."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.priority import Priority
from gateway.origins.limits import PriorityGate, TokenBucket
from tests.fakes import Clock

pytestmark = pytest.mark.timeout(10)


# --- TokenBucket ------------------------------------------------------------------


def test_zero_rate_is_unlimited() -> None:
    bucket = TokenBucket(0, 0, Clock())
    assert bucket.unlimited
    assert all(bucket.reserve(10**9) == 0 for _ in range(100))


def test_burst_goes_out_at_once_then_the_rate_paces() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=10, clock=clock)
    assert [bucket.reserve(1) for _ in range(10)] == [0.0] * 10
    # Each further request waits a tenth of a second more than the one before.
    assert [bucket.reserve(1) for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    clock.now += 0.3  # the debt is paid off: one more waits a tenth
    assert bucket.reserve(1) == pytest.approx(0.1)


def test_tokens_refill_with_time_up_to_the_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=100, burst=50, clock=clock)
    assert bucket.reserve(50) == 0
    clock.now += 0.25  # 25 tokens back
    assert bucket.reserve(25) == 0
    clock.now += 3600  # long idle: still only the burst saved up
    assert bucket.reserve(50) == 0
    assert bucket.reserve(1) == pytest.approx(0.01)


def test_a_reservation_larger_than_the_burst_waits_for_the_difference() -> None:
    clock = Clock()
    mib = 1024 * 1024
    bucket = TokenBucket(rate=mib, burst=mib, clock=clock)  # 1 MiB/s
    assert bucket.reserve(4 * mib) == pytest.approx(3.0)  # a 4 MiB chunk: 3 s over the burst
    assert bucket.reserve(mib) == pytest.approx(4.0)  # the next chunk waits behind it


def test_bytes_over_time_never_exceed_rate_times_time_plus_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=1000, burst=1000, clock=clock)
    delivered_by: list[tuple[float, int]] = []
    for size in [300, 700, 1200, 50, 5000, 10, 999] * 5:
        wait = bucket.reserve(size)
        delivered_by.append((clock.now + wait, size))
        clock.now += 0.05
    start, total = 1000.0, 0
    for at, size in sorted(delivered_by):
        total += size
        assert total <= 1000 * (at - start) + 1000 + 1e-6


# --- PriorityGate -----------------------------------------------------------------


async def test_gate_admits_up_to_its_limit_at_once() -> None:
    gate = PriorityGate(2)
    assert gate.try_acquire() and gate.try_acquire()
    assert not gate.try_acquire()
    gate.release()
    assert gate.try_acquire()


async def test_client_waiters_go_before_background_waiters() -> None:
    gate = PriorityGate(1)
    await gate.wait(Priority.CLIENT)  # held by someone
    order: list[str] = []

    async def one(name: str, level: Priority) -> None:
        await gate.wait(level)
        order.append(name)
        await asyncio.sleep(0)
        gate.release()

    # Background work queues first, clients arrive later: clients still go first.
    tasks = [asyncio.create_task(one(f"bg{i}", Priority.BACKGROUND)) for i in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(one(f"client{i}", Priority.CLIENT)) for i in range(3)]
    await asyncio.sleep(0)
    assert gate.queued == 6
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["client0", "client1", "client2", "bg0", "bg1", "bg2"]
    assert gate.held == 0


async def test_a_newcomer_cannot_barge_past_the_queue() -> None:
    gate = PriorityGate(1)
    await gate.wait(Priority.CLIENT)
    waiter = asyncio.create_task(gate.wait(Priority.BACKGROUND))
    await asyncio.sleep(0)
    gate.release()  # handed to the waiter, not back to the pool
    assert not gate.try_acquire()
    await waiter
    assert gate.held == 1


async def test_a_cancelled_waiter_leaves_the_queue_and_loses_no_slot() -> None:
    gate = PriorityGate(1)
    await gate.wait(Priority.CLIENT)
    gone = asyncio.create_task(gate.wait(Priority.CLIENT))
    stays = asyncio.create_task(gate.wait(Priority.BACKGROUND))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert gate.queued == 1
    gate.release()
    await stays
    gate.release()
    assert gate.held == 0


async def test_a_waiter_cancelled_after_being_handed_the_slot_passes_it_on() -> None:
    gate = PriorityGate(1)
    await gate.wait(Priority.CLIENT)
    first = asyncio.create_task(gate.wait(Priority.CLIENT))
    second = asyncio.create_task(gate.wait(Priority.CLIENT))
    await asyncio.sleep(0)
    gate.release()  # the slot goes to ``first``...
    first.cancel()  # ...which gives up before it runs again
    await asyncio.gather(first, return_exceptions=True)
    await second
    assert gate.held == 1
