"""The circuit breaker and the retry budget, on a controllable clock."""

from __future__ import annotations

import pytest

from gateway.origins.breaker import CircuitBreaker, State, Ticket
from gateway.origins.retry import Backoff, RetryBudget
from tests.fakes import Clock

pytestmark = pytest.mark.timeout(10)


def breaker(clock: Clock, changes: list[State] | None = None) -> CircuitBreaker:
    seen = changes if changes is not None else []
    return CircuitBreaker(3, 5.0, clock, on_change=seen.append)


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    b = breaker(Clock(500.0))
    for ok in (False, False, True, False, False):
        b.record(b.admit(), ok)
    assert b.state is State.CLOSED
    b.record(b.admit(), False)
    assert b.state is State.OPEN
    assert b.admit() is None


def test_open_then_one_probe_then_closed() -> None:
    clock, changes = Clock(500.0), []
    b = breaker(clock, changes)
    for _ in range(3):
        b.record(b.admit(), False)
    clock.now += 4.9
    assert b.admit() is None and b.retry_in == pytest.approx(0.1)
    clock.now += 0.1
    probe = b.admit()
    assert probe is Ticket.PROBE
    assert b.admit() is None  # one probe at a time
    b.record(probe, True)
    assert b.state is State.CLOSED and b.admit() is Ticket.NORMAL
    assert changes == [State.OPEN, State.HALF_OPEN, State.CLOSED]


def test_a_failed_probe_opens_it_again_for_a_full_period() -> None:
    clock, changes = Clock(500.0), []
    b = breaker(clock, changes)
    for _ in range(3):
        b.record(b.admit(), False)
    clock.now += 5
    b.record(b.admit(), False)
    assert b.state is State.OPEN and b.retry_in == pytest.approx(5.0)
    assert changes == [State.OPEN, State.HALF_OPEN, State.OPEN]


def test_an_abandoned_probe_lets_another_probe_through() -> None:
    clock = Clock(500.0)
    b = breaker(clock)
    for _ in range(3):
        b.record(b.admit(), False)
    clock.now += 5
    b.record(b.admit(), None)  # cancelled: says nothing about the origin
    assert b.state is State.HALF_OPEN
    assert b.admit() is Ticket.PROBE


def test_late_outcomes_of_requests_admitted_before_it_opened_are_ignored() -> None:
    clock = Clock(500.0)
    b = breaker(clock)
    slow = b.admit()
    for _ in range(3):
        b.record(b.admit(), False)
    b.record(slow, True)  # a success that started before the failures
    assert b.state is State.OPEN
    clock.now += 5
    probe = b.admit()
    b.record(slow, True)
    assert b.state is State.HALF_OPEN  # only the probe decides
    b.record(probe, True)
    assert b.state is State.CLOSED


def test_zero_failures_never_opens() -> None:
    b = CircuitBreaker(0, 5.0, Clock(500.0))
    for _ in range(100):
        b.record(b.admit(), False)
    assert b.state is State.CLOSED


# --- retry budget and backoff ------------------------------------------------------


def test_budget_allows_the_floor_plus_a_share_of_requests() -> None:
    clock = Clock(500.0)
    budget = RetryBudget(ratio=0.2, min_per_second=1.0, clock=clock)  # floor: 10 per 10 s
    for _ in range(100):
        budget.record_request()
    spent = 0
    while budget.try_spend():
        spent += 1
    assert spent == 10 + 20


def test_budget_window_slides() -> None:
    clock = Clock(500.0)
    budget = RetryBudget(ratio=0.5, min_per_second=0.0, clock=clock)
    for _ in range(10):
        budget.record_request()
    assert sum(budget.try_spend() for _ in range(10)) == 5
    clock.now += 11  # requests and retries of the old window are forgotten
    assert not budget.try_spend()
    for _ in range(4):
        budget.record_request()
    assert sum(budget.try_spend() for _ in range(10)) == 2


def test_full_jitter_backoff_doubles_its_ceiling_up_to_the_cap() -> None:
    top = Backoff(0.05, 1.0, rand=lambda: 1.0)
    assert [top.delay(n) for n in range(1, 7)] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0])
    assert Backoff(0.05, 1.0, rand=lambda: 0.0).delay(3) == 0.0
    assert Backoff(0.05, 1.0, rand=lambda: 0.5).delay(100) == pytest.approx(0.5)
