"""Test doubles shared by the suite: the few fakes that stand in for something no server can.

Time is the one thing tests cannot run for real without waiting on the wall
clock, which unit tests never do. Everything else has a real part here (moto
for S3, a real directory for posix, real Hoard processes and clients), so this
module stays small: a fake belongs here once two test files need it.
"""

from __future__ import annotations

import asyncio


class Clock:
    """Fake time: read by calling it, moved only by ``advance`` or ``sleep``.

    Pass it wherever a ``clock: Callable[[], float]`` (or a ``sleep``) is
    injected. ``sleep`` moves time forward instead of waiting, records how
    long was asked (``slept``) and yields to the loop once, so other tasks
    run as they would during a real sleep.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)
