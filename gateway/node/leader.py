"""Which worker of a node leads: the one holding an exclusive ``flock`` on one file.

Some work is the node's and must be done once per node, not once per worker:
probing the cluster's peers, following prefetch streams. The worker that holds
``cache.dir/node/leader`` locked does it. Taking the lock never blocks: a
worker that fails to take it is a standby and tries again every ``retry``
seconds. The kernel drops a lock when its holder exits, however it exits
(SIGKILL included), so a standby leads within ``retry`` seconds of the
leader's death, and there is never more than one leader: no lease to expire,
no clock to trust.

Not guaranteed: who leads (the first to try); that the leader's work is
continuous across a change of leader (the new one starts from what the old
one left in shared files, see ``gateway/node/__init__.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

RETRY = 0.5  # seconds between a standby's attempts to lead


class Leadership:
    """This worker's part in the node's leadership: leads, or stands by."""

    def __init__(self, path: Path, retry: float = RETRY) -> None:
        self._path = path
        self._retry = retry
        self._fd = -1
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def leads(self) -> bool:
        return self._fd >= 0

    def on_lead(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when this worker becomes the leader."""
        self._listeners.append(listener)

    def try_lead(self) -> bool:
        """Take the lock if nobody holds it; whether this worker leads now."""
        if self.leads:
            return True
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        log.info("this worker (pid %d) leads the node", os.getpid())
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # one broken listener must not stop the others
                log.exception("node leadership listener failed")
        return True

    def start(self) -> None:
        """Try to lead now, and keep trying in the background while standing by."""
        self.try_lead()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._stand_by())

    async def _stand_by(self) -> None:
        while True:
            await asyncio.sleep(self._retry)
            try:
                self.try_lead()
            except OSError as exc:  # the cache dir unwritable for a moment: try again
                log.warning("node leadership: %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._fd >= 0:
            os.close(self._fd)  # a sibling leads within its retry
            self._fd = -1
