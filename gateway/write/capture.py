"""Write-through capture: the bytes of an upload kept, within a budget, as they stream by.

A PutObject's verified body is teed into a ``Capture`` on its way to the
origin, so the block cache can be filled with the same bytes afterwards
(``Writer`` does that once the origin has answered). Capturing never changes
what is sent or when, never waits for room (a ``Budget`` grants at once or
refuses), and gives its room back as soon as it stops keeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator


class Budget:
    """Bytes of uploads held in memory for write-through at once: granted at once or refused.

    Never waits: an upload that finds no room is simply not written through.
    Not thread-safe: one event loop owns it (so the bound is per worker process).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.capacity:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


class Capture:
    """The bytes of one upload, kept as they pass to the origin, while they fit.

    ``tee(body)`` yields every piece of ``body`` unchanged and when ``body``
    yields it; the piece is kept by reference (pieces are immutable bytes).
    Room is taken from ``budget`` up front for a declared length, else as
    pieces arrive; keeping stops for good, and bytes and room are given back,
    once the upload outgrows ``limit`` or the budget refuses. ``pieces()`` is
    the whole body only if the body ran to its end — for a verified body, the
    end comes only after every check has passed. ``release()`` when done.
    """

    def __init__(self, budget: Budget, limit: int, declared: int | None) -> None:
        self._budget = budget
        self._limit = limit
        self._kept: list[bytes] | None = []
        self._reserved = 0
        self.size = 0
        self.complete = False
        if declared is not None:
            if declared > limit or not budget.take(declared):
                self._kept = None
            else:
                self._reserved = declared

    @property
    def keeping(self) -> bool:
        return self._kept is not None

    def tee(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return _Tee(body, self)

    def keep(self, piece: bytes) -> None:
        if self._kept is None:
            return
        size = self.size + len(piece)
        grow = size - self._reserved
        if size > self._limit or (grow > 0 and not self._budget.take(grow)):
            self.release()
            return
        self._reserved = max(self._reserved, size)
        self._kept.append(piece if isinstance(piece, bytes) else bytes(piece))
        self.size = size

    def pieces(self) -> list[bytes] | None:
        return self._kept if self.complete else None

    def release(self) -> None:
        self._kept = None
        self._budget.give(self._reserved)
        self._reserved = 0


class _Tee:
    """``body``, with each piece also kept by a ``Capture``.

    A plain iterator, not an async generator: an abandoned async generator is
    finalised later by a task of its own (see ``origins/s3_forward.py``).
    """

    def __init__(self, body: AsyncIterator[bytes], capture: Capture) -> None:
        self._body = aiter(body)
        self._capture = capture

    def __aiter__(self) -> _Tee:
        return self

    async def __anext__(self) -> bytes:
        try:
            piece = await anext(self._body)
        except StopAsyncIteration:
            self._capture.complete = True
            raise
        self._capture.keep(piece)
        return piece
