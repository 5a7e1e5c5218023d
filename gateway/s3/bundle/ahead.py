"""A bundle's keys, opened ahead of the stream and handed out in request order.

The archive must go out in the order the keys were asked, but the keys need
not be fetched in that order, nor one at a time: a cold key costs an origin
round trip, and a bundle of cold keys read one by one would pay every round
trip in turn. So a window of the next ``ahead`` keys is open at once. Each key
entering the window is first asked of ``Reader.held_now``: a whole one-block
object this node holds is answered there and then, with its bytes, and takes
no task (a warm bundle is a loop over held answers). Any other key gets a
task that opens it as a GET would (``Reader.held`` when only an await can tell
whether it is held, else ``open_object`` and ``ObjectRead.prime``), so a cold
key is filled through the ordinary coalesced fill: one origin GET per block,
shared with any concurrent GET of it, under the origin guard's limits. The
consumer takes the window's head, waiting for it if its task is not done,
and the window moves on by one.

What the window holds is bounded by ``ahead``: held answers (the cache's own
bytes, or a leased disk segment) and primed reads (their first piece). A
client that stops reading stops the consumer, and so the window.

In fail mode the held keys at the head of the list (up to the first that is not
held whole, and no more than a window) are opened by the lookup itself
(``held_first``): their held answers are the lookup, and the window starts
with them, so a warm batch is looked up once a key, not twice, and sends the
very versions it looked up.

A key that cannot be opened becomes ``Skipped`` with the S3 code of why
(``NoSuchKey``, ``AccessDenied``, ``ServiceUnavailable``...): nothing of it
was sent, so skip mode lists it and goes on. Whatever is still in the window
when the bundle ends early is cancelled, closed and released (``aclose``).

Reads through ``Reader``'s public calls count as GETs do: epoch-order
prefetch is told of every key (``Reader.observers``), auto-warm of every cold
one (``Reader.cold_reads``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.core import errors
from gateway.origins.base import ObjectInfo
from gateway.pieces import FileSegment, Piece
from gateway.read.object_read import ObjectRead
from gateway.read.reader import Reader
from gateway.s3.errors import from_domain

log = logging.getLogger(__name__)

AHEAD = 16  # keys open at once, at least (and at first): round trips overlapped
MAX_AHEAD = 64  # keys open at once, at most: small objects, many round trips overlapped
BUDGET = 16 * 1024 * 1024  # bytes the window is meant to hold, estimated from sizes seen


@dataclass(slots=True)
class Held:
    """A whole object of one block, held: its metadata, its bytes, the tier they are in."""

    info: ObjectInfo
    piece: Piece
    tier: str


@dataclass(frozen=True, slots=True)
class Skipped:
    reason: str  # the S3 error code of why


Opened = Held | ObjectRead | Skipped
_Slot = Held | Skipped | asyncio.Task[Held | ObjectRead]


class Ahead:
    """``keys`` of ``bucket`` opened up to ``ahead`` at a time, handed out in order."""

    def __init__(self, reader: Reader, bucket: str, keys: list[str], may_warm: bool,
                 before_wait: Callable[[], Awaitable[None]] | None = None,
                 first: Sequence[Held] = ()) -> None:  # fmt: skip
        """``may_warm``: whether the caller may warm ``bucket`` (its cold reads count for
        auto-warm, as its GETs' would); ``before_wait``: called before the consumer
        waits for a key not yet open; ``first``: the first keys' held answers, opened
        already (``held_first``), now this window's to send or release."""
        self._first = first
        self._reader = reader
        self._may_warm = may_warm
        self._bucket = bucket
        self._keys = keys
        self._before_wait = before_wait
        self._ahead = AHEAD
        self._seen = self._seen_bytes = 0  # objects opened, and their bytes
        self._next = 0
        self._window: deque[tuple[str, _Slot]] = deque()

    async def __aiter__(self) -> AsyncIterator[tuple[str, Opened]]:
        self._fill()
        while self._window:
            key, slot = self._window.popleft()
            self._fill()
            if isinstance(slot, asyncio.Task) and not slot.done() and self._before_wait:
                await self._before_wait()
            opened = await self._settled(slot)
            if not isinstance(opened, Skipped):
                self._saw(opened.info.size)
            yield key, opened

    def _saw(self, size: int) -> None:
        """One more object's size: the window is as wide as ``BUDGET`` holds at the mean."""
        self._seen += 1
        self._seen_bytes += size
        mean = max(1, self._seen_bytes // self._seen)
        self._ahead = min(MAX_AHEAD, max(AHEAD, BUDGET // mean))

    def _fill(self) -> None:
        while len(self._window) < self._ahead and self._next < len(self._keys):
            key = self._keys[self._next]
            opened = self._first[self._next] if self._next < len(self._first) else None
            self._next += 1
            self._window.append((key, opened or self._start(key)))

    def _start(self, key: str) -> _Slot:
        try:
            found = self._reader.held_now(self._bucket, key)
        except errors.HoardError as exc:
            return Skipped(from_domain(exc).code.name)
        if isinstance(found, tuple):
            return Held(*found)
        return asyncio.ensure_future(self._open(key, maybe_held=found))

    async def _open(self, key: str, maybe_held: bool) -> Held | ObjectRead:
        if maybe_held:
            found = await self._reader.held(self._bucket, key)
            if found is not None:
                return Held(*found)
        read = await self._reader.open_object(self._bucket, key, may_warm=self._may_warm)
        try:
            await read.prime()
        except BaseException:
            await read.aclose()
            raise
        return read

    @staticmethod
    async def _settled(slot: _Slot) -> Opened:
        if not isinstance(slot, asyncio.Task):
            return slot
        try:
            return await slot
        except errors.HoardError as exc:
            return Skipped(from_domain(exc).code.name)
        except Exception:
            log.exception("a bundle's key could not be opened")
            return Skipped("InternalError")

    async def aclose(self) -> None:
        """Cancel, close and release whatever the window still holds (and what of
        ``first`` it did not take yet)."""
        window, self._window = self._window, deque()
        window.extend((self._keys[i], self._first[i]) for i in range(self._next, len(self._first)))
        self._next = len(self._keys)
        tasks = [slot for _, slot in window if isinstance(slot, asyncio.Task)]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for _, slot in window:
            if isinstance(slot, asyncio.Task):
                if slot.cancelled() or slot.exception() is not None:
                    continue
                slot = slot.result()
            await close(slot)


def held_first(reader: Reader, bucket: str, keys: list[str]) -> list[Held]:
    """The held answers of ``keys``' first keys, in order, for as long as each one is
    held whole and they fit one window (``MAX_AHEAD`` keys, ``BUDGET`` bytes): fail
    mode's lookup of them, and then the stream's first window, without a second
    lookup of each. The caller sends or releases them (``Ahead``'s ``first``, ``close``)."""
    first: list[Held] = []
    total = 0
    for key in keys:
        if len(first) >= MAX_AHEAD or total >= BUDGET:
            break
        try:
            found = reader.held_now(bucket, key)
        except errors.HoardError:
            break  # looked up again by the caller, which says why
        if not isinstance(found, tuple):
            break
        first.append(Held(*found))
        total += first[-1].info.size
    return first


async def close(opened: Opened) -> None:
    """Let go of an opened key not (or not wholly) sent: its read closed, its lease released."""
    if isinstance(opened, ObjectRead):
        await opened.aclose()
    elif isinstance(opened, Held) and isinstance(opened.piece, FileSegment):
        opened.piece.release()
