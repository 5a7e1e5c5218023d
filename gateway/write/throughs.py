"""Write-through: the bytes of an upload handed to the read path once the origin has them.

A PutObject's body (up to the mount's ``write_through_max``) is teed as it
streams to the origin into a ``Capture`` (``capture.py``), within one
``Budget`` per process that refuses rather than waits. After the origin's 2xx
and the write's invalidation, and after the client has its answer, a
background task hands the bytes to ``Reader.write_through`` (one origin HEAD,
then blocks and metadata), which drops them if the key was invalidated again
meanwhile: the watch on the key starts before that task's HEAD, so a later
write of the key through this process is noticed (one between the two shows
in the HEAD's ETag).

A write-through is an optimisation: a failure is logged and costs a cold
read later, never the write.

Not guaranteed: bytes held by write-throughs under way count against the
budget until they end; a process stopped meanwhile drops them (``close``).
"""

from __future__ import annotations

import logging

from gateway.core import errors
from gateway.core.tasks import TaskSet
from gateway.origins.namespace import Mount
from gateway.read.reader import Reader
from gateway.write.capture import Budget, Capture

log = logging.getLogger(__name__)


class WriteThroughs:
    """The write-throughs of one process: captures within one budget, tasks under way."""

    def __init__(self, reader: Reader, buffer: int) -> None:
        self.reader = reader
        self.budget = Budget(buffer)
        self._tasks = TaskSet()

    def capture(self, mount: Mount, length: int | None) -> Capture | None:
        """A capture of an upload to ``mount`` if it may be written through and has room."""
        if mount.write_through_max <= 0 or length == 0:
            return None
        capture = Capture(self.budget, mount.write_through_max, length)
        return capture if capture.keeping else None

    def later(self, bucket: str, key: str, etag: str, capture: Capture) -> None:
        """Cache the captured upload in the background; the task now owns ``capture``.

        Called after the write's own invalidation (see the module docstring).
        """
        pieces = capture.pieces()
        if pieces is None or capture.size == 0:
            capture.release()
            return
        watch = self.reader.watch(bucket, key)

        async def run() -> None:
            try:
                await self.reader.write_through(bucket, key, etag, pieces, capture.size, watch)
            except errors.HoardError as exc:
                log.info("write-through of a %d-byte object skipped: %s", capture.size, exc)
            except Exception:
                log.exception("write-through of a %d-byte object failed", capture.size)
            finally:
                watch.close()
                capture.release()

        self._tasks.spawn(run())

    async def settle(self) -> None:
        """Wait until the write-throughs under way have ended."""
        await self._tasks.settle()

    async def close(self) -> None:
        """Stop the write-throughs under way (at shutdown)."""
        await self._tasks.cancel()
