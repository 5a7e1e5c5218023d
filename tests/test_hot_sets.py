"""A full hot set takes a new key in on its second sight (``core/hot_sets.py``'s ``Doorkeeper``).

A loader's epochs over a dataset wider than a set made the set keep every new
key and drop each before its next epoch asked for it: every read paid for the
keeping, none was answered from the set. These check the doorkeeper's rule,
then what it does to a real set (the presigned verdicts, ``auth.PresignedMemo``):
over epochs of a dataset more than twice as wide as the set, the set keeps what
it holds and answers it every epoch; a smaller working set come back to is
taken in by its next pass, the oldest out.
"""

from __future__ import annotations

from multidict import CIMultiDict

from gateway.core.hot_sets import Doorkeeper
from gateway.s3.auth import ANONYMOUS, PresignedMemo, Principal
from gateway.s3.sigv4 import RequestView

READER = Principal("reader", None, None, False)


def test_a_key_is_admitted_on_its_second_sight_not_its_first() -> None:
    door = Doorkeeper(8)
    assert [door.admits(key) for key in ("a", "b", "a", "b", "a")] == [
        False, False, True, True, False,  # admitted, its sight is spent: "a" is new again
    ]  # fmt: skip


def test_first_sights_are_forgotten_together_past_the_bound() -> None:
    door = Doorkeeper(3)
    for key in ("a", "b", "c"):
        assert not door.admits(key)
    assert not door.admits("d")  # the fourth first sight: the three before are forgotten
    assert not door.admits("a")
    assert door.admits("d")


def _target(i: int) -> str:
    return f"/bucket/obj-{i:03d}?X-Amz-Expires=60&X-Amz-Signature=s{i}&X-Amz-SignedHeaders=host"


def _key(i: int) -> tuple[str, str, str, str]:
    path, _, query = _target(i).partition("?")
    key = PresignedMemo.key(RequestView("GET", path, query, CIMultiDict({"Host": "h"})))
    assert key is not None
    return key


def _epoch(memo: PresignedMemo, keys: range) -> int:
    """Each key read once, as the authenticator reads the memo (a miss is verified and
    remembered): the reads the memo answered."""
    answered = 0
    for i in keys:
        key = _key(i)
        if memo.get(key) is not None:
            answered += 1
        else:
            query = _target(i).partition("?")[2] + "&X-Amz-Date=20261130T000000Z"
            memo.remember(key, query, READER)
    return answered


def _memo(limit: int) -> PresignedMemo:
    return PresignedMemo(lambda: 0.0, limit)  # a clock long before every URL's expiry


def test_epochs_over_a_dataset_wider_than_the_set_are_answered_from_what_it_holds() -> None:
    memo = _memo(4)
    assert _epoch(memo, range(10)) == 0  # the first epoch: the first four are kept
    # Every later epoch: the four kept are answered; the six others pass through, each
    # forgotten before it comes back (more than twice the set's width).
    assert [_epoch(memo, range(10)) for _ in range(3)] == [4, 4, 4]
    assert len(memo) == 4


def test_a_working_set_that_fits_is_taken_in_by_its_next_pass() -> None:
    memo = _memo(4)
    _epoch(memo, range(100, 104))  # a full set of keys no longer read
    assert _epoch(memo, range(3)) == 0  # first sight: noted, not kept
    assert _epoch(memo, range(3)) == 0  # second: taken in, the oldest out
    assert _epoch(memo, range(3)) == 3
    assert len(memo) == 4


def test_anonymous_callers_are_never_remembered() -> None:
    memo = _memo(4)
    memo.remember(_key(0), _target(0).partition("?")[2], ANONYMOUS)
    assert len(memo) == 0
