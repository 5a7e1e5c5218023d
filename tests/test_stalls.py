"""The stall watch: one slow read is a tail worth a hedge, reads the origin answers none of are a stall."""

from __future__ import annotations

from gateway.origins.stalls import HedgeBudget, StallWatch


def test_one_overdue_read_is_a_tail_two_unanswered_are_a_stall() -> None:
    watch = StallWatch()
    with watch.overdue():
        assert not watch.stalled()  # one slow read: hedge it
        with watch.overdue():
            assert watch.stalled()  # two, and nothing answered since: the origin stalls
        assert not watch.stalled()


def test_an_answer_after_a_read_went_overdue_makes_it_a_tail_again() -> None:
    watch = StallWatch()
    with watch.overdue():
        watch.delivered()  # the origin answered someone since this read went overdue
        with watch.overdue():
            assert not watch.stalled()  # only the newest read is unanswered
            with watch.overdue():
                assert watch.stalled()


def test_the_hedge_budget_is_a_share_of_the_requests_plus_a_floor() -> None:
    now = [0.0]
    budget = HedgeBudget(lambda: now[0])
    spent = 0
    while budget.try_spend():
        spent += 1
    assert spent == 5  # the floor: 0.5 a second over the 10 s window
    for _ in range(100):
        budget.record_request()
    extra = 0
    while budget.try_spend():
        extra += 1
    assert extra == 10  # 10 % of 100 requests
