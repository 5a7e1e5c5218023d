"""Packed blocks claimed in memory by a tier that writes its directory alone."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.cache.disk import DiskTier
from tests.test_disk_tier import read_back
from tests.test_packed_blocks import block_id, packed_tier, payload


@pytest.fixture
async def alone(tmp_path: Path) -> AsyncIterator[DiskTier]:
    tier = packed_tier(tmp_path / "cache", shared=False)
    await tier.start()
    yield tier
    await tier.close()


def parts(directory: Path) -> list[str]:
    return [p.name for p in (directory / "tmp").iterdir()]


async def test_a_packed_fill_alone_has_no_part_file_and_one_claim(alone: DiskTier, tmp_path):
    block = block_id("one")
    writer = await alone.begin(block, 4096)
    assert writer is not None
    assert parts(tmp_path / "cache") == []  # the claim is in memory
    assert await alone.begin(block, 4096) is None  # claimed: refused, as a part would be
    await writer.write(payload(block)[:1000])
    await writer.write(payload(block)[1000:])
    assert await writer.commit()
    assert parts(tmp_path / "cache") == []
    assert await read_back(alone, block) == payload(block)
    assert await alone.begin(block, 4096) is None  # indexed: nothing to fill


async def test_a_reader_alone_waits_for_the_claim_then_finds_the_block(alone: DiskTier):
    block = block_id("waited")
    writer = await alone.begin(block, 4096)
    assert writer is not None
    follow = asyncio.create_task(alone.follow(block))
    await asyncio.sleep(0.05)
    assert not follow.done()  # waiting on the claim, not reading a part
    await writer.write(payload(block))
    assert await writer.commit()
    assert await asyncio.wait_for(follow, 5) is None  # then ``get``, as after any follow
    assert await read_back(alone, block) == payload(block)


async def test_an_aborted_claim_alone_is_released_and_stores_nothing(alone: DiskTier):
    block = block_id("aborted")
    writer = await alone.begin(block, 4096)
    assert writer is not None
    await writer.write(payload(block)[:100])
    follow = asyncio.create_task(alone.follow(block))
    await writer.abort()
    await writer.abort()  # idempotent
    assert await asyncio.wait_for(follow, 5) is None
    assert await read_back(alone, block) is None
    with pytest.raises(ValueError):
        await writer.write(b"late")
    again = await alone.begin(block, 4096)  # the claim went with the abort
    assert again is not None
    await again.write(payload(block))
    assert await again.commit()
    assert await read_back(alone, block) == payload(block)


async def test_a_large_block_alone_still_fills_a_part_file(alone: DiskTier, tmp_path):
    block = block_id("large")
    writer = await alone.begin(block, 1 << 20)  # above packed_max: its own file
    assert writer is not None
    assert parts(tmp_path / "cache") == [f"{block.digest}.part"]
    await writer.abort()


async def test_a_second_process_alone_over_the_same_directory_claims_with_part_files(
    alone: DiskTier, tmp_path: Path, caplog
):
    other = packed_tier(tmp_path / "cache", shared=False)
    await other.start()
    try:
        block = block_id("second")
        writer = await other.begin(block, 4096)
        assert writer is not None
        assert parts(tmp_path / "cache") == [f"{block.digest}.part"]  # as siblings claim
        await writer.write(payload(block))
        assert await writer.commit()
        assert await read_back(alone, block) == payload(block)
    finally:
        await other.close()
    assert "another process uses" in caplog.text


async def test_siblings_hold_the_directory_shared_a_process_alone_exclusively(tmp_path: Path):
    directory = tmp_path / "cache"
    siblings = [packed_tier(directory), packed_tier(directory)]
    for tier in siblings:
        await tier.start()
    lock = os.open(directory / "disk.lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)  # one more sibling may join
        fcntl.flock(lock, fcntl.LOCK_UN)
        for tier in siblings:
            await tier.close()
        alone = packed_tier(directory, shared=False)
        await alone.start()
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            await alone.close()
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # closed: the directory is free
    finally:
        os.close(lock)
