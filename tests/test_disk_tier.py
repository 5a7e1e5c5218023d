"""The disk tier against real files, real SQLite and real processes sharing one directory."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.cache.block import HEADER_SIZE, BlockId
from gateway.cache.disk import DiskTier, FillAbandoned
from gateway.cache.disk_index import THREAD_NAME, DiskIndex, IndexRow
from gateway.cache.segment_sql import Place

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16 * 1024
FILE = HEADER_SIZE + BLOCK  # what one block costs against capacity
STEP = 30.0  # upper bound for any single wait on another process


def block_id(key: str = "k", index: int = 0, *, etag: str = "e1", bucket: str = "b") -> BlockId:
    return BlockId("origin", bucket, key, etag, index)


def payload(seed: object, size: int = BLOCK) -> bytes:
    return random.Random(str(seed)).randbytes(size)


def block_path(directory: Path, block: BlockId) -> Path:
    return directory / "blocks" / block.digest[:2] / block.digest


def part_files(directory: Path) -> list[Path]:
    return list((directory / "tmp").glob("*.part"))


def bytes_in_blocks(directory: Path) -> int:
    total = 0
    for path in (directory / "blocks").glob("*/*"):
        with contextlib.suppress(FileNotFoundError):  # unlinked by an eviction meanwhile
            total += path.stat().st_size
    return total


async def read_back(tier: DiskTier, block: BlockId) -> bytes | None:
    found = await tier.get(block)
    if found is None:
        return None
    with found:
        return os.pread(found.fd, found.length, found.data_offset)


@pytest.fixture
async def tier(tmp_path: Path) -> AsyncIterator[DiskTier]:
    tier = DiskTier(tmp_path / "cache", 64 * FILE)
    await tier.start()
    yield tier
    await tier.close()


# -- one process -------------------------------------------------------------------


async def test_put_get_roundtrip_is_byte_exact(tier: DiskTier) -> None:
    block, data = block_id(), payload("roundtrip")
    assert await tier.get(block) is None
    assert await tier.put(block, data)
    found = await tier.get(block)
    assert found is not None
    with found:
        assert found.data_offset == HEADER_SIZE
        assert found.length == len(data)
        assert os.pread(found.fd, len(data) + 10, found.data_offset) == data
    stats = tier.stats()
    assert (stats.entries, stats.used_bytes) == (1, FILE)
    assert not part_files(tier.directory)


async def test_fsync_mode_roundtrip_and_restart(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 64 * FILE, fsync=True)
    await tier.start()
    assert await tier.put(block_id(), payload("durable"))
    await tier.close()
    tier = DiskTier(tmp_path, 64 * FILE, fsync=True)
    await tier.start()
    try:
        assert await read_back(tier, block_id()) == payload("durable")
    finally:
        await tier.close()


async def test_empty_block_roundtrip(tier: DiskTier) -> None:
    assert await tier.put(block_id("empty"), b"")
    assert await read_back(tier, block_id("empty")) == b""


async def test_writer_streams_in_chunks_and_rejects_short_commit(tier: DiskTier) -> None:
    data = payload("chunks", 600 * 1024)  # chunks above and below the thread threshold
    writer = await tier.begin(block_id("chunks"), len(data))
    assert writer is not None
    for start in range(0, len(data), 300 * 1024):
        await writer.write(data[start : start + 300 * 1024])
    assert await writer.commit()
    assert await read_back(tier, block_id("chunks")) == data

    writer = await tier.begin(block_id("short"), 100)
    assert writer is not None
    await writer.write(b"x" * 10)
    with pytest.raises(ValueError):
        await writer.commit()
    assert not part_files(tier.directory)
    assert await tier.get(block_id("short")) is None
    await writer.abort()  # idempotent


async def test_begin_returns_none_when_the_block_is_stored(tier: DiskTier) -> None:
    assert await tier.put(block_id(), payload(1))
    assert await tier.begin(block_id(), BLOCK) is None
    assert await tier.follow(block_id()) is None  # so the caller goes back to get()
    assert not part_files(tier.directory)


async def test_restart_serves_the_same_blocks(tmp_path: Path) -> None:
    first = DiskTier(tmp_path, 64 * FILE)
    await first.start()
    blocks = {block_id("k", i): payload(i) for i in range(5)}
    for block, data in blocks.items():
        assert await first.put(block, data)
    await first.close()

    second = DiskTier(tmp_path, 64 * FILE)
    await second.start()
    try:
        for block, data in blocks.items():
            assert await read_back(second, block) == data
        assert second.stats().entries == 5
        assert second.stats().used_bytes == 5 * FILE
    finally:
        await second.close()


def flip_data_byte(path: Path, other: Path) -> None:
    with path.open("r+b") as f:
        f.seek(HEADER_SIZE + 100)
        byte = f.read(1)
        f.seek(HEADER_SIZE + 100)
        f.write(bytes([byte[0] ^ 0x01]))


def truncate(path: Path, other: Path) -> None:
    os.truncate(path, HEADER_SIZE + BLOCK // 2)


def overwrite_header(path: Path, other: Path) -> None:
    with path.open("r+b") as f:
        f.write(b"\0" * HEADER_SIZE)


def wrong_identity(path: Path, other: Path) -> None:
    shutil.copyfile(other, path)  # a sound block, but another block's


@pytest.mark.parametrize(
    "damage", [flip_data_byte, truncate, overwrite_header, wrong_identity], ids=lambda f: f.__name__
)
async def test_corrupt_block_is_never_served(tmp_path: Path, damage) -> None:
    reports = []
    tier = DiskTier(tmp_path, 64 * FILE, on_corrupt=lambda: reports.append(1))
    await tier.start()
    try:
        victim, other = block_id("victim"), block_id("other")
        assert await tier.put(victim, payload("victim"))
        assert await tier.put(other, payload("other"))
        damage(block_path(tmp_path, victim), block_path(tmp_path, other))

        assert await tier.get(victim) is None
        assert not block_path(tmp_path, victim).exists()
        assert tier.stats().corrupt == 1
        assert reports == [1]
        assert tier.stats().entries == 1  # its index row went with it
        assert await read_back(tier, other) == payload("other")

        assert await tier.put(victim, payload("victim"))
        assert await read_back(tier, victim) == payload("victim")
    finally:
        await tier.close()


async def test_capacity_evicts_least_recently_used(tmp_path: Path) -> None:
    evicted: list[int] = []
    capacity = 4 * FILE
    tier = DiskTier(tmp_path, capacity, on_evict=evicted.append)
    await tier.start()
    try:
        favourite = block_id("favourite")
        assert await tier.put(favourite, payload("favourite"))
        for i in range(12):  # three times the capacity
            assert await tier.put(block_id("k", i), payload(i))
            assert tier.stats().used_bytes <= capacity
            assert bytes_in_blocks(tmp_path) <= capacity + FILE
            assert await read_back(tier, favourite) == payload("favourite")  # keep it hot

        survivors = [i for i in range(12) if await tier.get(block_id("k", i)) is not None]
        assert survivors == [9, 10, 11]  # the newest, next to the one kept hot
        assert tier.stats().entries == 4
        assert tier.stats().evictions == 9 == sum(evicted)
    finally:
        await tier.close()


async def test_touches_are_batched_and_reach_the_index(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 64 * FILE, touch_interval=0.01)
    await tier.start()
    try:
        assert await tier.put(block_id(), payload(1))
        db = sqlite3.connect(tmp_path / "index.sqlite3")
        (before,) = db.execute("SELECT last_access FROM blocks").fetchone()
        for _ in range(50):
            (await tier.get(block_id())).close()
        for _ in range(500):  # bounded: the flush loop runs every 10 ms
            (now,) = db.execute("SELECT last_access FROM blocks").fetchone()
            if now > before:
                break
            await asyncio.sleep(0.01)
        assert now > before
        db.close()
    finally:
        await tier.close()


async def test_block_larger_than_the_tier_is_refused(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, FILE - 1)
    await tier.start()
    try:
        assert not await tier.put(block_id(), payload(1))
        with pytest.raises(OSError) as raised:
            await tier.begin(block_id(), BLOCK)
        assert raised.value.errno == errno.EFBIG
    finally:
        await tier.close()


async def test_drop_object_and_prefix_drop_only_what_matches(tier: DiskTier) -> None:
    keep = [
        block_id("aXYb/1"),  # what an unescaped LIKE 'a%_b/%' would also match
        block_id("A%_b/1"),  # LIKE ignores ASCII case; S3 keys do not
        block_id("a%_b/1", bucket="other"),
        BlockId("elsewhere", "b", "a%_b/1", "e1", 0),
        block_id("a%_c/1"),
    ]
    prefixed = [block_id("a%_b/1"), block_id("a%_b/2", 3), block_id("a%_b/sub/x")]
    versions = [block_id("obj", 0), block_id("obj", 1), block_id("obj", 0, etag="e2")]
    for n, block in enumerate(keep + prefixed + versions):
        assert await tier.put(block, payload(n, 100))

    assert await tier.drop_object("origin", "b", "obj") == 3
    assert await tier.drop_prefix("origin", "b", "a%_b/") == 3
    assert await tier.drop_prefix("origin", "b", "nothing") == 0
    for block in prefixed + versions:
        assert await tier.get(block) is None
        assert not block_path(tier.directory, block).exists()
    for block in keep:
        assert await tier.get(block) is not None
    assert tier.stats().entries == len(keep)

    assert await tier.clear() == len(keep)
    assert tier.stats().entries == tier.stats().used_bytes == 0
    assert not list((tier.directory / "blocks").glob("*/*"))


async def test_what_leaves_the_index_says_how_many_bytes_its_files_hold(tmp_path: Path) -> None:
    # A full disk's room counts these bytes until their unlinks are done (disk_space).
    index = DiskIndex(tmp_path / "index.sqlite3")
    await index.open()
    try:
        own = [block_id(key, 0) for key in ("a/1", "a/2", "b/1", "b/2")]
        for n, block in enumerate(own):
            await index.publish(IndexRow(block, 100 * n, HEADER_SIZE + 100 * n), {}, 1 << 30)
        await index.add_segment("seg1")
        packed = block_id("a/packed")
        row = (packed.digest, packed.origin, packed.bucket, packed.key, packed.index, 10)
        await index.publish_packed([(row, Place("seg1", 0, 10, 0))], {"seg1": 5000}, {}, {},
                                   1 << 30)  # fmt: skip
        dropped = await index.drop_prefix("origin", "b", "a/")
        # Own files count their size; a packed block's bytes stay in its segment.
        assert (sorted(dropped.files), dropped.packed) == (sorted(b.digest for b in own[:2]),
                                                           [packed.digest])  # fmt: skip
        assert dropped.size == 2 * HEADER_SIZE + 100
        evicted = await index.evict_marking(0, 10)
        assert sorted(evicted.segments) == ["seg1"]
        assert evicted.size == 5000 + 2 * HEADER_SIZE + 500
        assert index.totals.used == 0
    finally:
        await index.close()


async def test_sqlite_runs_only_in_the_dedicated_thread(tier: DiskTier) -> None:
    seen: set[tuple[str, int]] = set()

    def trace(statement: str) -> None:
        seen.add((threading.current_thread().name, threading.get_ident()))

    await tier._index.run(lambda: tier._index._conn.set_trace_callback(trace))
    assert await tier.put(block_id(), payload(1))
    assert await read_back(tier, block_id()) == payload(1)
    await tier.flush()
    await tier.drop_prefix("origin", "b", "")
    await tier._index.run(lambda: tier._index._conn.set_trace_callback(None))

    assert seen, "no SQL was traced"
    assert len(seen) == 1
    ((name, ident),) = seen
    assert name.startswith(THREAD_NAME)
    assert ident != threading.get_ident()


async def test_start_removes_stale_parts_but_not_claimed_ones(tmp_path: Path) -> None:
    first = DiskTier(tmp_path, 64 * FILE)
    await first.start()
    claimed = await first.begin(block_id("claimed"), BLOCK)
    assert claimed is not None
    stale = tmp_path / "tmp" / f"{block_id('stale').digest}.part"
    stale.write_bytes(b"left by a crashed process")
    orphan = block_path(tmp_path, block_id("orphan"))  # a file whose row is gone
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"x" * 100)
    os.utime(orphan, (0, 0))
    young = block_path(tmp_path, block_id("young"))  # maybe a commit between rename and index
    young.parent.mkdir(parents=True, exist_ok=True)
    young.write_bytes(b"x" * 100)

    second = DiskTier(tmp_path, 64 * FILE)
    await second.start()
    try:
        assert not stale.exists()
        assert not orphan.exists()
        assert young.exists()
        assert claimed.path.exists()
        await claimed.write(payload("claimed"))
        assert await claimed.commit()
        assert await read_back(second, block_id("claimed")) == payload("claimed")
    finally:
        await second.close()
        await first.close()


# -- several processes ---------------------------------------------------------------

CHILD = r"""
import asyncio, json, random, sys
from pathlib import Path
from gateway.cache.block import BlockId
from gateway.cache.disk import DiskTier

def payload(seed, size):
    return random.Random(str(seed)).randbytes(size)

async def fill(tier, key, length):
    # claim one block, then write and commit on command from stdin
    block = BlockId("origin", "b", key, "e1", 0)
    data, written = payload(key, length), 0
    writer = await tier.begin(block, length)
    print("claimed" if writer else "busy", flush=True)
    for line in sys.stdin:
        if line.startswith("w"):
            n = int(line.split()[1])
            await writer.write(data[written:written + n])
            written += n
            print("ok", flush=True)
        elif line.startswith("c"):
            print(await writer.commit(), flush=True)
            return

async def many(tier, worker, count, size):
    # store distinct blocks; report the largest index total seen after a commit
    largest = stored = 0
    for i in range(count):
        block = BlockId("origin", "b", f"w{worker}/{i}", "e1", 0)
        stored += await tier.put(block, payload(block.key, size))
        largest = max(largest, tier.stats().used_bytes)
    print(json.dumps({"largest": largest, "stored": stored}), flush=True)

async def main():
    directory, capacity, mode, *args = sys.argv[1:]
    tier = DiskTier(Path(directory), int(capacity))
    await tier.start()
    try:
        if mode == "fill":
            await fill(tier, args[0], int(args[1]))
        else:
            await many(tier, *map(int, args))
    finally:
        await tier.close()

asyncio.run(main())
"""


class Child:
    """A process running CHILD against the same cache directory."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def spawn(cls, *args: object) -> Child:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, *map(str, args),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=env,
        )  # fmt: skip
        return cls(proc)

    async def line(self) -> str:
        raw = await asyncio.wait_for(self.proc.stdout.readline(), STEP)
        assert raw, f"child exited with {await self.proc.wait()}"
        return raw.decode().strip()

    async def ask(self, command: str) -> str:
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()
        return await self.line()

    async def finish(self) -> int:
        return await asyncio.wait_for(self.proc.wait(), STEP)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)


async def test_second_process_loses_the_claim_and_follows_the_fill(tier: DiskTier) -> None:
    block, length = block_id("shared"), 64 * 1024
    data = payload("shared", length)
    child = await Child.spawn(tier.directory, tier.capacity, "fill", "shared", length)
    try:
        assert await child.line() == "claimed"
        assert await tier.begin(block, length) is None
        follower = await tier.follow(block)
        assert follower is not None
        with pytest.raises(TimeoutError):  # the filler is alive, just slow
            await follower.wait_for(1, timeout=0.05)
        seen = 0
        for _ in range(4):
            assert await child.ask("w 16384") == "ok"
            available = await follower.wait_for(seen + 16384, timeout=STEP)
            assert available >= seen + 16384
            got = os.pread(follower.fd, available - seen, follower.data_offset + seen)
            assert got == data[seen:available]
            seen = available
        assert await child.ask("c") == "True"
        assert await follower.wait_for(length) == length  # complete, though renamed
        follower.close()
        assert await child.finish() == 0
        assert await read_back(tier, block) == data
        await tier.flush()  # totals from the other process's commit
        assert tier.stats().entries == 1
    finally:
        child.kill()


async def test_killed_filler_is_detected_and_its_part_taken_over(tier: DiskTier) -> None:
    block, length = block_id("doomed"), 64 * 1024
    data = payload("doomed", length)
    child = await Child.spawn(tier.directory, tier.capacity, "fill", "doomed", length)
    try:
        assert await child.line() == "claimed"
        assert await child.ask("w 20000") == "ok"
        follower = await tier.follow(block)
        assert follower is not None
        assert await follower.wait_for(20000) >= 20000
        child.kill()
        await child.finish()
        with pytest.raises(FillAbandoned):
            await follower.wait_for(length, timeout=STEP)
        follower.close()
    finally:
        child.kill()

    writer = await tier.begin(block, length)
    assert writer is not None
    assert os.fstat(writer.fd).st_size == HEADER_SIZE  # the stale data is gone
    await writer.write(data)
    assert await writer.commit()
    assert await read_back(tier, block) == data
    assert not part_files(tier.directory)


async def test_processes_filling_together_respect_the_capacity(tmp_path: Path) -> None:
    workers, count, capacity = 4, 25, 6 * FILE
    tier = DiskTier(tmp_path, capacity)
    await tier.start()
    children = [
        await Child.spawn(tmp_path, capacity, "many", w, count, BLOCK) for w in range(workers)
    ]
    try:
        running = [asyncio.ensure_future(child.line()) for child in children]
        while not all(r.done() for r in running):  # sample the disk while they fill
            # beyond the indexed bytes there are only files renamed and not yet
            # indexed, or evicted and not yet unlinked: one per process at most
            assert bytes_in_blocks(tmp_path) <= capacity + workers * FILE
            await asyncio.wait(running, timeout=0.005)
        reports = [json.loads(r.result()) for r in running]
        assert [await child.finish() for child in children] == [0] * workers
    finally:
        for child in children:
            child.kill()
    try:
        assert all(r["largest"] <= capacity for r in reports)
        assert sum(r["stored"] for r in reports) == workers * count
        assert bytes_in_blocks(tmp_path) <= capacity
        assert not part_files(tmp_path)
        db = sqlite3.connect(tmp_path / "index.sqlite3")
        total, rows = db.execute("SELECT sum(file_size), count(*) FROM blocks").fetchone()
        assert db.execute("SELECT used, entries FROM totals").fetchone() == (total, rows)
        db.close()
        assert total <= capacity
        for path in (tmp_path / "blocks").glob("*/*"):  # every file left is sound
            worker, i = next(
                (w, i) for w in range(workers) for i in range(count)
                if block_id(f"w{w}/{i}").digest == path.name
            )  # fmt: skip
            assert await read_back(tier, block_id(f"w{worker}/{i}")) == payload(f"w{worker}/{i}")
    finally:
        await tier.close()


# -- a full disk -----------------------------------------------------------------------


async def test_full_disk_fails_cleanly_then_evicts_and_keeps_caching(
    tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fulls: list[int] = []
    tier = DiskTier(tiny_fs, 1 << 30, on_full=lambda: fulls.append(1))  # the file system runs out
    await tier.start()
    try:
        stored = []
        for i in range(64):  # 64 x 64 KiB: four times the file system
            block, data = block_id("full", i), payload(i, 64 * 1024)
            if not await tier.put(block, data):
                break
            stored.append(i)
        else:
            pytest.fail("the 1 MiB file system never filled up")
        assert stored, "not even one block fitted"
        assert not part_files(tiny_fs)
        # The full disk lowered the limit below what the file system holds and evicted to it.
        assert len(fulls) == 1 and tier.limit < 1 << 20
        assert tier.stats().used_bytes <= tier.limit

        # ...so caching goes on: new blocks replace the least recently used ones. (On
        # this 1 MiB file system the index's log fills it again now and then; each time
        # the limit steps down once more.)
        kept = [
            i for i in range(64, 128) if await tier.put(block_id("full", i), payload(i, 64 * 1024))
        ]
        assert len(kept) >= 56, kept
        assert 1 < len(fulls) <= 8
        assert await read_back(tier, block_id("full", kept[-1])) == payload(kept[-1], 64 * 1024)
        assert await read_back(tier, block_id("full", stored[0])) is None  # evicted, not torn
        for path in (tiny_fs / "blocks").glob("*/*"):  # nothing half-written was published
            assert path.stat().st_size == HEADER_SIZE + 64 * 1024
        # One line for the failure and one for the eviction, not one per block.
        assert len([r for r in caplog.records if r.levelname == "ERROR"]) <= 2
    finally:
        await tier.close()


async def _limit_reaches(tier: DiskTier, wanted: int) -> None:
    """Until the tier's own limit is ``wanted`` (its flush loop re-measures the room)."""
    for _ in range(400):  # 20 s at most
        if tier.limit == wanted:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"the limit stayed at {tier.limit}, not {wanted}")


def _fill(directory: Path, keep_free: int) -> Path:
    """A filler file taking all but ``keep_free`` bytes of the file system."""
    stat = os.statvfs(directory)
    filler = directory / "filler"
    free = stat.f_bavail * stat.f_frsize
    # (the file system may round a little: what it refuses stays free)
    with open(filler, "wb") as out, contextlib.suppress(OSError):
        os.posix_fallocate(out.fileno(), 0, max(0, free - keep_free))
    return filler


async def test_the_limit_comes_back_when_the_file_system_gives_room_back(small_fs: Path) -> None:
    capacity = 4 << 20  # half the 8 MiB file system: the limit is the capacity
    tier = DiskTier(small_fs, capacity, touch_interval=0.05)
    await tier.start()
    try:
        size = 64 * 1024
        for i in range(48):  # 3 MiB stored
            assert await tier.put(block_id("before", i), payload(i, size))
        filler = _fill(small_fs, 0)  # another program takes every free byte
        for i in range(48):  # fills fail, the tier evicts to what the file system leaves
            await tier.put(block_id("during", i), payload(i, size))
        assert tier.limit < capacity * 3 // 4, tier.limit
        filler.unlink()  # ...and gives it all back
        await _limit_reaches(tier, capacity)
        for i in range(64):  # caching goes on up to the capacity, not the lowered limit
            assert await tier.put(block_id("after", i), payload(i, size))
        assert tier.stats().used_bytes > capacity * 3 // 4
    finally:
        await tier.close()


async def test_fills_in_flight_do_not_ratchet_the_limit_down(small_fs: Path) -> None:
    tier = DiskTier(small_fs, 1 << 30, touch_interval=0.05)  # the file system is the bound
    await tier.start()
    try:
        size = 256 * 1024  # 16 in flight are half the file system

        async def fill(worker: int) -> None:
            for i in range(16):
                await tier.put(block_id(f"w{worker}", i), payload((worker, i), size))

        await asyncio.gather(*(fill(worker) for worker in range(16)))  # 64 MiB through 8 MiB
        assert tier.rooms_made > 1  # the disk filled, more than once
        # Each full disk measured the same room: the limit holds most of the file system,
        # not 10% less per full disk (the fills in flight are the tier's own bytes, and so
        # are those renamed into place while their rows wait for the index's one writer).
        assert tier.limit >= (8 << 20) * 3 // 4, tier.limit
        assert tier.space.writing == 0
        assert tier.space.held() == tier.stats().used_bytes  # nothing left landed or unlinking
    finally:
        await tier.close()
