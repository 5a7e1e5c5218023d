"""The admission doorkeeper: second miss within the window admits, a scan does not."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid

import pytest

from gateway.cache.admission import Doorkeeper
from tests.harness import HoardProcess, sum_samples
from tests.inprocess import get_all, hoard_app
from tests.test_block_cache import _text, hoard_config, put


def digest(n: int) -> str:
    return hashlib.blake2b(str(n).encode(), digest_size=20).hexdigest()


def test_always_admits_everything():
    keeper = Doorkeeper("always", 10)
    assert all(keeper.admit(digest(n)) for n in range(100))


def test_second_miss_is_admitted_first_is_not():
    keeper = Doorkeeper("second_hit", 1000)
    assert not keeper.admit(digest(1))
    assert keeper.seen(digest(1))
    assert keeper.admit(digest(1))
    assert not keeper.seen(digest(2))  # asking does not record


def test_a_miss_is_forgotten_after_two_windows():
    keeper = Doorkeeper("second_hit", 100)
    assert not keeper.admit(digest(0))
    for n in range(1, 250):  # two and a half windows of other blocks
        keeper.admit(digest(n))
    assert not keeper.admit(digest(0))


def test_a_scan_of_distinct_blocks_is_mostly_refused():
    keeper = Doorkeeper("second_hit", 10_000)
    admitted = sum(keeper.admit(digest(n)) for n in range(10_000))
    assert admitted < 300  # Bloom false positives only (about 1% at a full window)


# -- end to end: a hot set survives one scan of three times the cache -------------------

HOT, SCAN, BLOCK_SIZE = 8, 72, 64 * 1024  # disk of 24 blocks: the scan is 3x the cache


def _scan_after_hot_set(tmp_path, proxy, origin_client, admission: str) -> int:
    """Origin GETs of a re-read of the hot set after a scan (see the test)."""
    bucket = f"adm-{uuid.uuid4().hex[:10]}"
    origin_client.create_bucket(Bucket=bucket)
    hot = [f"hot/{n:02d}" for n in range(HOT)]
    scan = [f"scan/{n:03d}" for n in range(SCAN)]
    for key in hot + scan:
        put(origin_client, bucket, key, BLOCK_SIZE)
    # The memory tier holds no block (memory_item_max): only the disk tier is measured.
    config = hoard_config(proxy, block_size="64KiB", size=24 * (BLOCK_SIZE + 64),
                          memory="1MiB", memory_item_max="4KiB", read_ahead=0,
                          read_ahead_max=0, admission=admission, admission_window=1000)  # fmt: skip
    node = HoardProcess(tmp_path / admission, config).start()
    try:
        s3 = node.client()
        for _ in range(3):  # hot: read repeatedly (admitted on its second miss)
            for key in hot:
                s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        for key in scan:  # one pass over a cold dataset three times the cache
            s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        proxy.reset()
        for key in hot:
            s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return proxy.gets()
    finally:
        node.stop()


@pytest.mark.timeout(180)
def test_hot_set_survives_a_scan_only_with_second_hit_admission(tmp_path, proxy, origin_client):
    with_admission = _scan_after_hot_set(tmp_path, proxy, origin_client, "second_hit")
    without = _scan_after_hot_set(tmp_path, proxy, origin_client, "always")
    assert with_admission == 0, "the hot set was flushed despite admission"
    assert without == HOT, "without admission the scan should have evicted the hot set"


async def test_a_promoted_block_above_the_disk_limit_leaves_memory(tmp_path, proxy, origin_client):
    """A block admission kept off the disk waits in memory; its second memory hit writes it
    to disk, and then memory keeps it only as any block on disk (up to 64 KiB)."""
    bucket = f"adm-{uuid.uuid4().hex[:10]}"
    origin_client.create_bucket(Bucket=bucket)
    data = put(origin_client, bucket, "staged", 100 * 1024)
    config = hoard_config(proxy, read_ahead=0, admission="second_hit")
    async with hoard_app(tmp_path, config) as node:
        url = f"{node.endpoint}/{bucket}/staged"
        for _ in range(3):  # a miss (staged in memory), then two memory hits: promoted
            assert await get_all([url]) == [data]
        deadline = time.monotonic() + 30  # the promotion's write runs in the background
        while _tier_bytes(await _text(f"{node.endpoint}/metrics"), "disk") < len(data):
            assert time.monotonic() < deadline, "the staged block was never promoted"
            await asyncio.sleep(0.02)
        metrics = await _text(f"{node.endpoint}/metrics")
        assert _tier_bytes(metrics, "memory") == 0
        assert proxy.gets() == 1


def _tier_bytes(metrics: str, tier: str) -> float:
    return sum_samples(metrics, f'hoard_cache_bytes{{tier="{tier}"}}')
