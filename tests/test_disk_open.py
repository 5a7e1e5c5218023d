"""Kept descriptors of hot block files (``cache/disk_open.py``) inside a real disk tier."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.cache import disk_files
from gateway.cache.disk import DiskTier
from gateway.cache.disk_open import OpenBlocks
from tests.test_disk_tier import FILE, block_id, block_path, payload, read_back


@pytest.fixture
async def tier(tmp_path: Path) -> AsyncIterator[DiskTier]:
    tier = DiskTier(tmp_path, 64 * FILE, open_files=2)
    await tier.start()
    yield tier
    await tier.close()


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Block digests opened from the file system (the slow path a kept descriptor skips)."""
    opened: list[str] = []
    real = disk_files.open_block

    def counting(path: Path, block, verified=None):
        opened.append(block.digest)
        return real(path, block, verified)

    monkeypatch.setattr(disk_files, "open_block", counting)
    return opened


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


async def test_a_hot_block_is_opened_once(tier: DiskTier, opens: list[str]) -> None:
    block = block_id("hot")
    assert await tier.put(block, payload("hot"))
    for _ in range(5):
        assert await read_back(tier, block) == payload("hot")
    assert opens == [block.digest]


async def test_a_block_changed_after_it_was_kept_is_checked_again(
    tmp_path: Path, tier: DiskTier, opens: list[str]
) -> None:
    block = block_id("victim")
    assert await tier.put(block, payload("victim"))
    assert await read_back(tier, block) == payload("victim")
    path = block_path(tmp_path, block)
    with open(path, "r+b") as file:  # flip a data byte in place: same inode
        file.seek(FILE - 1)
        last = file.read(1)
        file.seek(FILE - 1)
        file.write(bytes([last[0] ^ 0xFF]))
    os.utime(path, ns=(1, 1))  # a later write, even within one timestamp tick

    assert await tier.get(block) is None
    assert tier.stats().corrupt == 1
    assert len(opens) == 2
    assert await tier.put(block, payload("victim"))
    assert await read_back(tier, block) == payload("victim")


async def test_a_block_removed_by_another_process_is_not_served(
    tmp_path: Path, tier: DiskTier
) -> None:
    block = block_id("gone")
    assert await tier.put(block, payload("gone"))
    assert await read_back(tier, block) == payload("gone")
    block_path(tmp_path, block).unlink()  # a sibling worker evicted it
    assert await tier.get(block) is None


async def test_dropping_a_block_closes_its_descriptor_after_the_last_reader(
    tier: DiskTier,
) -> None:
    block = block_id("dropped")
    assert await tier.put(block, payload("dropped"))
    assert await read_back(tier, block) == payload("dropped")
    sending = await tier.get(block)  # a response still sending from it
    assert sending is not None
    fd = sending.fd

    assert await tier.drop_object("origin", "b", "dropped") == 1
    assert is_open(fd)  # the response goes on: the bytes are still the block's
    assert os.pread(fd, sending.length, sending.data_offset) == payload("dropped")
    sending.close()
    assert not is_open(fd)
    assert await tier.get(block) is None


async def test_descriptors_are_bounded_least_recent_first(tier: DiskTier, opens: list[str]) -> None:
    blocks = [block_id(f"k{i}") for i in range(3)]
    for block in blocks:
        assert await tier.put(block, payload(block.key))
        assert await read_back(tier, block) == payload(block.key)
    descriptors = {int(fd) for fd in os.listdir("/proc/self/fd")}
    assert await read_back(tier, blocks[2]) == payload("k2")
    assert await read_back(tier, blocks[1]) == payload("k1")
    assert await read_back(tier, blocks[0]) == payload("k0")  # the one dropped for k2
    assert opens == [b.digest for b in blocks] + [blocks[0].digest]
    assert {int(fd) for fd in os.listdir("/proc/self/fd")} <= descriptors


async def test_sweep_gives_back_the_space_of_removed_files(tmp_path: Path, tier: DiskTier) -> None:
    block = block_id("swept")
    assert await tier.put(block, payload("swept"))
    found = await tier.get(block)
    assert found is not None
    fd = found.fd
    found.close()
    assert is_open(fd)  # kept
    block_path(tmp_path, block).unlink()
    await tier.flush()
    assert not is_open(fd)


async def test_large_blocks_are_not_kept(tmp_path: Path, opens: list[str]) -> None:
    tier = DiskTier(tmp_path, 64 * 1024 * 1024, open_files=8)
    await tier.start()
    try:
        block = block_id("large")
        data = payload("large", 2 * 1024 * 1024)
        assert await tier.put(block, data)
        assert await read_back(tier, block) == data
        assert await read_back(tier, block) == data
        assert opens == [block.digest, block.digest]
    finally:
        await tier.close()


def kept_files(tmp_path: Path, count: int) -> tuple[OpenBlocks, list[Path], list[int]]:
    """A table keeping ``count`` real files' descriptors, as verified block files."""
    table = OpenBlocks(entries=count, max_block=FILE)
    paths, fds = [], []
    for i in range(count):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x")
        fd = os.open(path, os.O_RDONLY)
        file = disk_files.BlockFile(fd, 0, 1, disk_files.fingerprint_of(os.fstat(fd)))
        table.keep(f"d{i}", file).close()  # kept, and handed back by its first user
        paths.append(path)
        fds.append(fd)
    return table, paths, fds


def test_a_sweep_checks_a_slice_and_the_next_goes_on_from_there(tmp_path: Path) -> None:
    table, paths, fds = kept_files(tmp_path, 10)
    for path in paths:
        path.unlink()
    # Each sweep closes at most its slice; a pass reaches every descriptor.
    assert [table.sweep(limit=4) for _ in range(3)] == [4, 4, 2]
    assert len(table) == 0
    assert not any(is_open(fd) for fd in fds)


def test_a_pass_skips_what_went_meanwhile_and_the_next_pass_sees_what_came(
    tmp_path: Path,
) -> None:
    table, paths, fds = kept_files(tmp_path, 6)
    assert table.sweep(limit=2) == 0  # a pass over d0..d5 begins
    table.forget(["d2", "d3"])  # dropped by this process meanwhile
    paths[5].unlink()
    assert table.sweep(limit=2) == 0  # d2 and d3: gone already, not checked
    assert table.sweep(limit=2) == 1  # d4, and d5's removed file
    assert not is_open(fds[5])
    assert is_open(fds[0]) and is_open(fds[4])
    paths[0].unlink()
    assert table.sweep(limit=8) == 1  # a new pass: d0, d1, d4
    assert len(table) == 2
