"""The adaptive read-ahead window, driven by a controllable clock (no sleeps, no I/O)."""

from __future__ import annotations

import pytest

from gateway.read.readahead import ReadAheadPolicy
from tests.fakes import Clock


def policy(clock: Clock, initial: int = 2, maximum: int = 16, idle: float = 5.0) -> ReadAheadPolicy:
    return ReadAheadPolicy(initial, maximum, idle, clock=clock)


def test_grows_while_the_reader_catches_up_and_stops_at_the_maximum():
    clock = Clock()
    ahead = policy(clock)
    window = ahead.new()
    assert ahead.resume(window, sequential=True) == 2
    grown = [ahead.caught_up(window) for _ in range(5)]
    assert grown == [4, 8, 16, 16, 16]


def test_keeps_its_size_while_blocks_are_ready():
    clock = Clock()
    ahead = policy(clock)
    window = ahead.new()
    ahead.caught_up(window)
    for _ in range(10):
        clock.now += 0.1  # a steady reader that finds its blocks landed
        assert ahead.resume(window, sequential=True) == 4


def test_shrinks_to_initial_when_random():
    clock = Clock()
    ahead = policy(clock)
    window = ahead.new()
    ahead.caught_up(window)
    ahead.caught_up(window)
    assert ahead.resume(window, sequential=False) == 2


def test_shrinks_to_initial_after_idle_but_not_before():
    clock = Clock()
    ahead = policy(clock, idle=5.0)
    window = ahead.new()
    ahead.caught_up(window)
    ahead.caught_up(window)
    clock.now += 4.9
    assert ahead.resume(window, sequential=True) == 8
    clock.now += 5.1
    assert ahead.resume(window, sequential=True) == 2


def test_switched_off_stays_off_and_bounds_are_checked():
    clock = Clock()
    off = ReadAheadPolicy(0, 8, 5.0, clock=clock)
    window = off.new()
    assert off.caught_up(window) == 0
    with pytest.raises(ValueError):
        ReadAheadPolicy(8, 4, 5.0)
