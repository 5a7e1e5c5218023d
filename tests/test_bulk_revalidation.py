"""Epochs longer than the TTL: known objects are revalidated by listing, not by HEAD per key.

A dataset of hundreds of small objects in a handful of directories, a
3-second ``metadata_ttl``, and epochs that each read every object once in a
shuffled order. Epoch 1 costs one GET per object. Epoch 2 starts after every
entry expired: before bulk revalidation it cost one HEAD per object; now each
directory is listed about once per node (counted at the origin), objects
changed or deleted at the origin behind Hoard's back are found by those
listings, and every body is still right.

A listing confirms what it saw for one TTL, so a directory still being read
when that runs out is listed again: the bound is one listing per directory
per TTL of the epoch's length (and one more), not one per object.

Epoch 2 is answered from the stale entries while the revalidations run behind
it, so the origin's counts are read once those have landed (every directory
listed, the changed and the deleted object seen as they are now), not as the
epoch ends.
"""

from __future__ import annotations

import asyncio
import math
import random
import time

import aiohttp
import pytest
import requests

from tests.conftest import moto_origin, seed
from tests.harness import HoardProcess, metric
from tests.origin_proxy import OriginProxy

DIRECTORIES = 4
# One origin page each; a HEAD per object would be 100 per directory where the rule
# allows 1. (Counted as epoch 2 ended, 4 x 100 objects at a 3 s TTL once showed 1 LIST
# of 4 on a quiet machine, and 4 x 500 at 5 s were used to outlast the LISTs; the
# counts are now read once the revalidations have landed: ``_await_listings``.)
PER_DIRECTORY = 100
TTL = 3.0


def _config(proxy: OriginProxy, workers: int) -> dict:
    return {
        "origins": {"moto": moto_origin(proxy)},
        "default_origin": "moto",
        "allow_anonymous": True,
        "workers": workers,
        "mounts": [],
        "cache": {"block_size": "1MiB", "size": "256MiB", "memory": "64MiB"},
    }


def _seed(bucket: str) -> dict[str, bytes]:
    objects = {
        f"train/class{d}/img{i:05d}.jpg": f"{d}/{i}".encode() * 40
        for d in range(DIRECTORIES)
        for i in range(PER_DIRECTORY)
    }
    seed(bucket, objects)
    return objects


async def _epoch(endpoint: str, bucket: str, objects: dict[str, bytes]) -> dict[str, bytes]:
    """Every object once, shuffled, 32 at a time; what each GET returned."""
    keys = list(objects)
    random.shuffle(keys)
    got: dict[str, bytes] = {}
    limit = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as session:

        async def one(key: str) -> None:
            async with limit, session.get(f"{endpoint}/{bucket}/{key}") as answer:
                assert answer.status in (200, 404), await answer.text()
                got[key] = await answer.read() if answer.status == 200 else b""

        await asyncio.gather(*(one(key) for key in keys))
    return got


def _await_answer(endpoint: str, bucket: str, key: str, expected: bytes | None) -> None:
    """Read ``key`` until it answers ``expected`` (None: 404); the revalidation that
    makes it so runs in the background, so a read or two may still be stale."""
    deadline = time.monotonic() + 30
    while True:
        with requests.get(f"{endpoint}/{bucket}/{key}", timeout=30) as answer:
            if expected is None and answer.status_code == 404:
                return
            if answer.status_code == 200 and answer.content == expected:
                return
        assert time.monotonic() < deadline, f"{key} still answers its old state"


def _await_listings(proxy: OriginProxy, count: int) -> None:
    """Wait until ``count`` LISTs reached the origin: the revalidations epoch 2 started
    run behind its reads (too few by the deadline: the test fails on the count)."""
    deadline = time.monotonic() + 30
    while proxy.counts["ListObjects"] < count and time.monotonic() < deadline:
        time.sleep(0.02)


def _expire(learned_by: float) -> None:
    """Let every entry learned before ``learned_by`` pass its TTL (time is the condition
    here). From the end of the epoch that learned them, not its start: on a loaded
    machine an epoch's last entries were otherwise still fresh, and a directory unlisted."""
    time.sleep(max(0.0, learned_by + TTL + 0.2 - time.monotonic()))


@pytest.mark.parametrize("workers", [1, 2])
def test_epochs_past_the_ttl_list_directories_instead_of_heading_each_object(
    tmp_path, proxy, origin_client, bucket, workers
):
    objects = _seed(bucket)
    node = HoardProcess(tmp_path, _config(proxy, workers))
    node.config["mounts"] = [{"bucket": bucket, "origin": "moto", "metadata_ttl": TTL}]
    node.start()
    try:
        proxy.reset()
        assert asyncio.run(_epoch(node.endpoint, bucket, objects)) == objects
        learned_by = time.monotonic()
        assert proxy.counts["GetObject"] == len(objects)
        assert proxy.counts["HeadObject"] == 0

        # Behind Hoard's back: one object rewritten (same size), one deleted.
        changed, deleted = "train/class1/img00007.jpg", "train/class2/img00011.jpg"
        rewritten = bytes(reversed(objects[changed]))
        origin_client.put_object(Bucket=bucket, Key=changed, Body=rewritten)
        origin_client.delete_object(Bucket=bucket, Key=deleted)
        _expire(learned_by)

        proxy.reset()
        began = time.monotonic()
        second = asyncio.run(_epoch(node.endpoint, bucket, objects))
        # Stale-while-revalidate: a first read past the TTL may still see the old state.
        assert {k: v for k, v in second.items() if k not in (changed, deleted)} == {
            k: v for k, v in objects.items() if k not in (changed, deleted)
        }

        # Once their background revalidations land, every directory has been listed, the
        # changed object reads new and the deleted one is gone.
        _await_listings(proxy, DIRECTORIES)
        _await_answer(node.endpoint, bucket, changed, rewritten)
        _await_answer(node.endpoint, bucket, deleted, None)
        # A directory read again after its listing's TTL is listed again (the reads
        # above, on a slow machine): one listing per directory per TTL since epoch 2 began.
        listings_bound = DIRECTORIES * (math.ceil((time.monotonic() - began) / TTL) + 1)
        lists, heads = proxy.counts["ListObjects"], proxy.counts["HeadObject"]
        assert heads <= 2, f"{heads} HEADs: only the changed and the deleted object need one"
        assert DIRECTORIES <= lists <= listings_bound, f"{lists} LISTs, {listings_bound} allowed"
        assert proxy.counts["GetObject"] <= 1  # the rewritten object's new block

        confirmed = metric(node.endpoint, 'hoard_metadata_revalidations_total{outcome="confirmed"}')
        assert confirmed > 0
    finally:
        node.stop()
