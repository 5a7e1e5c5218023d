"""Origin protection end to end: the Hoard app (in process) reading moto through ``OriginProxy``.

The proxy counts what reaches the origin, tracks how many requests it holds at
once, and can answer SlowDown to half of the requests or refuse them all. The
gateway's own metrics show what the guard did (retries, breaker state).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import moto_origin
from tests.inprocess import get_all, hoard_app
from tests.origin_proxy import OriginProxy
from tests.test_block_cache import put

pytestmark = pytest.mark.timeout(120)

KiB = 1024


def config(proxy: OriginProxy, **origin: object) -> dict:
    return {
        "origins": {"moto": moto_origin(proxy, **origin)},
        "default_origin": "moto",
        "allow_anonymous": True,
        "cache": {"block_size": "256KiB", "size": "256MiB", "memory": "16MiB"},
    }  # fmt: skip


async def metric(endpoint: str, name: str, **labels: str) -> float:
    """One sample of the gateway's /metrics (0 when absent)."""
    text = (await _fetch(f"{endpoint}/metrics"))[1].decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


async def _fetch(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        return answer.status, await answer.read()


async def status_of(url: str) -> int:
    return (await _fetch(url))[0]


async def test_64_concurrent_cold_reads_never_exceed_the_concurrency_cap(
    tmp_path, proxy, origin_client, bucket
):
    objects = {
        f"cold/{i:02d}": put(origin_client, bucket, f"cold/{i:02d}", 600 * KiB) for i in range(64)
    }  # fmt: skip  (3 blocks each: read-ahead runs too)
    async with hoard_app(tmp_path, config(proxy, limits={"max_concurrency": 4})) as node:
        proxy.reset()
        keys = list(objects)
        bodies = await get_all([f"{node.endpoint}/{bucket}/{key}" for key in keys])
        assert bodies == [objects[key] for key in keys]  # byte-exact
        assert proxy.counts["GetObject"] >= 64 * 3
        assert proxy.max_in_flight <= 4, proxy.max_in_flight
        assert await metric(node.endpoint, "hoard_origin_throttled_total",
                            origin="o0", limit="concurrency") > 0  # fmt: skip
        assert await metric(node.endpoint, "hoard_origin_in_flight_requests",
                            origin="o0", priority="client") == 0  # fmt: skip


async def test_an_origin_answering_slowdown_half_the_time_still_serves_every_read(
    tmp_path, proxy, origin_client, bucket
):
    objects = {
        f"flaky/{i:02d}": put(origin_client, bucket, f"flaky/{i:02d}", 100 * KiB) for i in range(40)
    }  # fmt: skip  (one block each: one GET per object)
    async with hoard_app(tmp_path, config(proxy)) as node:
        try:
            proxy.reset()
            proxy.mode = "flaky"  # every distinct request: SlowDown, then the answer
            keys = list(objects)
            bodies = await get_all([f"{node.endpoint}/{bucket}/{key}" for key in keys])
            assert bodies == [objects[key] for key in keys]
            assert proxy.slow_downs == 40 and proxy.counts["GetObject"] == 80
            retries = await metric(node.endpoint, "hoard_origin_retries_total",
                                   origin="o0", operation="GetObject")  # fmt: skip
            assert retries == proxy.slow_downs
            # Within the budget: 20 % of the 40 requests plus the floor (10/s over 10 s).
            assert retries <= 0.2 * 40 + 10 * 10
            assert await metric(node.endpoint, "hoard_origin_retry_budget_exhausted_total",
                                origin="o0", operation="GetObject") == 0  # fmt: skip
        finally:
            proxy.mode = "ok"


async def test_a_dead_origin_opens_the_breaker_while_cached_reads_keep_working(
    tmp_path, proxy, origin_client, bucket
):
    settings = config(proxy, max_attempts=2, breaker={"failures": 3, "open_for": "1s"})
    settings["mounts"] = [{"bucket": "data", "origin": "moto", "origin_bucket": bucket,
                           "metadata_ttl": "1s"}]  # fmt: skip
    warm = put(origin_client, bucket, "warm", 300 * KiB)
    cold = put(origin_client, bucket, "cold/3", 10 * KiB)
    for i in range(3):
        put(origin_client, bucket, f"cold/{i}", 10 * KiB)
    async with hoard_app(tmp_path, settings) as node:
        base = f"{node.endpoint}/data"
        try:
            assert await get_all([f"{base}/warm"]) == [warm]
            listing = (await get_all([f"{base}?list-type=2&prefix=cold/"]))[0]
            await asyncio.sleep(1.2)  # the cached metadata is stale now
            proxy.mode = "down"
            for i in range(3):  # three misses fail at the origin (two tries each)...
                assert await status_of(f"{base}/cold/{i}") == 503
            assert await metric(node.endpoint, "hoard_origin_breaker_open", origin="o0") == 1
            proxy.reset()
            assert await status_of(f"{base}/cold/3") == 503  # ...then misses fail fast
            assert sum(proxy.counts.values()) == 0
            # Cached bytes and stale metadata are still served.
            assert await get_all([f"{base}/warm"]) == [warm]
            assert await get_all([f"{base}?list-type=2&prefix=cold/"]) == [listing]
            proxy.mode = "ok"
            await asyncio.sleep(1.1)  # open_for: the next miss is the probe
            assert await get_all([f"{base}/cold/3"]) == [cold]
            assert await metric(node.endpoint, "hoard_origin_breaker_open", origin="o0") == 0
            assert await metric(node.endpoint, "hoard_origin_breaker_transitions_total",
                                origin="o0", state="closed") == 1  # fmt: skip
        finally:
            proxy.mode = "ok"
