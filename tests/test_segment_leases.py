"""Leases of packed records: lent again while nothing they were lent under has changed.

A read's ticket keeps a lease of its object's packed record
(``cache/segment_leases.py``) so a repeat skips the lookup. Checked here on a
real packed tier (real segment files, real SQLite): a lease lends the record's
bytes, one user of the segment's descriptor each; it runs out, and the lookup
decides, when the block is dropped, its segment unlinked, the file truncated
or changed in place; and its hits move the segment in the LRU order as the
lookup's do, batch after batch. The wire-level repeats (the express lane, the
hit path) are ``test_express_lane.py``'s.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from gateway.cache.block import BlockId
from gateway.cache.disk import DiskTier
from gateway.cache.segment_leases import Lease
from tests.test_packed_blocks import block_id, payload, segments, started, two_segments


async def _leased(tier: DiskTier, block: BlockId) -> Lease:
    """``block`` found by the lookup without an await, as a hit finds it, and its lease."""
    found = tier.get_held(block)
    if found is None:  # its place not yet known here: the lookup with an await first
        found = await tier.get(block)
        assert found is not None
        found.close()
        found = tier.get_held(block)
    assert found is not None
    found.close()
    lease = tier.lease(block)
    assert lease is not None
    return lease


def _lent_bytes(lease: Lease) -> bytes | None:
    lent = lease.again()
    if lent is None:
        return None
    with lent:
        return os.pread(lent.fd, lent.length, lent.data_offset)


async def test_a_lease_lends_the_records_bytes_one_user_each(tmp_path: Path) -> None:
    async with started(tmp_path / "cache") as tier:
        block = block_id("k")
        assert await tier.put(block, payload(block))
        lease = await _leased(tier, block)
        held = [lease.again() for _ in range(3)]
        assert all(lent is not None for lent in held)
        segment = held[0].segment  # type: ignore[union-attr]
        assert segment is not None and segment.users == 3
        for lent in held:
            assert lent is not None
            assert os.pread(lent.fd, lent.length, lent.data_offset) == payload(block)
            lent.close()
        assert segment.users == 0
        assert _lent_bytes(lease) == payload(block)


async def test_a_dropped_block_ends_its_lease(tmp_path: Path) -> None:
    async with started(tmp_path / "cache") as tier:
        block, kept = block_id("gone"), block_id("kept")
        for each in (block, kept):
            assert await tier.put(each, payload(each))
        leases = {each: await _leased(tier, each) for each in (block, kept)}
        assert await tier.drop_object("origin", "b", "gone") == 1
        assert leases[block].again() is None and tier.get_held(block) is None
        assert _lent_bytes(leases[kept]) == payload(kept)  # its segment's other records stay


async def test_a_segment_unlinked_or_truncated_ends_its_leases(tmp_path: Path) -> None:
    for damage in ("unlink", "truncate"):
        directory = tmp_path / damage
        async with started(directory) as tier:
            block = block_id("k")
            assert await tier.put(block, payload(block))
            lease = await _leased(tier, block)
            (path,) = segments(directory)
            if damage == "unlink":
                path.unlink()
            else:
                os.truncate(path, path.stat().st_size - 1)
            assert lease.again() is None
            assert await tier.get(block) is None  # and the lookup serves nothing of it


async def test_a_record_changed_in_place_is_checked_again_not_lent(tmp_path: Path) -> None:
    """Bytes changed in place change the file's fingerprint (set apart here with utime, as
    a write in another clock tick would): the lease runs out, and the lookup checks the
    record, finds it damaged and serves nothing."""
    directory = tmp_path / "cache"
    async with started(directory) as tier:
        block = block_id("k")
        assert await tier.put(block, payload(block))
        lease = await _leased(tier, block)
        (path,) = segments(directory)
        stat = path.stat()
        with open(path, "r+b") as segment_file:
            segment_file.seek(stat.st_size - 1)
            last = segment_file.read(1)
            segment_file.seek(stat.st_size - 1)
            segment_file.write(bytes([last[0] ^ 0xFF]))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert lease.again() is None
        assert await tier.get(block) is None


async def test_hits_through_a_lease_move_its_segment_batch_after_batch(tmp_path: Path) -> None:
    """As the lookup's hits do (``test_packed_blocks``): the segment read gets the latest
    hit time, in every batch of touches, the ones after a flush too."""
    directory = tmp_path / "cache"
    async with two_segments(directory) as (tier, blocks):
        lease = await _leased(tier, blocks[0])
        db = sqlite3.connect(directory / "index.sqlite3")

        def ages() -> list[float]:
            rows = db.execute("SELECT last_access FROM segments ORDER BY id").fetchall()
            return [when for (when,) in rows]

        for batch in range(2):
            before = ages()[0]
            assert _lent_bytes(lease) == payload(blocks[0])
            for _ in range(500):  # bounded: the touch flush runs every 10 ms
                first, second = ages()
                if first > max(second, before):
                    break
                await asyncio.sleep(0.01)
            assert first > max(second, before), batch
        db.close()
