"""Small objects through Hoard's packed disk tier: real Hoard processes, several workers,
moto behind a counting proxy, segments damaged by the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from pathlib import Path

import aiohttp

from tests.conftest import seed
from tests.harness import HoardProcess, metric
from tests.origin_proxy import OriginProxy
from tests.test_block_cache import hoard_config

KiB = 1024
DLIO_RANGE = {"Range": "bytes=0-8388607"}  # what s3torchconnector asks of each object


def small_config(proxy: OriginProxy, workers: int = 2) -> dict:
    # A memory tier that keeps nothing of 4 KiB: every hit below is a disk hit.
    config = hoard_config(proxy, memory="1MiB", memory_item_max="1KiB", read_ahead=0)
    return {**config, "workers": workers}


def upload(bucket: str, count: int, size: int = 4 * KiB) -> dict[str, bytes]:
    """``count`` random objects of ``size`` in ``bucket`` at the origin: put in moto's
    store (``conftest.seed``), not PUT over HTTP, which cost ~15 ms an object here (12 s
    for the 768 of the bound test); what Hoard reads of them still goes over HTTP."""
    objects = {f"img/{i:05d}.jpg": os.urandom(size) for i in range(count)}
    seed(bucket, objects)
    return objects


async def _fetch_all(urls: list[str], concurrency: int) -> list[bytes]:
    limit = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(url: str) -> bytes:
            async with limit, session.get(url, headers=DLIO_RANGE) as answer:
                assert answer.status in (200, 206), await answer.text()
                return await answer.read()

        return await asyncio.gather(*(one(url) for url in urls))


def fetch_all(urls: list[str], concurrency: int = 16) -> list[bytes]:
    return asyncio.run(_fetch_all(urls, concurrency))


def wait_indexed(cache_dir: Path, count: int, timeout: float = 30.0) -> None:
    """Wait until the block index holds ``count`` rows: a fill's waiters are answered
    before its group commit, and until the commit every read of the block joins the
    fill, never reading the segment (so damage made before then is not seen)."""
    deadline = time.monotonic() + timeout
    rows = -1
    while time.monotonic() < deadline:
        uri = f"file:{cache_dir / 'index.sqlite3'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
            rows = db.execute("SELECT count(*) FROM blocks").fetchone()[0]
        if rows >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{rows} of {count} blocks indexed after {timeout}s")


def cache_files(cache_dir: Path) -> list[Path]:
    """Every file the cache keeps: not the processes' state beside it, which is a few files
    per process whatever the object count and changes as it is read: the node's shared
    state in ``node/`` (a leader lock, each live worker's stats part, rewritten through a
    temporary file every second) and the metrics of each process in ``prometheus-*/``."""

    def process_state(path: Path) -> bool:
        top = path.relative_to(cache_dir).parts[0]
        return top == "node" or top.startswith("prometheus-")

    return [p for p in cache_dir.rglob("*") if p.is_file() and not process_state(p)]


def segment_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "segments").glob("*.seg"))


def test_small_objects_cost_one_get_each_few_files_and_survive_a_restart(tmp_path, proxy, bucket):
    objects = upload(bucket, 400)
    node = HoardProcess(tmp_path, small_config(proxy)).start()
    cache_dir = Path(node.config["cache"]["dir"])
    urls = [f"{node.endpoint}/{bucket}/{key}" for key in objects]
    try:
        proxy.reset()
        assert fetch_all(urls) == list(objects.values())
        assert proxy.counts["GetObject"] == len(objects)  # one origin request per object
        assert proxy.counts["HeadObject"] == 0  # and no HEAD
        proxy.reset()
        assert fetch_all(urls) == list(objects.values())
        assert proxy.counts["GetObject"] == 0
        # one segment per worker, the index: not one file per object
        files = cache_files(cache_dir)
        assert len(segment_files(cache_dir)) <= 2
        assert len(files) <= 24, "\n".join(map(str, files))  # a few dozen, whatever the count
        payload = sum(len(d) for d in objects.values())
        assert sum(p.stat().st_size for p in segment_files(cache_dir)) <= 1.02 * payload
    finally:
        node.stop()
    node = HoardProcess(tmp_path, small_config(proxy)).start()
    urls = [f"{node.endpoint}/{bucket}/{key}" for key in objects]
    try:
        proxy.reset()
        assert fetch_all(urls) == list(objects.values())
        assert proxy.counts["GetObject"] == 0  # the restart kept the cache
    finally:
        node.stop()


def test_concurrent_cold_gets_across_workers_fetch_each_object_once(tmp_path, proxy, bucket):
    objects = upload(bucket, 60, 20 * KiB)
    node = HoardProcess(tmp_path, small_config(proxy, workers=3)).start()
    try:
        proxy.reset()
        urls = [f"{node.endpoint}/{bucket}/{key}" for key in objects for _ in range(6)]
        bodies = fetch_all(urls, concurrency=48)
        assert bodies == [data for data in objects.values() for _ in range(6)]
        # Workers coalesce through claims and tail each other's fills: at most one
        # GET per object, or two when a metadata miss raced a sibling's (as for any block).
        assert len(objects) <= proxy.counts["GetObject"] <= 2 * len(objects)
        proxy.reset()
        assert fetch_all(urls, concurrency=48) == bodies
        assert proxy.counts["GetObject"] == 0
    finally:
        node.stop()


def test_damaged_segments_are_dropped_counted_refetched_never_served(tmp_path, proxy, bucket):
    objects = upload(bucket, 40)
    node = HoardProcess(tmp_path, small_config(proxy, workers=1)).start()
    cache_dir = Path(node.config["cache"]["dir"])
    urls = [f"{node.endpoint}/{bucket}/{key}" for key in objects]
    try:
        fetch_all(urls, concurrency=1)  # in order: record i at i * (64 + 4096)
        assert fetch_all(urls) == list(objects.values())  # verified and kept open
        wait_indexed(cache_dir, len(objects))
        (segment,) = segment_files(cache_dir)
        with open(segment, "r+b") as f:  # flip bytes of the first object's data
            f.seek(64 + 10)
            first = f.read(8)
            f.seek(64 + 10)
            f.write(bytes(b ^ 0xFF for b in first))
        os.truncate(segment, 30 * (64 + 4 * KiB) + 100)  # and cut the last ten
        proxy.reset()
        assert fetch_all(urls) == list(objects.values())  # never the damaged bytes
        assert metric(node.endpoint, "hoard_cache_corrupt_blocks_total") == 11
        assert proxy.counts["GetObject"] == 11  # the damaged blocks were refetched
        proxy.reset()
        assert fetch_all(urls) == list(objects.values())
        assert proxy.counts["GetObject"] == 0  # ...and cached again

        wait_indexed(cache_dir, len(objects))
        for path in segment_files(cache_dir):  # deleted while open
            path.unlink()
        proxy.reset()
        assert fetch_all(urls) == list(objects.values())
        assert proxy.counts["GetObject"] == len(objects)
        assert metric(node.endpoint, "hoard_cache_corrupt_blocks_total") == 11 + len(objects)
    finally:
        node.stop()


def test_a_dataset_three_times_the_bound_stays_within_it(tmp_path, proxy, bucket):
    """Objects of 64 KiB (packed: at most ``packed_block_max``, 256 KiB): 16 a segment,
    and 192 cold GETs for three bounds' worth, where 16 KiB ones took 768 of them."""
    bound, size = 4 << 20, 64 * KiB
    objects = upload(bucket, 3 * bound // size, size)
    config = small_config(proxy, workers=2)
    config["cache"] = {**config["cache"], "size": bound}  # 1 MiB segments: the smallest
    node = HoardProcess(tmp_path, config).start()
    cache_dir = Path(node.config["cache"]["dir"])
    urls = [f"{node.endpoint}/{bucket}/{key}" for key in objects]
    bodies = list(objects.values())
    try:
        batch = bound // size  # a bound's worth, then a look at the disk
        for start in range(0, len(urls), batch):
            assert fetch_all(urls[start : start + batch]) == bodies[start : start + batch]
            on_disk = sum(p.stat().st_size for p in segment_files(cache_dir))
            # each worker's active segment may run up to one segment past its last commit
            assert on_disk <= bound + 2 * (1 << 20)
        assert metric(node.endpoint, 'hoard_cache_evictions_total{tier="disk"}') > 0
        proxy.reset()
        last = (1 << 20) // size  # the last MiB read is still cached
        assert fetch_all(urls[-last:]) == bodies[-last:]
        assert proxy.counts["GetObject"] == 0
    finally:
        node.stop()
