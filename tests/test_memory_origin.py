"""The in-package memory origin (gateway/origins/memory.py), and the read path over it on events.

The origin is checked against the protocol's promises (ranges, If-Match,
listing pages, domain errors); then 64 readers of one cold object are held
on the origin's ``hold`` event and released together: the reader asks the
origin once per block, which is coalescing proved by counting, in-process.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway.app.wiring import read_and_write
from gateway.blocks.source import BlockSource
from gateway.cache.disk import DiskTier
from gateway.cache.memory import MemoryTier
from gateway.core import errors
from gateway.metadata.memory import MetadataCache
from gateway.obs.events import BlockMetrics
from gateway.obs.metrics import Metrics
from gateway.origins.base import Origin
from gateway.origins.memory import MemoryOrigin
from gateway.origins.namespace import Mount, Namespace
from gateway.read.reader import Reader
from tests.inprocess import read_object

BLOCK = 64 * 1024

pytestmark = pytest.mark.timeout(30)


async def _body(origin: MemoryOrigin, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
    async with await origin.get_object("b", key, byte_range) as stream:
        return b"".join([chunk async for chunk in stream.chunks()])


async def test_it_is_an_origin_with_ranges_etags_and_domain_errors() -> None:
    origin = MemoryOrigin()
    assert isinstance(origin, Origin)
    data = os.urandom(3 * 1024 * 1024 + 5)
    info = origin.put("b", "k", data, "text/plain")
    assert await origin.head_object("b", "k") == info and info.size == len(data)
    assert await _body(origin, "k") == data
    assert await _body(origin, "k", (10, 20)) == data[10:21]
    assert await _body(origin, "k", (len(data) - 3, len(data) + 100)) == data[-3:]
    with pytest.raises(errors.RangeNotSatisfiable):
        await origin.get_object("b", "k", (len(data), len(data) + 1))
    with pytest.raises(errors.OriginChanged):
        await origin.get_object("b", "k", None, if_match='"not-the-etag"')
    with pytest.raises(errors.NoSuchKey):
        await origin.head_object("b", "missing")
    with pytest.raises(errors.NoSuchBucket):
        await origin.list_objects("nope")
    assert origin.calls["GetObject"] == 5 and origin.calls["HeadObject"] == 2


async def test_listings_page_and_roll_up_as_s3_does() -> None:
    origin = MemoryOrigin()
    for key in ("a/1", "a/2", "b", "c/x/1", "c/y"):
        origin.put("b", key, b"x")
    page = await origin.list_objects("b", delimiter="/", max_keys=2)
    assert [e.key for e in page.entries] == ["b"] and page.common_prefixes == ["a/"]
    assert page.is_truncated and page.next_marker == "b"
    last = await origin.list_objects("b", delimiter="/", start_after="b")
    assert last.entries == [] and last.common_prefixes == ["c/"] and not last.is_truncated
    flat = await origin.list_objects("b", prefix="c/")
    assert [e.key for e in flat.entries] == ["c/x/1", "c/y"]
    rest = await origin.list_objects("b", start_after="b")
    assert [e.key for e in rest.entries] == ["c/x/1", "c/y"]


async def _wired(
    tmp_path: Path, origin: MemoryOrigin, disk: DiskTier | None = None
) -> tuple[Reader, DiskTier]:
    mount = Mount(bucket="b", origin=origin, origin_bucket="b")
    metrics = Metrics()
    disk = disk or DiskTier(tmp_path / "cache", 64 * 1024 * 1024)
    await disk.start()
    blocks = BlockSource(MemoryTier(8 * 1024 * 1024, 16 * 1024), disk, BlockMetrics(metrics))
    return read_and_write(Namespace([mount]), blocks, MetadataCache(), metrics, BLOCK).reader, disk


async def test_64_readers_held_at_a_cold_origin_cost_one_get_per_block(tmp_path) -> None:
    origin = MemoryOrigin()
    data = os.urandom(3 * BLOCK + 100)  # four blocks
    origin.put("b", "shard", data)
    reader, disk = await _wired(tmp_path, origin)
    try:
        origin.hold.clear()
        readers = [asyncio.ensure_future(read_object(reader, "b", "shard")) for _ in range(64)]
        while origin.waiting == 0:  # the first reader's miss has reached the origin
            await asyncio.sleep(0)
        assert not any(r.done() for r in readers)
        origin.hold.set()
        bodies = await asyncio.gather(*readers)
        assert all(body == data for body in bodies)
        assert origin.calls["GetObject"] == 4, origin.calls
        assert origin.calls["HeadObject"] == 0
        origin.calls.clear()
        assert [await read_object(reader, "b", "shard") for _ in range(8)] == [data] * 8
        assert sum(origin.calls.values()) == 0  # served from the cache
    finally:
        await reader.blocks.close()
        await disk.close()


async def test_a_block_whose_write_met_a_full_disk_is_stored_once_room_is_made(
    tmp_path: Path, tiny_fs: Path
) -> None:
    """The file system fills long before the tier's bound; each time it does, the tier
    lowers its limit and evicts. The block whose write met the full disk is stored
    then, not left a hole among the most recent reads (they are read again first)."""
    origin = MemoryOrigin()
    bodies = {f"k{i:02d}": os.urandom(BLOCK) for i in range(40)}  # 2.5 MiB through 1 MiB
    for key, body in bodies.items():
        origin.put("b", key, body)
    reader, disk = await _wired(tmp_path, origin, DiskTier(tiny_fs / "cache", 1 << 30))
    try:
        for key, body in bodies.items():
            assert await read_object(reader, "b", key) == body
            (ref,) = await reader.block_refs("b", key)
            await reader.blocks.fills.settled(ref.block)  # its commit has returned
            found = await disk.get(ref.block)
            assert found is not None, f"{key} not on disk after {disk.rooms_made} full disks"
            found.close()
        assert disk.rooms_made >= 1  # the file system did fill, more than once likely
    finally:
        await reader.blocks.close()
        await disk.close()
