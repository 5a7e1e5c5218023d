"""``first_of``: a request raced by a hedge when it stalls, bounded by a deadline.

The mechanism alone, on futures this test resolves; the origin-level behaviour
(a stalled GET hedged, a 503 at the deadline) is in ``test_faults.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.core import errors
from gateway.origins.resume import Patience, first_of


class Racers:
    """The primary and each backup as futures the test resolves; what was told."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.primary: asyncio.Future[str] = loop.create_future()
        self.backups: list[asyncio.Future[str]] = []
        self.hedged: list[bool] = []
        self.discarded: list[str] = []

    def backup(self) -> asyncio.Future[str]:
        self.backups.append(asyncio.get_running_loop().create_future())
        return self.backups[-1]

    async def discard(self, value: str) -> None:
        self.discarded.append(value)

    def race(self, hedge_after: float, deadline: float) -> asyncio.Task[str]:
        patience = Patience(hedge_after, deadline)
        return asyncio.ensure_future(
            first_of(self.primary, self.backup, patience, self.discard, self.hedged.append)
        )


async def test_an_answer_within_hedge_after_is_taken_without_a_hedge() -> None:
    racers = Racers()
    race = racers.race(hedge_after=5.0, deadline=10.0)
    await asyncio.sleep(0)
    racers.primary.set_result("primary")
    assert await race == "primary"
    assert racers.backups == [] and racers.hedged == [] and racers.discarded == []


@pytest.mark.parametrize("failure", [ConnectionResetError("reset"), TimeoutError("its own")])
async def test_a_primary_that_fails_at_once_fails_the_race_as_it_is(failure: Exception) -> None:
    racers = Racers()
    race = racers.race(hedge_after=5.0, deadline=10.0)
    await asyncio.sleep(0)
    racers.primary.set_exception(failure)
    with pytest.raises(type(failure)) as raised:
        await race
    assert raised.value is failure  # not taken for the deadline's timeout
    assert racers.backups == []


async def test_a_stalled_primary_is_hedged_and_the_backup_that_answers_first_wins() -> None:
    racers = Racers()
    race = racers.race(hedge_after=0.01, deadline=10.0)
    while not racers.backups:
        await asyncio.sleep(0.005)
    racers.backups[0].set_result("backup")
    assert await race == "backup"
    assert racers.hedged == [True]
    assert racers.primary.cancelled()


async def test_a_primary_that_answers_after_the_hedge_started_still_wins() -> None:
    racers = Racers()
    race = racers.race(hedge_after=0.01, deadline=10.0)
    while not racers.backups:
        await asyncio.sleep(0.005)
    racers.primary.set_result("primary")
    assert await race == "primary"
    assert racers.hedged == [False]
    assert racers.backups[0].cancelled()


async def test_nothing_by_the_deadline_is_origin_unavailable_and_both_are_cancelled() -> None:
    racers = Racers()
    with pytest.raises(errors.OriginUnavailable, match="no byte from the origin"):
        await racers.race(hedge_after=0.01, deadline=0.05)
    assert len(racers.backups) == 1
    assert racers.primary.cancelled() and racers.backups[0].cancelled()


async def test_no_hedge_when_the_deadline_comes_first() -> None:
    racers = Racers()
    with pytest.raises(errors.OriginUnavailable):
        await racers.race(hedge_after=1.0, deadline=0.02)
    assert racers.backups == []
    assert racers.primary.cancelled()
