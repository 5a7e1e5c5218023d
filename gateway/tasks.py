"""Background tasks that outlive the call that started them: kept, awaited and stopped together.

The event loop keeps only a weak reference to a task, so a task nobody holds
may be garbage-collected mid-flight (the asyncio documentation's warning, and
why aiohttp's file response keeps its futures). Every owner of background
work (a write-through after the answer, a disk commit that must finish even
if its caller is cancelled, a fill shared by many readers) needs the same
three things: hold each task until it ends, wait for all of them (tests,
shutdown), cancel all of them (shutdown). ``TaskSet`` is those three and
nothing more.

Not guaranteed: a task's exception is not logged or re-raised here; whoever
spawns work decides what its failure means (usually inside the coroutine).
Not thread-safe: one event loop owns a set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class TaskSet:
    """Strong references to running tasks, dropped as each one ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Awaitable[T]) -> asyncio.Future[T]:
        """Run ``work`` as a task held by this set until it ends."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def settle(self) -> None:
        """Wait until every task has ended, including tasks spawned meanwhile."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every task and wait for them to end (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
