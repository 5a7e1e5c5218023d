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


def test_each_block_is_read_ahead_once_while_the_stream_runs_on():
    """A block read ahead is not asked for again as the blocks before it are read (its
    check would open its file again): each read asks only the window's new blocks."""
    clock = Clock()
    ahead = policy(clock, initial=4)
    window = ahead.new()
    ahead.resume(window, sequential=False)
    asked = [list(ahead.ahead(window, index, limit=31)) for index in range(32)]
    assert asked[0] == [1, 2, 3, 4]
    assert asked[1] == [5] and asked[2] == [6]
    assert asked[28] == [] and asked[31] == []
    flat = [block for blocks in asked for block in blocks]
    assert flat == list(range(1, 32))  # every block after the first, once, in order
    ahead.caught_up(window)  # wider: the new window's far end, and only that
    assert list(ahead.ahead(window, 27, limit=40)) == list(range(32, 36))  # 27 + 8


def test_a_jump_or_a_pause_asks_for_the_window_again():
    """Read-ahead state is not trusted past a random read or an idle stream: what was read
    ahead then may have been evicted since."""
    clock = Clock()
    ahead = policy(clock, initial=2, idle=5.0)
    window = ahead.new()
    ahead.resume(window, sequential=True)
    assert list(ahead.ahead(window, 0, limit=9)) == [1, 2]
    ahead.resume(window, sequential=False)  # a jump back to the start
    assert list(ahead.ahead(window, 0, limit=9)) == [1, 2]
    assert list(ahead.ahead(window, 1, limit=9)) == [3]
    clock.now += 5.1
    ahead.resume(window, sequential=True)  # idle past the limit
    assert list(ahead.ahead(window, 2, limit=9)) == [3, 4]
    clock.now += 1.0
    ahead.resume(window, sequential=True)  # a steady reader keeps what it asked
    assert list(ahead.ahead(window, 3, limit=9)) == [5]


def test_read_ahead_stops_at_the_limit_and_when_off():
    clock = Clock()
    ahead = policy(clock, initial=4)
    window = ahead.new()
    assert list(ahead.ahead(window, 6, limit=8)) == [7, 8]
    assert list(ahead.ahead(window, 7, limit=8)) == []
    off = ReadAheadPolicy(0, 8, 5.0, clock=clock)
    assert list(off.ahead(off.new(), 0, limit=8)) == []
