"""Background tasks that outlive the call that started them: kept, awaited and stopped together.

The event loop keeps only a weak reference to a task, so a task nobody holds
may be garbage-collected mid-flight (the asyncio documentation's warning, and
why aiohttp's file response keeps its futures). Every owner of background
work (a write-through after the answer, a disk commit that must finish even
if its caller is cancelled, a fill shared by many readers) needs the same
three things: hold each task until it ends, wait for all of them (tests,
shutdown), cancel all of them (shutdown). ``TaskSet`` is those three, and a
name a task may be spawned under, for owners that must find one again (the
warm job to cancel, the one replay running per peer).

Not guaranteed: a task's exception is not logged or re-raised here; whoever
spawns work decides what its failure means (usually inside the coroutine).
Not thread-safe: one event loop owns a set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class TaskSet:
    """Strong references to running tasks, dropped as each one ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()
        self._named: dict[Hashable, asyncio.Future[Any]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: Hashable) -> bool:
        return name in self._named

    def get(self, name: Hashable) -> asyncio.Future[Any] | None:
        """The running task spawned under ``name``, if any."""
        return self._named.get(name)

    def spawn(self, work: Awaitable[T], name: Hashable | None = None) -> asyncio.Future[T]:
        """Run ``work`` as a task held by this set until it ends (findable by ``name``)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if name is not None:
            self._named[name] = task
            task.add_done_callback(lambda _: self._forget(name, task))
        return task

    def _forget(self, name: Hashable, task: asyncio.Future[Any]) -> None:
        if self._named.get(name) is task:  # not a later task spawned under the name
            del self._named[name]

    async def settle(self) -> None:
        """Wait until every task has ended, including tasks spawned meanwhile."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        """Ask every task to end (cancel it), without waiting."""
        for task in list(self._tasks):
            task.cancel()

    async def cancel(self) -> None:
        """Cancel every task and wait for them to end (at shutdown)."""
        self.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
