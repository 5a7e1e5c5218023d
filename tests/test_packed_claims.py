"""Packed blocks claimed without part files: a digest in memory, a stripe across processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.cache.disk import DiskTier
from gateway.cache.packed_claims import PackedClaims
from tests.test_disk_tier import read_back
from tests.test_packed_blocks import REPO, block_id, payload, started


@pytest.fixture
async def tier(tmp_path: Path) -> AsyncIterator[DiskTier]:
    async with started(tmp_path / "cache") as tier:
        yield tier


@pytest.fixture
async def sibling(tmp_path: Path, tier: DiskTier) -> AsyncIterator[DiskTier]:
    """A second tier over the same directory: its own descriptor of the stripes, as a
    sibling worker has."""
    async with started(tmp_path / "cache") as other:
        yield other


def parts(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "tmp").glob("*.part"))


async def test_a_packed_fill_has_no_part_file_and_one_claim(tier: DiskTier, tmp_path):
    block = block_id("one")
    writer = await tier.begin(block, 4096)
    assert writer is not None
    assert parts(tmp_path / "cache") == []
    assert await tier.begin(block, 4096) is None  # claimed: refused
    await writer.write(payload(block)[:1000])
    await writer.write(payload(block)[1000:])
    assert await writer.commit()
    assert parts(tmp_path / "cache") == []
    assert await read_back(tier, block) == payload(block)
    assert await tier.begin(block, 4096) is None  # indexed: nothing to fill


async def test_a_reader_waits_for_the_claim_then_finds_the_block(tier: DiskTier):
    block = block_id("waited")
    writer = await tier.begin(block, 4096)
    assert writer is not None
    follow = asyncio.create_task(tier.follow(block))
    await asyncio.sleep(0.05)
    assert not follow.done()  # waiting on the claim, not reading a part
    await writer.write(payload(block))
    assert await writer.commit()
    assert await asyncio.wait_for(follow, 5) is None  # then ``get``, as after any follow
    assert await read_back(tier, block) == payload(block)


async def test_an_aborted_claim_is_released_and_stores_nothing(tier: DiskTier):
    block = block_id("aborted")
    writer = await tier.begin(block, 4096)
    assert writer is not None
    await writer.write(payload(block)[:100])
    follow = asyncio.create_task(tier.follow(block))
    await writer.abort()
    await writer.abort()  # idempotent
    assert await asyncio.wait_for(follow, 5) is None
    assert await read_back(tier, block) is None
    with pytest.raises(ValueError):
        await writer.write(b"late")
    again = await tier.begin(block, 4096)  # the claim went with the abort
    assert again is not None
    await again.write(payload(block))
    assert await again.commit()
    assert await read_back(tier, block) == payload(block)


async def test_a_large_block_still_fills_a_part_file(tier: DiskTier, tmp_path):
    block = block_id("large")
    writer = await tier.begin(block, 1 << 20)  # above packed_max: its own file
    assert writer is not None
    assert parts(tmp_path / "cache") == [f"{block.digest}.part"]
    await writer.abort()


async def test_a_sibling_is_refused_waits_for_the_commit_and_reads_the_record(
    tier: DiskTier, sibling: DiskTier
):
    block = block_id("shared")
    writer = await tier.begin(block, 4096)
    assert writer is not None
    assert await sibling.begin(block, 4096) is None  # the stripe is the first tier's
    follow = asyncio.create_task(sibling.follow(block))
    await asyncio.sleep(0.05)
    assert not follow.done()
    await writer.write(payload(block))
    assert await writer.commit()
    assert await asyncio.wait_for(follow, 5) is None
    assert await read_back(sibling, block) == payload(block)
    other = block_id("other")  # released: the stripe is anyone's again
    claimed = await sibling.begin(other, 4096)
    assert claimed is not None
    await claimed.abort()


async def test_a_sibling_whose_filler_gave_up_claims_the_block_itself(
    tier: DiskTier, sibling: DiskTier
):
    block = block_id("given up")
    writer = await tier.begin(block, 4096)
    assert writer is not None
    follow = asyncio.create_task(sibling.follow(block))
    await asyncio.sleep(0.02)
    await writer.abort()  # a failed fill: nothing indexed, the stripe free
    assert await asyncio.wait_for(follow, 5) is None
    assert await read_back(sibling, block) is None
    mine = await sibling.begin(block, 4096)
    assert mine is not None
    await mine.write(payload(block))
    assert await mine.commit()
    assert await read_back(tier, block) == payload(block)


async def test_a_claim_held_by_a_killed_process_is_free_at_once(tier: DiskTier, tmp_path):
    """The kernel drops a dead holder's stripe: a sibling claims the block, no timeout."""
    block = block_id("orphan")
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import asyncio, sys
            from pathlib import Path
            from tests.test_packed_blocks import block_id, packed_tier
            async def main():
                tier = packed_tier(Path({str(tmp_path / "cache")!r}))
                await tier.start()
                assert await tier.begin(block_id("orphan"), 4096) is not None
                print("claimed", flush=True)
                await asyncio.sleep(60)
            asyncio.run(main())
        """)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "claimed"
        assert await tier.begin(block, 4096) is None  # the child's stripe
        follow = asyncio.create_task(tier.follow(block))
        child.kill()
        child.wait()
        assert await asyncio.wait_for(follow, 5) is None
        writer = await tier.begin(block, 4096)
        assert writer is not None
        await writer.abort()
    finally:
        child.kill()
        child.wait()


async def test_blocks_whose_digests_share_twenty_bits_are_claimed_by_two_workers(tmp_path):
    """Stripes are the digest's first 32 bits: two digests alike in their low 20 of them
    (one stripe when there were 2**20) are claimed at once by two siblings; the same
    digest still is not."""
    first, second = "00012345" + "a" * 32, "00112345" + "b" * 32
    mine, theirs = PackedClaims(tmp_path / "claims"), PackedClaims(tmp_path / "claims")
    mine.open()
    theirs.open()
    try:
        assert mine.take(first)
        assert theirs.take(second)
        assert not theirs.take(first)
        mine.release(first)
        assert theirs.take(first)
        assert (tmp_path / "claims").stat().st_size == 0
    finally:
        mine.close()
        theirs.close()
