"""Disk-tier pins (``cache/disk_pins.py``) on a real DiskTier, and the config keys they use."""

from __future__ import annotations

import os
import time

import pytest

from gateway.cache.block import HEADER_SIZE, BlockId
from gateway.cache.disk import DiskTier
from gateway.config.load import build_settings, read_yaml
from gateway.warm.spec import Progress, WarmSpec
from tests.harness import REPO

KiB = 1024
FILE = HEADER_SIZE + 64 * KiB  # one block's bytes on disk


def block(name: str) -> BlockId:
    return BlockId("o", "b", name, '"e"', 0)


@pytest.fixture
async def tier(tmp_path):
    disk = DiskTier(tmp_path / "disk", capacity=4 * FILE)
    await disk.start()
    yield disk
    await disk.close()


async def test_pinned_blocks_are_not_evicted_until_unpinned(tier):
    forever = float("inf")
    assert await tier.pin("job", block("p"), 64 * KiB, forever, quota=2 * FILE)  # before the fill
    for name in ["p", "a", "b", "c", "d", "e"]:
        assert await tier.put(block(name), b"x" * 64 * KiB)
    assert await tier.get(block("p")) is not None  # oldest, yet kept
    assert await tier.get(block("a")) is None
    assert tier.stats().pinned_bytes == FILE
    assert await tier.unpin("job") == 1
    assert tier.stats().pinned_bytes == 0
    for name in ["f", "g", "h", "i"]:
        await tier.put(block(name), b"x" * 64 * KiB)
    assert await tier.get(block("p")) is None


async def test_the_quota_counts_each_block_once_and_refuses_beyond(tier):
    forever = float("inf")
    assert await tier.pin("one", block("a"), 64 * KiB, forever, quota=2 * FILE)
    assert await tier.pin("two", block("a"), 64 * KiB, forever, quota=2 * FILE)  # same block
    assert await tier.pin("one", block("b"), 64 * KiB, forever, quota=2 * FILE)
    assert not await tier.pin("one", block("c"), 64 * KiB, forever, quota=2 * FILE)
    assert tier.stats().pinned_bytes == 2 * FILE
    await tier.unpin("one")
    assert tier.stats().pinned_bytes == FILE  # "two" still holds a


async def test_an_expired_pin_protects_nothing(tier):
    assert await tier.pin("job", block("p"), 64 * KiB, time.time() - 1, quota=4 * FILE)
    for name in ["p", "a", "b", "c", "d"]:
        await tier.put(block(name), b"x" * 64 * KiB)
    assert await tier.get(block("p")) is None


def test_config_documents_warm_keys_and_the_default_quota_is_half_the_disk(monkeypatch):
    for name in [n for n in os.environ if n.startswith("HOARD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRAINER_SECRET", "an-operator-secret-of-32-chars..")
    settings = build_settings(read_yaml(REPO / "config" / "hoard.yaml"))
    assert settings.cache.pin_limit == 250 * 1024**3
    assert settings.warm.concurrency == 8 and settings.warm.poll_timeout == 2.0
    served = {"origins": {"d": {"type": "posix", "path": "."}}, "default_origin": "d"}
    assert build_settings({"cache": {"size": "10GiB"}, **served}).cache.pin_limit == 5 * 1024**3


def test_specs_and_progress_round_trip_through_json():
    spec = WarmSpec.from_json({"bucket": "b", "keys": ["a", "c"], "pin": True, "pin_ttl": "2h"})
    assert WarmSpec.from_json(spec.to_json()) == spec and spec.pin_ttl == 7200
    for bad in ({"bucket": "b"}, {"bucket": "b", "prefix": "p", "manifest": "m"},
                {"bucket": "b", "keys": [""]}, {"bucket": "b", "prefix": "", "extra": 1},
                {"bucket": "b", "manifest": ""}):  # fmt: skip
        with pytest.raises(ValueError):
            WarmSpec.from_json(bad)
    progress = Progress(objects_done=5, bytes_done=500, cursor=3, at_cursor=(3, 300, 0))
    restored = Progress.from_json(progress.to_json())
    restored.resume()  # counts again from the cursor, but never shows less than before
    assert (restored.objects_done, restored.bytes_done) == (3, 300)
    assert restored.to_json()["objects_done"] == 5 and restored.to_json()["bytes_done"] == 500
