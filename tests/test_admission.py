"""The admission doorkeeper: second miss within the window admits, a scan does not."""

from __future__ import annotations

import hashlib

from gateway.cache.admission import Doorkeeper


def digest(n: int) -> str:
    return hashlib.blake2b(str(n).encode(), digest_size=20).hexdigest()


def test_always_admits_everything():
    keeper = Doorkeeper("always", 10)
    assert all(keeper.admit(digest(n)) for n in range(100))


def test_second_miss_is_admitted_first_is_not():
    keeper = Doorkeeper("second_hit", 1000)
    assert not keeper.admit(digest(1))
    assert keeper.seen(digest(1))
    assert keeper.admit(digest(1))
    assert not keeper.seen(digest(2))  # asking does not record


def test_a_miss_is_forgotten_after_two_windows():
    keeper = Doorkeeper("second_hit", 100)
    assert not keeper.admit(digest(0))
    for n in range(1, 250):  # two and a half windows of other blocks
        keeper.admit(digest(n))
    assert not keeper.admit(digest(0))


def test_a_scan_of_distinct_blocks_is_mostly_refused():
    keeper = Doorkeeper("second_hit", 10_000)
    admitted = sum(keeper.admit(digest(n)) for n in range(10_000))
    assert admitted < 300  # Bloom false positives only (about 1% at a full window)
