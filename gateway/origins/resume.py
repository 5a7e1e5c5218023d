"""GET bodies that survive breaks and stalls: resume from the next byte, hedge a stall.

An origin body can break after some of its bytes (a reset, a truncation, a
read timeout). Whoever reads it (a block fill) needs the rest, not the start
again: ``ResumingStream`` continues with a ranged GET from the next byte to the
end, with ``If-Match`` on the ETag of the first answer, so the rest is of the
same version or fails with ``OriginChanged`` — never a mix. A resume is a
retry: the guard decides it (tries, backoff, retry budget, breaker), and the
count of tries starts afresh whenever bytes flow again, so a body that keeps
making progress is never given up on, one that keeps failing at once is.

A request that delivers nothing for ``hedge_after`` seconds (the opening GET,
or the next chunk of a body) gets a second request for what is still missing,
a *hedged request* ("The Tail at Scale", Dean and Barroso, 2013; S3's
performance guidance advises the same for slow requests). The first to deliver
wins and the other is cancelled and closed. Nothing waits more than
``deadline`` seconds for its next byte, across tries, resumes and hedges: then
``OriginUnavailable``, which a client sees as a 503 before the response
headers, or as a cut body after them.

A chunk already here needs neither: the next read of a body whose bytes have
all arrived (``HeldStream.at_hand``: a small object's whole answer, usually
one segment) returns without waiting, so it is read as it is, without the
race's task and timers (a cold small object paid for two such races).

Not guaranteed: one hedge per stall (a hedge that stalls too is waited for,
up to the deadline), and none while requests queue for the origin's
concurrency slots, while the origin answers none of the reads waiting on it
(a stall, not a slow tail: ``stalls.py``) or when the hedge budget is spent; the deadline of a client's opening GET includes its wait
for a slot, and a background GET (warm, prefetch, read-ahead) has none until
its first byte (it may queue behind clients as long as they keep coming).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gateway.core import errors
from gateway.origins.base import ObjectStream

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Patience:
    """How long a read waits: until it hedges, and until it gives up (``inf``: never).

    ``may_hedge`` is asked before a hedge starts: an origin whose requests queue
    for a concurrency slot is slow because of us, and a hedge would only queue; one
    that answers none of the reads waiting on it is stalled (``stalls.py``).
    ``overdue()`` is entered by a read that waited ``hedge_after`` for nothing,
    before ``may_hedge`` is asked, and left when the read ends.
    """

    hedge_after: float
    deadline: float
    may_hedge: Callable[[], bool] = lambda: True
    overdue: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext


async def first_of(
    primary: Awaitable[T],
    backup: Callable[[], Awaitable[T]],
    patience: Patience,
    discard: Callable[[T], Awaitable[None]],
    hedged: Callable[[bool], None],
) -> T:
    """``primary``'s result, unless it gives nothing for ``hedge_after`` and
    ``backup()`` (started then) delivers first. The loser is cancelled, or
    ``discard``-ed if it finished anyway; ``hedged(backup_won)`` is told of a
    hedge. A failed racer leaves the other to finish; both failed raises the
    first failure. ``OriginUnavailable`` after ``deadline``.
    """
    give_up = asyncio.get_running_loop().time() + patience.deadline
    first = asyncio.ensure_future(primary)
    racers: set[asyncio.Future[T]] = {first}
    failures: list[BaseException] = []
    try:
        # Usually the primary answers within hedge_after (which ends before the
        # deadline): it is taken as it is, with this wait's one timer; the deadline's
        # timer and the race's loop are for the rest.
        done, _ = await asyncio.wait(
            racers, timeout=_seconds(min(patience.hedge_after, patience.deadline))
        )
        if done:
            racers.clear()  # taken below, outside this try: its failure goes on as it is
        else:
            with patience.overdue():  # from now until the race ends (stalls.py)
                async with asyncio.timeout_at(_seconds(give_up)):
                    hedging = patience.hedge_after < patience.deadline and patience.may_hedge()
                    if hedging:
                        racers.add(asyncio.ensure_future(backup()))
                    while racers:
                        finished, _ = await asyncio.wait(
                            racers, return_when=asyncio.FIRST_COMPLETED
                        )
                        racers -= finished
                        winner = next((task for task in finished if task.exception() is None), None)
                        failures += [e for task in finished if (e := task.exception()) is not None]
                        if winner is None:
                            continue
                        if hedging:
                            hedged(winner is not first)
                        for task in finished - {winner}:
                            if task.exception() is None:
                                await discard(task.result())
                        return winner.result()
    except TimeoutError:
        raise errors.OriginUnavailable(
            f"no byte from the origin in {patience.deadline:g}s"
        ) from None
    finally:
        await _cancel(racers, discard)
    if done:
        return first.result()
    raise failures[0]


async def within(deadline: float, work: Awaitable[T]) -> T:
    """``work``'s result, or ``OriginUnavailable`` after ``deadline`` seconds (``inf``: never)."""
    try:
        async with asyncio.timeout(_seconds(deadline)):
            return await work
    except TimeoutError:
        raise errors.OriginUnavailable(f"no answer from the origin in {deadline:g}s") from None


async def _cancel(racers: set[asyncio.Future[T]], discard: Callable[[T], Awaitable[None]]) -> None:
    if not racers:  # the usual end: the winner was taken out, nobody else ran
        return
    for task in racers:
        task.cancel()
    for outcome in await asyncio.gather(*racers, return_exceptions=True):
        if not isinstance(outcome, BaseException):
            await discard(outcome)  # it finished before the cancel reached it


def _seconds(value: float) -> float | None:
    return None if math.isinf(value) else value


class HeldStream(ObjectStream, Protocol):
    """An open GET that tells whether its next chunk (or its end) is at hand, so that
    reading it cannot wait for the origin (``guard.GuardedStream``)."""

    def at_hand(self) -> bool: ...


Reopen = Callable[[int], Awaitable[HeldStream]]  # the rest of the body from this byte
MayResume = Callable[[errors.HoardError, int], Awaitable[bool]]  # (failure, tries so far)


class ResumingStream:
    """An open GET whose body continues after a break (see the module docstring).

    ``reopen(first)`` opens bytes ``first``..``end`` with ``If-Match`` on this
    version; ``may_resume(failure, tries)`` is the guard's word on trying again
    (it waits out the backoff). ``pace(size)`` holds each chunk back as a
    bytes/s limit says, outside the time that counts as a stall.
    ``hedged(won)`` and ``resumed()`` count hedges and resumes.
    """

    def __init__(self, stream: HeldStream, reopen: Reopen, may_resume: MayResume,
                 patience: Patience, pace: Callable[[int], Awaitable[None]],
                 hedged: Callable[[bool], None], resumed: Callable[[], None]) -> None:  # fmt: skip
        self.info = stream.info
        self.start = stream.start
        self.end = stream.end
        self._current = stream
        self._chunks = aiter(stream.chunks())
        self._next_byte = stream.start
        self._reopen = reopen
        self._may_resume = may_resume
        self._patience = patience
        self._pace = pace
        self._hedged = hedged
        self._resumed = resumed
        self._tries = 1  # tries since bytes last flowed

    def chunks(self) -> AsyncIterator[bytes]:
        # Its own iterator, not an async generator: see S3ObjectStream.chunks.
        return self

    def __aiter__(self) -> ResumingStream:
        return self

    async def __anext__(self) -> bytes:
        while True:
            try:
                chunk = await self._next_chunk()
            except errors.OriginChanged:
                raise
            except errors.OriginUnavailable as exc:
                await self._resume(exc)
                continue
            if chunk is None:
                if self._next_byte > self.end:
                    raise StopAsyncIteration
                await self._resume(errors.OriginUnavailable("the origin body ended early"))
                continue
            self._next_byte += len(chunk)
            self._tries = 1
            await self._pace(len(chunk))
            return chunk

    async def _next_chunk(self) -> bytes | None:
        """The current body's next chunk (None at its end), hedged when it stalls."""
        if self._current.at_hand() or (
            math.isinf(self._patience.hedge_after) and math.isinf(self._patience.deadline)
        ):
            return await anext(self._chunks, None)
        outcome = await first_of(
            anext(self._chunks, None),
            lambda: self._reopen(self._next_byte),
            self._patience,
            _close_stream,
            self._hedged,
        )
        if isinstance(outcome, bytes) or outcome is None:
            return outcome
        await self._switch(outcome)  # the hedge won: its first chunk is already read
        return await anext(self._chunks, None)

    async def _resume(self, failure: errors.OriginUnavailable) -> None:
        """Continue from the next byte, or raise ``failure`` if the guard says no."""
        if not await self._may_resume(failure, self._tries):
            raise failure
        self._tries += 1
        await self._current.aclose()
        self._resumed()
        await self._switch(await self._reopen(self._next_byte))

    async def _switch(self, stream: HeldStream) -> None:
        if (stream.info.size, stream.info.etag) != (self.info.size, self.info.etag):
            await stream.aclose()  # (an origin that ignores If-Match)
            raise errors.OriginChanged(f"{self.info.key} changed at the origin during a read")
        if (stream.start, stream.end) != (self._next_byte, self.end):
            await stream.aclose()
            raise errors.OriginUnavailable("the origin answered a resume with another range")
        old, self._current = self._current, stream
        self._chunks = aiter(stream.chunks())
        await old.aclose()

    async def aclose(self) -> None:
        await self._current.aclose()

    async def __aenter__(self) -> ResumingStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _close_stream(outcome: object) -> None:
    if outcome is not None and not isinstance(outcome, bytes):
        await outcome.aclose()  # type: ignore[attr-defined]
