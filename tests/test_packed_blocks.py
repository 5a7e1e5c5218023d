"""Small blocks packed into segment files: real files, real SQLite, real processes."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.cache import segment_files, segment_trust
from gateway.cache.block import HEADER_SIZE, BlockId
from gateway.cache.disk import DiskTier
from tests.test_disk_tier import read_back

REPO = Path(__file__).resolve().parents[1]
SMALL = 4096
RECORD = HEADER_SIZE + SMALL


def block_id(key: str, index: int = 0) -> BlockId:
    return BlockId("origin", "b", key, "e1", index)


def payload(seed: object, size: int = SMALL) -> bytes:
    return random.Random(str(seed)).randbytes(size)


def segments(directory: Path) -> list[Path]:
    return sorted((directory / "segments").glob("*.seg"))


def segment_bytes(directory: Path) -> int:
    """The bytes of the segments on disk now; a segment eviction unlinks meanwhile counts 0
    (its rows are gone first, its file after, off the caller's path)."""
    total = 0
    for path in segments(directory):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def fill_up(filler: Path) -> None:
    """Write ``filler`` until its file system is full, as another program might."""
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(bytes(4096))


def cache_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


def packed_tier(directory: Path, capacity: int = 64 << 20, **kwargs: object) -> DiskTier:
    return DiskTier(directory, capacity, packed_max=64 << 10, **kwargs)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def started(directory: Path, **kwargs: object) -> AsyncIterator[DiskTier]:
    """A started packed tier over ``directory`` (one process's view of it), closed after."""
    tier = packed_tier(directory, **kwargs)  # type: ignore[arg-type]
    await tier.start()
    try:
        yield tier
    finally:
        await tier.close()


async def stored_and_closed(directory: Path, blocks: dict[BlockId, bytes]) -> None:
    """``blocks`` stored by a tier that then closes (a process before a restart)."""
    async with started(directory) as first:
        assert all(await asyncio.gather(*(first.put(b, data) for b, data in blocks.items())))


@pytest.fixture
async def tier(tmp_path: Path) -> AsyncIterator[DiskTier]:
    async with started(tmp_path / "cache") as tier:
        yield tier


async def test_small_blocks_share_one_segment_and_read_back_exactly(
    tier: DiskTier, tmp_path: Path
) -> None:
    blocks = [block_id(f"k{i}") for i in range(500)]
    stored = await asyncio.gather(*(tier.put(b, payload(b)) for b in blocks))
    assert all(stored)
    directory = tmp_path / "cache"
    assert len(segments(directory)) == 1
    assert not list((directory / "blocks").rglob("*")) or all(
        p.is_dir() for p in (directory / "blocks").rglob("*")
    )
    assert not list((directory / "tmp").iterdir())  # claims released once indexed
    for block in blocks:
        assert await read_back(tier, block) == payload(block)
    # disk bytes: data plus one header per record
    assert segments(directory)[0].stat().st_size == len(blocks) * RECORD
    assert tier.stats().used_bytes == len(blocks) * RECORD
    assert tier.stats().entries == len(blocks)


async def test_large_blocks_keep_their_own_files(tier: DiskTier, tmp_path: Path) -> None:
    large, small = block_id("large"), block_id("small")
    assert await tier.put(large, payload(large, 128 << 10))
    assert await tier.put(small, payload(small))
    files = list((tmp_path / "cache" / "blocks").rglob(large.digest))
    assert len(files) == 1
    assert await read_back(tier, large) == payload(large, 128 << 10)
    assert await read_back(tier, small) == payload(small)


async def test_restart_keeps_packed_blocks_and_a_fresh_process_finds_them(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    blocks = [block_id(f"r{i}") for i in range(50)]
    await stored_and_closed(directory, {b: payload(b) for b in blocks})
    async with started(directory) as second:
        for block in blocks:
            assert await read_back(second, block) == payload(block)
        assert second.stats().corrupt == 0


async def test_eviction_reclaims_whole_segments_and_holds_the_bound(tmp_path: Path) -> None:
    """A dataset 3x the bound: used bytes never exceed it; old segments are gone whole."""
    directory = tmp_path / "cache"
    capacity = 4 << 20  # 1 MiB segments (the smallest): a few segments in the bound
    tier = packed_tier(directory, capacity)
    await tier.start()
    try:
        count = 3 * capacity // RECORD
        for start in range(0, count, 64):
            batch = [block_id(f"e{i}") for i in range(start, min(count, start + 64))]
            await asyncio.gather(*(tier.put(b, payload(b)) for b in batch))
            on_disk = segment_bytes(directory)
            # the active segment's tail may run one segment ahead of the index
            assert on_disk <= capacity + (1 << 20)
            assert tier.stats().used_bytes <= capacity
        assert tier.stats().evictions > count // 2
        assert await read_back(tier, block_id("e0")) is None  # the oldest went
        last = block_id(f"e{count - 1}")
        assert await read_back(tier, last) == payload(last)
    finally:
        await tier.close()


async def test_flipped_bytes_are_dropped_counted_and_never_served(tier: DiskTier, tmp_path: Path):
    victim, neighbour = block_id("victim"), block_id("neighbour")
    assert await tier.put(victim, payload(victim))
    assert await tier.put(neighbour, payload(neighbour))
    assert await read_back(tier, victim) == payload(victim)  # verified once, kept open
    segment = segments(tmp_path / "cache")[0]
    with open(segment, "r+b") as f:  # the victim's record comes first
        f.seek(HEADER_SIZE + 100)
        f.write(bytes(b ^ 0xFF for b in payload(victim)[100:108]))
    assert await read_back(tier, victim) is None
    assert tier.stats().corrupt == 1
    assert await read_back(tier, victim) is None  # dropped from the index
    assert await read_back(tier, neighbour) == payload(neighbour)
    assert await tier.put(victim, payload(victim))  # refetched: appended anew
    assert await read_back(tier, victim) == payload(victim)


def counted_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The digests of the records checked (read back and checksummed) from now on."""
    checked: list[str] = []
    verify = segment_files.verify

    def counting(fd: int, block: BlockId, place: object) -> None:
        checked.append(block.digest)
        verify(fd, block, place)  # type: ignore[arg-type]

    monkeypatch.setattr(segment_files, "verify", counting)
    return checked


async def test_records_this_process_wrote_are_lent_unchecked_and_so_do_its_siblings(
    tier: DiskTier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = counted_checks(monkeypatch)
    blocks = [block_id(f"w{i}") for i in range(20)]
    assert all(await asyncio.gather(*(tier.put(b, payload(b)) for b in blocks)))
    for block in blocks:  # the bytes checksummed on their way in, unchanged since
        assert await read_back(tier, block) == payload(block)
    assert checked == []
    async with started(tmp_path / "cache") as sibling:  # another process's view of the same files
        for block in blocks:  # the writer vouched in the index for the file as it is
            assert await read_back(sibling, block) == payload(block)
        assert checked == []
        segment = segments(tmp_path / "cache")[0]
        with open(segment, "r+b") as f:  # someone else flips a byte of the first record
            f.seek(HEADER_SIZE + 7)
            f.write(bytes([payload(blocks[0])[7] ^ 0xFF]))
        os.utime(segment, ns=(1, 1))  # a fingerprint of its own, whatever the clock's grain
        assert await read_back(sibling, blocks[0]) is None
        assert [await read_back(sibling, b) for b in blocks[1:]] == [payload(b) for b in blocks[1:]]
        assert sorted(checked) == sorted(b.digest for b in blocks)  # each checked, once


async def test_a_vouch_from_before_the_boot_is_not_trusted(
    tier: DiskTier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a power cut a vouched-for record may be torn: a sibling started after a
    (pretended) reboot checks each record once, as without the writer's word."""
    checked = counted_checks(monkeypatch)
    blocks = [block_id(f"v{i}") for i in range(10)]
    assert all(await asyncio.gather(*(tier.put(b, payload(b)) for b in blocks)))
    monkeypatch.setattr(segment_trust, "booted_at", lambda: time.time() + 60)
    async with started(tmp_path / "cache") as sibling:
        assert [await read_back(sibling, b) for b in blocks] == [payload(b) for b in blocks]
    assert sorted(checked) == sorted(b.digest for b in blocks)


async def test_a_writer_that_found_its_segment_changed_vouches_for_nothing(
    tier: DiskTier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = counted_checks(monkeypatch)
    first, later = block_id("first"), block_id("later")
    assert await tier.put(first, payload(first))
    segment = segments(tmp_path / "cache")[0]
    os.utime(segment, ns=(1, 1))  # changed by someone else before the next append
    assert await tier.put(later, payload(later))
    async with started(tmp_path / "cache") as sibling:
        assert await read_back(sibling, first) == payload(first)
        assert await read_back(sibling, later) == payload(later)
    assert sorted(checked) == sorted([first.digest, later.digest])


async def test_a_segment_changed_by_someone_else_is_checked_even_after_later_appends(
    tier: DiskTier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = counted_checks(monkeypatch)
    victim, later = block_id("victim"), block_id("later")
    assert await tier.put(victim, payload(victim))
    segment = segments(tmp_path / "cache")[0]
    with open(segment, "r+b") as f:
        f.seek(HEADER_SIZE + 100)
        f.write(bytes(b ^ 0xFF for b in payload(victim)[100:108]))
    os.utime(segment, ns=(1, 1))  # a fingerprint of its own, whatever the clock's grain
    assert await tier.put(later, payload(later))  # the append sees the change
    assert await read_back(tier, later) == payload(later)
    assert await read_back(tier, victim) is None
    assert tier.stats().corrupt == 1
    assert sorted(checked) == sorted([victim.digest, later.digest])


async def test_a_batch_commits_on_the_loop_and_its_checkpoints_keep_the_log_small(
    tier: DiskTier, tmp_path: Path
) -> None:
    index = tier._index
    assert index._loop_writes is not None
    blocks = [block_id(f"c{i}") for i in range(60)]
    for block in blocks:  # one batch each: 60 commits, each adding pages to the log
        assert await tier.put(block, payload(block))
    assert index._loop_writes.commits == len(blocks)  # none waited for the thread
    if index._loop_writes.maintaining is not None:
        await index._loop_writes.maintaining
    wal = tmp_path / "cache" / "index.sqlite3-wal"
    assert wal.stat().st_size <= 512 << 10  # ~1.5 MiB without the thread's checkpoints
    # What the loop committed, another process reads.
    async with started(tmp_path / "cache") as second:
        assert [await read_back(second, b) for b in blocks] == [payload(b) for b in blocks]


async def test_a_batch_meeting_a_held_write_lock_commits_in_the_thread_once_it_frees(
    tier: DiskTier, tmp_path: Path
) -> None:
    index = tier._index
    assert index._loop_writes is not None
    first = block_id("first")  # its segment made, so the next block needs only its batch
    assert await tier.put(first, payload(first))
    sibling = sqlite3.connect(tmp_path / "cache" / "index.sqlite3", isolation_level=None)
    sibling.execute("BEGIN IMMEDIATE")  # a sibling process mid-transaction
    asyncio.get_running_loop().call_later(0.2, sibling.execute, "COMMIT")
    try:
        block = block_id("waited")
        assert await tier.put(block, payload(block))
    finally:
        if sibling.in_transaction:
            sibling.execute("ROLLBACK")
        sibling.close()
    assert index._loop_writes.commits == 1  # the first's: the loop did not wait, the thread did
    assert await read_back(tier, block) == payload(block)


async def test_truncated_segment_drops_the_cut_blocks_only(tier: DiskTier, tmp_path: Path):
    blocks = [block_id(f"t{i}") for i in range(10)]
    for block in blocks:  # in order: record i at offset i * RECORD
        assert await tier.put(block, payload(block))
    os.truncate(segments(tmp_path / "cache")[0], 5 * RECORD + 10)
    found = [await read_back(tier, b) for b in blocks]
    assert found[:5] == [payload(b) for b in blocks[:5]]
    assert found[5:] == [None] * 5
    assert tier.stats().corrupt == 5


async def test_segment_deleted_while_open_drops_its_blocks(tier: DiskTier, tmp_path: Path):
    blocks = [block_id(f"d{i}") for i in range(10)]
    assert all(await asyncio.gather(*(tier.put(b, payload(b)) for b in blocks)))
    assert await read_back(tier, blocks[0]) == payload(blocks[0])  # its descriptor is kept
    segments(tmp_path / "cache")[0].unlink()
    assert [await read_back(tier, b) for b in blocks] == [None] * 10
    assert tier.stats().corrupt == 10
    assert tier.stats().entries == 0


async def test_a_torn_tail_after_a_crash_is_dead_bytes_not_blocks(tmp_path: Path) -> None:
    """Bytes appended after the last indexed record (a crash mid-append) are never served."""
    directory = tmp_path / "cache"
    kept = block_id("kept")
    await stored_and_closed(directory, {kept: payload(kept)})
    with open(segments(directory)[0], "ab") as f:
        f.write(b"HOARDBLK" + os.urandom(1000))  # a torn record: header start, no row
    async with started(directory) as second:
        assert await read_back(second, kept) == payload(kept)
        assert second.stats().entries == 1


_APPENDER = """
import asyncio, random, sys
from pathlib import Path
from gateway.cache.block import BlockId
from gateway.cache.disk import DiskTier

async def main(directory, worker, count):
    tier = DiskTier(Path(directory), 64 << 20, packed_max=64 << 10)
    await tier.start()
    blocks = [BlockId("origin", "b", f"w{worker}-{i}", "e1", 0) for i in range(count)]
    stored = await asyncio.gather(*(
        tier.put(b, random.Random(b.key).randbytes(1000 + i)) for i, b in enumerate(blocks)))
    await tier.close()
    missing = [b.key for b, kept in zip(blocks, stored) if not kept]
    if missing:  # the test fails on the exit code, this says which and the log says why
        sys.exit(f"worker {worker}: not stored: {missing}")

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def test_workers_appending_at_once_never_interleave(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _APPENDER, str(directory), str(w), "300"], env=env)
        for w in range(3)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert len(segments(directory)) == 3  # one per worker process

    async def check() -> None:
        tier = packed_tier(directory)
        await tier.start()
        try:
            for w in range(3):
                for i in range(300):
                    block = block_id(f"w{w}-{i}")
                    want = random.Random(block.key).randbytes(1000 + i)
                    assert await read_back(tier, block) == want
            assert tier.stats().corrupt == 0
        finally:
            await tier.close()

    asyncio.run(check())


async def test_a_full_disk_while_appending_stores_nothing_torn_and_keeps_the_rest(
    tiny_fs: Path,
) -> None:
    tier = packed_tier(tiny_fs, 1 << 30)  # the file system runs out long before the bound
    await tier.start()
    try:
        stored: list[BlockId] = []
        for i in range(400):  # 400 x 16 KiB: six times the file system
            block = block_id(f"full{i}")
            if not await tier.put(block, payload(block, 16 << 10)):
                failed = block
                break
            stored.append(block)
        else:
            pytest.fail("the 1 MiB file system never filled up")
        assert stored, "not even one block fitted"
        assert await read_back(tier, failed) is None  # not indexed
        assert tier.limit < 1 << 20  # the full disk lowered the limit and evicted to it
        for block in stored:  # whatever is still indexed reads back whole
            found = await read_back(tier, block)
            assert found is None or found == payload(block, 16 << 10)
        assert tier.stats().corrupt == 0
        # caching goes on: new blocks replace old segments
        later = [block_id(f"later{i}") for i in range(8)]
        kept = [b for b in later if await tier.put(b, payload(b, 16 << 10))]
        assert kept and await read_back(tier, kept[-1]) == payload(kept[-1], 16 << 10)
    finally:
        await tier.close()


def _deny_commit(action: int, arg: str | None, *_: object) -> int:
    if action == sqlite3.SQLITE_TRANSACTION and arg == "COMMIT":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


async def test_a_batch_committed_on_the_loop_stands_when_its_eviction_fails(
    tmp_path: Path,
) -> None:
    """The batch's rows are in; the eviction the thread then makes is refused (SQLite's
    authorizer, on the thread's connection only): the blocks stay stored and served."""
    directory = tmp_path / "cache"
    per_segment = (1 << 20) // RECORD  # segments of 1 MiB, the smallest
    capacity = 3 * per_segment * RECORD + 200 * RECORD  # crossed inside the 4th segment
    tier = packed_tier(directory, capacity)
    await tier.start()
    try:
        below = [block_id(f"b{i}") for i in range(3 * per_segment + 150)]
        for start in range(0, len(below), 64):
            chunk = below[start : start + 64]
            assert all(await asyncio.gather(*(tier.put(b, payload(b)) for b in chunk)))
        assert tier.stats().evictions == 0
        index = tier._index
        await index.run(index.read, lambda conn: conn.set_authorizer(_deny_commit))
        over = [block_id(f"o{i}") for i in range(64)]  # into the 4th segment, past the bound
        stored = await asyncio.gather(*(tier.put(b, payload(b)) for b in over))
        await index.run(index.read, lambda conn: conn.set_authorizer(None))
        assert all(stored)
        assert tier.stats().used_bytes > capacity  # the eviction did not happen
        assert [await read_back(tier, b) for b in over] == [payload(b) for b in over]
        assert tier.stats().corrupt == 0
        after = block_id("after")  # the next batch's eviction goes through
        assert await tier.put(after, payload(after))
        assert tier.stats().used_bytes <= capacity
    finally:
        await tier.close()


async def test_a_segment_the_index_refuses_stores_nothing_and_leaves_no_file(
    tier: DiskTier, tmp_path: Path
) -> None:
    """The first block needs a segment, whose row the index refuses: the block is not
    stored (the origin's bytes are served as they came), the put raises nothing, and
    the new file goes; once the index accepts again, caching goes on."""
    index = tier._index
    await index.run(index.read, lambda conn: conn.set_authorizer(_deny_commit))
    refused = block_id("refused")
    assert not await tier.put(refused, payload(refused))
    await index.run(index.read, lambda conn: conn.set_authorizer(None))
    assert segments(tmp_path / "cache") == []
    assert await read_back(tier, refused) is None
    assert await tier.put(refused, payload(refused))
    assert await read_back(tier, refused) == payload(refused)


async def test_a_full_disk_eviction_whose_commit_fails_removes_no_file_its_rows_name(
    tiny_fs: Path,
) -> None:
    """The rows of an eviction are committed before its files go: if that commit fails
    (made to fail here), every block the index still names is on disk and reads back."""
    tier = packed_tier(tiny_fs, 1 << 30)
    await tier.start()
    filler = tiny_fs / "filler"
    try:
        stored = [block_id(f"kept{i}") for i in range(8)]
        for block in stored:
            assert await tier.put(block, payload(block, 16 << 10))
        fill_up(filler)  # another program fills the file system
        index = tier._index  # the commit made to fail: SQLite's authorizer denies COMMIT
        await index.run(index.read, lambda conn: conn.set_authorizer(_deny_commit))
        extra = block_id("extra")
        assert not await tier.put(extra, payload(extra, 16 << 10))  # no room, no eviction
        await index.run(index.read, lambda conn: conn.set_authorizer(None))
        for block in stored:
            assert await read_back(tier, block) == payload(block, 16 << 10)
        assert tier.stats().corrupt == 0
        filler.unlink()  # room again: caching goes on
        later = [block_id(f"later{i}") for i in range(4)]
        kept = [b for b in later if await tier.put(b, payload(b, 16 << 10))]
        assert kept and await read_back(tier, kept[-1]) == payload(kept[-1], 16 << 10)
        assert tier.stats().corrupt == 0
    finally:
        await tier.close()


async def test_an_append_that_meets_a_full_disk_is_cut_from_its_segment(tiny_fs: Path) -> None:
    """A record half written when the file system filled is cut off: every byte of the
    segments on disk is an indexed record's (nothing was dropped one by one here)."""
    tier = packed_tier(tiny_fs, 1 << 30)  # no part file: the record meets the full disk
    await tier.start()
    filler = tiny_fs / "filler"
    try:
        stored = [block_id(f"cut{i}") for i in range(4)]
        for block in stored:
            assert await tier.put(block, payload(block, 16 << 10))
        await tier.flush()
        fill_up(filler)  # another program fills the file system...
        os.truncate(filler, filler.stat().st_size - 8192)  # ...but for two pages
        torn = block_id("torn")
        assert not await tier.put(torn, payload(torn, 16 << 10))  # 16 KiB into 8
        assert await read_back(tier, torn) is None
        await tier.flush()
        assert segment_bytes(tiny_fs) == tier.stats().used_bytes == 4 * (HEADER_SIZE + (16 << 10))
        for block in stored:
            assert await read_back(tier, block) == payload(block, 16 << 10)
    finally:
        await tier.close()


async def test_a_failed_group_commit_fails_the_records_after_it_and_cuts_them_off(
    tmp_path: Path,
) -> None:
    """A batch the index refuses is not stored, nor is what was appended to the same
    segment while it ran: each fails (the origin serves it), and their bytes leave the disk."""
    directory = tmp_path / "cache"
    tier = packed_tier(directory)
    await tier.start()
    try:
        kept = block_id("kept")
        assert await tier.put(kept, payload(kept))
        # The next commits are made to fail: SQLite's authorizer denies them, on the loop's
        # connection (tried first) and on the thread's (which the loop's failure asks).
        index = tier._index
        assert index._loop_writes is not None
        index._loop_writes._db.set_authorizer(_deny_commit)
        await index.run(index.read, lambda conn: conn.set_authorizer(_deny_commit))
        refused = [block_id(f"refused{i}") for i in range(6)]
        results = await asyncio.gather(*(tier.put(b, payload(b)) for b in refused))
        await index.run(index.read, lambda conn: conn.set_authorizer(None))
        index._loop_writes._db.set_authorizer(None)
        assert not any(results)
        for block in refused:
            assert await read_back(tier, block) is None
        assert await read_back(tier, kept) == payload(kept)
        await tier.flush()
        assert segment_bytes(directory) == tier.stats().used_bytes == RECORD
        again = [block_id(f"again{i}") for i in range(3)]  # caching goes on, in a new segment
        assert all(await asyncio.gather(*(tier.put(b, payload(b)) for b in again)))
        for block in [kept, *again]:
            assert await read_back(tier, block) == payload(block)
        await tier.flush()
        assert segment_bytes(directory) == tier.stats().used_bytes == 4 * RECORD
        assert tier.stats().corrupt == 0
    finally:
        await tier.close()


async def test_an_index_made_before_segments_written_gets_the_column_and_keeps_its_blocks(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "cache"
    blocks = [block_id(f"o{i}") for i in range(5)]
    await stored_and_closed(directory, {b: payload(b) for b in blocks})
    with contextlib.closing(sqlite3.connect(directory / "index.sqlite3")) as db:
        db.execute("ALTER TABLE segments DROP COLUMN written")  # as the previous version made it
    async with started(directory) as reopened:
        assert [await read_back(reopened, b) for b in blocks] == [payload(b) for b in blocks]
        more = block_id("more")
        assert await reopened.put(more, payload(more))
    with contextlib.closing(sqlite3.connect(directory / "index.sqlite3")) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(segments)")}
    assert "written" in columns


async def test_an_index_of_an_older_layout_is_started_over_never_misread(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    old = block_id("old")
    await stored_and_closed(directory, {old: payload(old)})
    with contextlib.closing(sqlite3.connect(directory / "index.sqlite3")) as db:
        db.execute("PRAGMA user_version = 0")  # what every index made before layouts says
    async with started(directory) as second:
        assert second.stats().entries == 0 and second.stats().used_bytes == 0
        assert await read_back(second, old) is None  # its row went with the old layout
        assert await second.put(old, payload(old))  # and it is cached anew
        assert await read_back(second, old) == payload(old)
        assert second.stats().corrupt == 0


@contextlib.asynccontextmanager
async def two_segments(directory: Path) -> AsyncIterator[tuple[DiskTier, list[BlockId]]]:
    """A started tier holding 300 records in two 1 MiB segments, its hits flushed to the
    index every 10 ms; and the records' blocks, oldest first."""
    tier = packed_tier(directory, capacity=32 << 20, segment_size=1 << 20, touch_interval=0.01)
    await tier.start()
    try:
        blocks = [block_id(f"k{i}") for i in range(300)]
        for block in blocks:
            assert await tier.put(block, payload(block))
        assert len(segments(directory)) == 2
        yield tier, blocks
    finally:
        await tier.close()


async def test_a_hit_moves_its_segment_in_the_lru_order_not_its_block_row(tmp_path: Path) -> None:
    """Hits are batched per segment: the segment of the block read gets the latest hit time
    (so it outlives a newer segment nobody reads); a packed block's own row stays without one."""
    directory = tmp_path / "cache"
    async with two_segments(directory) as (tier, blocks):
        db = sqlite3.connect(directory / "index.sqlite3")

        def ages() -> list[float]:
            rows = db.execute("SELECT last_access FROM segments ORDER BY id").fetchall()
            return [when for (when,) in rows]

        first, second = ages()
        assert first <= second  # the older segment was last written first
        for _ in range(20):
            assert await read_back(tier, blocks[0]) == payload(blocks[0])
        for _ in range(500):  # bounded: the touch flush runs every 10 ms
            first, second = ages()
            if first > second:
                break
            await asyncio.sleep(0.01)
        assert first > second
        packed_rows = db.execute("SELECT count(*) FROM blocks WHERE last_access IS NOT NULL")
        assert packed_rows.fetchone() == (0,)
        db.close()


async def test_hits_on_many_blocks_of_a_segment_reach_the_index_as_one(tmp_path: Path) -> None:
    """A hit on a packed block moves its segment's last use only, so a batch carries one
    entry per segment read (under its first block's digest), not one per block: 100 hits
    on 100 blocks of the older segment are one row, and it still outlives the newer one."""
    directory = tmp_path / "cache"
    tier = packed_tier(directory, capacity=32 << 20, segment_size=1 << 20, touch_interval=60.0)
    await tier.start()
    batches: list[dict[str, float]] = []
    touch = tier._index.touch

    async def counted(touches: dict[str, float]) -> None:
        batches.append(dict(touches))
        await touch(touches)

    tier._index.touch = counted  # type: ignore[method-assign]
    try:
        blocks = [block_id(f"k{i}") for i in range(300)]  # two 1 MiB segments
        for block in blocks:
            assert await tier.put(block, payload(block))
        for block in blocks[:100]:  # all in the first segment
            assert await read_back(tier, block) == payload(block)
        await tier.flush()
        assert [list(batch) for batch in batches] == [[blocks[0].digest]]
        db = sqlite3.connect(directory / "index.sqlite3")
        first, second = (w for (w,) in db.execute("SELECT last_access FROM segments ORDER BY id"))
        db.close()
        assert first > second
    finally:
        await tier.close()


async def test_an_eviction_after_a_batch_on_the_loop_sees_the_hits_before_it(
    tmp_path: Path,
) -> None:
    """A batch committed on the loop carries no hits, but the eviction it makes due runs
    after them: the older segment, read since, outlives the newer one nobody read."""
    directory = tmp_path / "cache"
    per_segment = (1 << 20) // RECORD
    capacity = 2 * per_segment * RECORD + 50 * RECORD
    tier = packed_tier(directory, capacity, segment_size=1 << 20, touch_interval=60.0)
    await tier.start()
    try:
        older = [block_id(f"s1-{i}") for i in range(per_segment)]
        newer = [block_id(f"s2-{i}") for i in range(per_segment)]
        more = [block_id(f"s3-{i}") for i in range(100)]  # a third segment, past the bound

        async def put_all(blocks: list[BlockId]) -> None:
            for start in range(0, len(blocks), 64):
                chunk = blocks[start : start + 64]
                assert all(await asyncio.gather(*(tier.put(b, payload(b)) for b in chunk)))

        await put_all(older)
        await put_all(newer)
        assert await read_back(tier, older[0]) == payload(older[0])  # a hit, not yet flushed
        await put_all(more)
        assert tier.stats().used_bytes <= capacity
        assert await read_back(tier, older[1]) == payload(older[1])
        assert await read_back(tier, newer[0]) is None
    finally:
        await tier.close()


async def test_a_block_file_whose_filler_died_before_its_row_is_taken_over(tmp_path: Path) -> None:
    """A filler killed between renaming its block file into place and indexing it left a
    file no row names: no read finds it, and (before) no later fill could store the block
    either. A claim now removes such a file and fills afresh; a file whose filler still
    holds it (its row on the way) is left alone."""
    directory = tmp_path / "cache"
    block, data = block_id("large"), payload("large", 128 << 10)  # its own file
    await stored_and_closed(directory, {block: data})
    final = next((directory / "blocks").rglob(block.digest))
    db = sqlite3.connect(directory / "index.sqlite3")
    with db:  # the filler died after the rename: the row never landed
        db.execute("DELETE FROM blocks WHERE digest = ?", (bytes.fromhex(block.digest),))
    db.close()
    tier = packed_tier(directory)  # a sibling, started within the recovery's grace period
    await tier.start()
    try:
        assert final.exists()
        assert await tier.get(block) is None  # a file without its row is no block
        # Its filler still holding it: the row is on the way, the claim gives way.
        holder = os.open(final, os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)
        try:
            assert not await tier.put(block, data)
            assert final.exists()
        finally:
            os.close(holder)
        # Nobody holds it: its filler died. The block is stored again, and read back.
        assert await tier.put(block, data)
        assert await read_back(tier, block) == data
    finally:
        await tier.close()


async def test_a_sibling_waits_for_the_row_of_a_block_file_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With packing on, a block file is found by its row, which lands after its rename: a
    sibling that asks in between finds no part to follow, no row to read and a claim it
    cannot take. It waits for the row rather than fetch the block a second time (the
    fill's origin GET); measured as one extra GET in a 40 MiB read by two workers."""
    block, length = block_id("renamed"), 256 << 10  # above packed_max: a file of its own
    data = payload("renamed", length)
    async with started(tmp_path / "cache") as filler, started(tmp_path / "cache") as sibling:
        gate = asyncio.Event()
        publish = filler._index.publish

        async def held_back(*args: object, **kwargs: object) -> object:
            await gate.wait()
            return await publish(*args, **kwargs)

        monkeypatch.setattr(filler._index, "publish", held_back)
        writer = await filler.begin(block, length)
        assert writer is not None
        await writer.write(data)
        committing = asyncio.create_task(writer.commit())
        try:
            final = tmp_path / "cache" / "blocks" / block.digest[:2] / block.digest
            deadline = time.monotonic() + 30
            while not final.exists():  # renamed in the filler's thread, then indexed
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            assert await sibling.begin(block, length) is None  # in place, its lock held
            following = asyncio.create_task(sibling.follow(block))
            await asyncio.sleep(0.05)
            assert not following.done()  # waiting for the row, not giving up on the block
        finally:
            gate.set()  # the filler's commit ends either way (the tiers close after it)
        assert await following is None
        assert await read_back(sibling, block) == data
        assert await committing
