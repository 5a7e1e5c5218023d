"""Who waits for an origin request: a client, or background work.

Origin protection (per-origin concurrency caps and rate limits) serves
client-driven misses before warm jobs, epoch-order prefetch and read-ahead,
so that preloading never makes a training step wait. The priority travels
with the asyncio task that will call the origin, in a ``ContextVar``: a task
started inside ``background()`` (``asyncio.create_task`` copies the context)
and everything it awaits runs at background priority, without a parameter
threaded through every layer between a warm job and ``Origin.get_object``.

A fill started at background priority and then joined by a client keeps the
priority it started with; the client waits for it at most as long as the
background request takes to get its turn.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from contextvars import ContextVar


class Priority(enum.IntEnum):
    """Lower runs first."""

    CLIENT = 0
    BACKGROUND = 1


_current: ContextVar[Priority] = ContextVar("hoard_origin_priority", default=Priority.CLIENT)


def current() -> Priority:
    """The priority of origin requests made from the running task."""
    return _current.get()


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Run the block (and tasks created inside it) at background priority."""
    token = _current.set(Priority.BACKGROUND)
    try:
        yield
    finally:
        _current.reset(token)
