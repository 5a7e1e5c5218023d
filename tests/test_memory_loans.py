"""The memory tier's loans: a block's bytes held by a borrower exactly while the tier holds them.

A hit repeated from a loan (``Reader.held_now`` through a ticket) checks one field
instead of looking the block up, so the tier must end every loan of a block the
moment the block leaves it, whichever way it leaves: evicted, discarded, replaced,
cleared, or lent to another borrower.
"""

from __future__ import annotations

from gateway.blocks.source import BlockSource
from gateway.cache.block import BlockId
from gateway.cache.memory import MemoryTier
from gateway.obs.events import BlockMetrics
from gateway.obs.metrics import Metrics
from gateway.origins.memory import MemoryOrigin
from gateway.pieces import BlockRef


def block(index: int) -> BlockId:
    return BlockId("o", "b", "k", '"e"', index)


def tier(capacity: int = 30) -> MemoryTier:
    memory = MemoryTier(capacity=capacity, max_item=10)
    for index in range(3):
        assert memory.put(block(index), bytes([index]) * 10)
    return memory


def test_a_loan_holds_the_blocks_bytes_while_the_tier_does() -> None:
    memory = tier()
    loan = memory.lend(block(1), 10)
    assert loan is not None and loan.data == b"\x01" * 10
    assert memory.lend(block(9), 10) is None  # not held: nothing to lend
    assert memory.lend(block(2), 11) is None  # not the size asked for
    memory.put(block(3), b"3" * 10)  # evicts block 0, the least recently used
    assert loan.data == b"\x01" * 10
    memory.put(block(4), b"4" * 10)  # evicts block 2: lending block 1 made it recent
    assert loan.data == b"\x01" * 10 and memory.get(block(2)) is None
    memory.put(block(5), b"5" * 10)  # now block 1
    assert loan.data is None and memory.get(block(1)) is None


def test_every_way_out_of_the_tier_ends_the_loan() -> None:
    memory = tier()
    discarded, replaced, dropped = (memory.lend(block(index), 10) for index in range(3))
    assert discarded and replaced and dropped
    memory.discard(block(0))
    assert discarded.data is None
    memory.put(block(1), b"n" * 10)  # the same name stored again: the old loan ends
    assert replaced.data is None and memory.get(block(1)) == b"n" * 10
    assert memory.discard_where(lambda key: key.index == 2) == 1
    assert dropped.data is None
    again = memory.lend(block(1), 10)
    assert again is not None and again.data == b"n" * 10
    memory.clear()
    assert again.data is None and len(memory) == 0


def test_one_loan_per_block_and_an_ended_one_holds_nothing() -> None:
    memory = tier()
    first = memory.lend(block(0), 10)
    second = memory.lend(block(0), 10)
    assert first is not None and second is not None
    assert first.data is None and second.data == b"\x00" * 10
    memory.discard(block(0))
    memory.put(block(0), b"z" * 10)  # back, under a new loan only
    assert second.data is None


def test_renewing_a_loan_marks_its_block_recent_and_an_ended_one_nothing() -> None:
    memory = tier()
    loan = memory.lend(block(0), 10)
    assert loan is not None
    memory.get(block(1))
    memory.get(block(2))  # block 0 is the least recent again
    memory.renew(loan)
    memory.put(block(3), b"3" * 10)  # evicts block 1, not the renewed block 0
    assert loan.data is not None and memory.get(block(1)) is None
    memory.discard(block(0))
    memory.renew(loan)  # ended: nothing to mark, no error
    assert memory.get(block(0)) is None


def test_a_loan_never_keeps_bytes_the_tier_let_go() -> None:
    """Under churn, the bytes reachable through loans are only bytes the tier holds."""
    memory = MemoryTier(capacity=50, max_item=10)
    loans = []
    for index in range(200):
        memory.put(block(index), bytes([index % 256]) * 10)
        loan = memory.lend(block(index), 10)
        assert loan is not None
        loans.append((index, loan))
    held = [(index, loan) for index, loan in loans if loan.data is not None]
    assert len(held) == len(memory) == 5
    assert all(memory.get(block(index)) == loan.data for index, loan in held)


async def test_blocks_lend_only_a_whole_unstaged_object() -> None:
    """``BlockSource.lend``: a staged block (admission kept it off the disk) is promoted by
    its second memory hit, counted hit by hit (``Staging.hit``), so it is never lent;
    nor is a block that is not the whole object asked for."""
    blocks = BlockSource(MemoryTier(1000, 100), None, BlockMetrics(Metrics()))
    origin = MemoryOrigin()
    staged, plain = (BlockRef(block(index), origin, 0, 9) for index in (0, 1))
    blocks._staging.stage(staged.block, b"s" * 10)
    blocks.memory.put(plain.block, b"p" * 10)
    assert blocks.memory.get(staged.block) == b"s" * 10
    assert blocks.lend(staged, 10) is None
    assert blocks.lend(plain, 11) is None  # block 0 is not all of an 11-byte object
    loan = blocks.lend(plain, 10)
    assert loan is not None and loan.data == b"p" * 10
