"""``python -m loadtest instructions``'s in-process half: every hit it counts is answered.

The count itself runs under valgrind (a minute a case, a benchmark's business);
what it counts must stay what it says: warm hits answered on the wire, by the
hit path and by the express lane, with each loop turn's deferred work done.
"""

from __future__ import annotations

import asyncio

import pytest

from loadtest import instructions


@pytest.mark.parametrize("entry", instructions.ENTRIES)
def test_the_counted_hits_are_all_answered_on_the_wire(entry: str) -> None:
    asyncio.run(instructions._inner("4k memory presigned", entry, 200))


def test_hits_of_a_dataset_wider_than_the_hot_sets_are_answered_on_the_wire() -> None:
    # 40 objects cycled through sets of 8: every hit is of a key the sets dropped.
    asyncio.run(instructions._inner("4k memory presigned", "answer_now", 120, 40, 8))


def test_a_case_it_does_not_know_is_refused() -> None:
    assert instructions.main(["--cases", "4k nowhere"]) == 2
