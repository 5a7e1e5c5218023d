"""gateway/tasks.py: background tasks held, settled and cancelled together, driven by events."""

from __future__ import annotations

import asyncio

from gateway.core.tasks import TaskSet


async def test_a_task_is_held_until_it_ends_and_settle_waits_for_spawned_ones() -> None:
    tasks, release, order = TaskSet(), asyncio.Event(), []

    async def second() -> None:
        order.append("second")

    async def first() -> None:
        await release.wait()
        tasks.spawn(second())  # spawned while settle already waits
        order.append("first")

    tasks.spawn(first())
    assert len(tasks) == 1
    settling = asyncio.ensure_future(tasks.settle())
    await asyncio.sleep(0)  # one loop turn: settle is waiting on first
    assert not settling.done()
    release.set()
    await settling
    assert order == ["first", "second"] and len(tasks) == 0


async def test_cancel_stops_every_task_and_a_failure_stays_with_its_task() -> None:
    tasks, started = TaskSet(), asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    async def fails() -> None:
        raise ValueError("its own business")

    stuck = tasks.spawn(forever())
    failed = tasks.spawn(fails())
    await started.wait()
    await tasks.cancel()
    assert stuck.cancelled() and isinstance(failed.exception(), ValueError)
    assert len(tasks) == 0


async def test_a_named_task_is_found_until_it_ends_and_a_later_namesake_keeps_its_name() -> None:
    tasks, release = TaskSet(), asyncio.Event()
    first = tasks.spawn(release.wait(), name="job-1")
    assert "job-1" in tasks and tasks.get("job-1") is first
    # A second task under the name (a replay started again) replaces the first in the
    # lookup, and the first one ending must not remove it.
    second = tasks.spawn(asyncio.Event().wait(), name="job-1")
    release.set()
    await first
    await asyncio.sleep(0)  # the first task's done callbacks run
    assert tasks.get("job-1") is second
    tasks.stop()
    await asyncio.gather(second, return_exceptions=True)
    await asyncio.sleep(0)
    assert "job-1" not in tasks and tasks.get("job-1") is None and len(tasks) == 0
