"""Faults at the origin, end to end: a Hoard process reading moto through the
fault-injecting ``OriginProxy`` (deterministic plans, no timers standing in for
events). Every body is checked byte for byte and every origin GET counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from tests.harness import HoardProcess, metric
from tests.inprocess import get_all, hoard_app
from tests.inprocess import metric as metric_of
from tests.origin_proxy import Fault, OriginProxy, fail_every, fail_nth
from tests.test_block_cache import get_many, put
from tests.test_origin_protection import config

pytestmark = pytest.mark.timeout(120)

KiB = 1024
MiB = 1024 * KiB
BLOCK = 256 * KiB


def fault_config(proxy: OriginProxy, **origin: object) -> dict:
    settings = config(proxy, **origin)
    settings["cache"] = {"block_size": "256KiB", "size": "256MiB", "memory": "16MiB",
                         "read_ahead": 2}  # fmt: skip
    return settings


@pytest.mark.parametrize("kind", ["reset", "truncate"])
async def test_bodies_cut_mid_way_at_every_fourth_get_are_resumed_unseen(
    tmp_path, proxy, origin_client, bucket, kind
):
    objects = {f"cut/{i}": put(origin_client, bucket, f"cut/{i}", 1 * MiB + 1000) for i in range(8)}
    async with hoard_app(tmp_path, fault_config(proxy)) as node:
        proxy.reset()
        proxy.faults = fail_every(4, Fault(kind, after=100 * KiB))  # p = 0.25, after a 200
        keys = list(objects)
        bodies = await get_all([f"{node.endpoint}/{bucket}/{key}" for key in keys])
        assert bodies == [objects[key] for key in keys]  # no error, no wrong byte
        blocks = 8 * 5
        cut = proxy.injected[kind]
        assert cut >= 5  # (a cut planned for a 1000-byte last block does not happen)
        # Each cut costs one more GET (the rest of its block), not a whole block again.
        assert proxy.counts["GetObject"] == blocks + cut
        resumed = [r for _, r in proxy.ranges if r and int(r[6:].split("-")[0]) % BLOCK]
        assert len(resumed) == cut
        assert await metric_of(node.endpoint, 'hoard_origin_resumes_total{origin="o0"}') == cut
        # The second pass is all cache: the resumed blocks were stored whole.
        proxy.reset()
        assert await get_all([f"{node.endpoint}/{bucket}/{key}" for key in keys]) == list(
            objects.values()
        )
        assert proxy.counts["GetObject"] == 0


async def test_the_first_block_get_of_a_metadata_miss_resumes_too(
    tmp_path, proxy, origin_client, bucket
):
    data = put(origin_client, bucket, "one", 200 * KiB)  # one block: the miss's GET is all
    async with hoard_app(tmp_path, fault_config(proxy)) as node:
        proxy.reset()
        proxy.faults = fail_nth(1, Fault("truncate", after=50 * KiB))
        assert await get_all([f"{node.endpoint}/{bucket}/one"]) == [data]
        assert proxy.injected["truncate"] == 1
        # The block as asked, then its rest: from the first byte Hoard did not get to the
        # object's end. That byte is at most the 50 KiB sent, and not always all of them:
        # aiohttp raises the broken body before handing over bytes it had buffered, as many
        # as the machine's load left unread when the FIN arrived.
        first, rest = [r for _, r in proxy.ranges]
        assert first == f"bytes=0-{BLOCK - 1}"
        start, _, end = rest.removeprefix("bytes=").partition("-")
        assert 0 <= int(start) <= 50 * KiB and int(end) == 200 * KiB - 1, rest


async def _get_body(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes | None]:
    """(status, body), body None when the response was cut after its headers."""
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as answer:
        try:
            return answer.status, await answer.read()
        except aiohttp.ClientPayloadError:
            return answer.status, None


def get_body(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes | None]:
    return asyncio.run(_get_body(url, headers))


def test_an_object_replaced_while_partly_cached_heals_at_once(
    tmp_path, proxy, origin_client, bucket
):
    settings = fault_config(proxy)
    settings["mounts"] = [{"bucket": "data", "origin": "moto", "origin_bucket": bucket,
                           "metadata_ttl": "forever"}]  # fmt: skip
    put(origin_client, bucket, "obj", 3 * BLOCK)
    node = HoardProcess(tmp_path, settings).start()
    url = f"{node.endpoint}/data/obj"
    try:
        assert get_body(url, {"Range": "bytes=0-999"})[0] == 206  # block 0 and metadata cached
        v2 = put(origin_client, bucket, "obj", 3 * BLOCK)
        # Block 1 is not cached: its If-Match GET is refused (412) before any byte went
        # out, so this very GET drops the metadata everywhere and reads v2 instead.
        assert get_body(url, {"Range": f"bytes={BLOCK}-"}) == (206, v2[BLOCK:])
        assert get_body(url) == (200, v2)
        # The case: block 0 cached, then the object replaced. Block 0 goes out
        # first, so this GET can only be cut at block 1 (versions are never mixed), and
        # the very next GET serves the new version, whatever the TTL.
        put(origin_client, bucket, "other", 3 * BLOCK)
        other = f"{node.endpoint}/data/other"
        assert get_body(other, {"Range": "bytes=0-999"})[0] == 206
        new = put(origin_client, bucket, "other", 3 * BLOCK)
        assert get_body(other) == (200, None)
        assert get_body(other) == (200, new)
        assert get_body(other, {"Range": "bytes=5-9"}) == (206, new[5:10])
        # The cut is told as it was: its reason, the bytes that went out, no clean 200.
        assert metric(node.endpoint, 'hoard_responses_cut_total{reason="origin_changed"}') == 1
        assert (
            metric(node.endpoint, 'hoard_requests_total{operation="GetObject",status="cut"}') == 1
        )
        node.stop()
        cut_lines = [line for line in node.log().splitlines() if "cut:origin_changed" in line]
        assert len(cut_lines) == 1 and f" 200 {BLOCK} " in cut_lines[0], cut_lines
    finally:
        node.stop()


@pytest.mark.parametrize("kind", ["stall", "hang"])
async def test_a_stalled_get_is_hedged_and_the_hedge_serves_the_client(
    tmp_path, proxy, origin_client, bucket, kind
):
    data = put(origin_client, bucket, "slow", 200 * KiB)
    async with hoard_app(tmp_path, fault_config(proxy, retry={"hedge_after": "300ms"})) as node:
        try:
            proxy.reset()
            proxy.faults = fail_nth(1, Fault(kind, after=10 * KiB))
            # The first GET stays held (until released below); the hedge answers the client.
            assert await _get_body(f"{node.endpoint}/{bucket}/slow") == (200, data)
            assert proxy.stalled.is_set() and proxy.injected[kind] == 1
            assert await metric_of(node.endpoint, 'hoard_origin_hedges_total{won="true"}') == 1
            assert proxy.counts["GetObject"] == 2
        finally:
            proxy.release()


async def test_a_stalled_origin_is_not_stampeded_by_hedges(tmp_path, proxy, origin_client, bucket):
    """16 blocks read at once while every origin GET hangs: a hedge is for the one slow
    request among fast ones, not for an origin that answers nobody (each block once,
    a hedge or two; before, each block's GET was hedged and both retried: ~6 GETs)."""
    keys = [f"stall/{i:02d}" for i in range(16)]
    for key in keys:
        put(origin_client, bucket, key, 100 * KiB)
    settings = fault_config(proxy, read_timeout="1s",
                            retry={"hedge_after": "200ms", "deadline": "3s"})  # fmt: skip
    settings["cache"]["read_ahead"] = 0
    async with hoard_app(tmp_path, settings) as node:
        try:
            proxy.reset()
            proxy.faults = lambda number, path, byte_range: Fault("hang")
            answers = await asyncio.gather(
                *(_get_body(f"{node.endpoint}/{bucket}/{key}") for key in keys)
            )
            statuses = sorted(status for status, _ in answers)
            gets = proxy.counts["GetObject"]
            print("STAMPEDE", statuses, gets)
            assert statuses == [503] * 16, statuses
            assert gets <= 2 * 16, gets
        finally:
            proxy.release()


async def test_a_read_waits_at_most_the_deadline_then_503_before_headers_or_a_cut_after(
    tmp_path, proxy, origin_client, bucket
):
    put(origin_client, bucket, "never", 100 * KiB)
    data = put(origin_client, bucket, "half", 2 * BLOCK)
    settings = fault_config(proxy, retry={"hedge_after": "200ms", "deadline": "1s"})
    settings["cache"]["read_ahead"] = 0
    async with hoard_app(tmp_path, settings) as node:
        try:
            proxy.faults = lambda number, path, byte_range: (
                Fault("hang") if path.endswith("never") or byte_range.startswith(f"bytes={BLOCK}-")
                else None
            )  # fmt: skip
            status, body = await _get_body(f"{node.endpoint}/{bucket}/never")
            assert status == 503 and b"<Code>ServiceUnavailable</Code>" in (body or b""), body
            half = f"{node.endpoint}/{bucket}/half"
            assert await _get_body(half, {"Range": "bytes=0-99"}) == (206, data[:100])
            assert await _get_body(half) == (200, None)  # block 0, then cut
            cut = 'hoard_responses_cut_total{reason="origin_unavailable"}'
            assert await metric_of(node.endpoint, cut) == 1
        finally:
            proxy.release()


def test_a_cache_disk_smaller_than_its_size_evicts_and_keeps_caching(
    tmp_path, proxy, origin_client, bucket
):
    cache_dir = tmp_path / "small"
    cache_dir.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(cache_dir)],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        settings = fault_config(proxy)
        settings["cache"] = {"dir": str(cache_dir), "block_size": "256KiB", "size": "1GiB",
                             "memory": "1MiB", "memory_item_max": "16KiB", "read_ahead": 0}  # fmt: skip
        objects = {
            f"big/{i:02d}": put(origin_client, bucket, f"big/{i:02d}", 1 * MiB) for i in range(12)
        }
        node = HoardProcess(tmp_path, settings).start()
        try:
            urls = {key: f"{node.endpoint}/{bucket}/{key}" for key in objects}
            for key in objects:  # 12 MiB through a 6 MiB file system
                assert get_many([urls[key]]) == [objects[key]]
            assert metric(node.endpoint, "hoard_cache_disk_full_total") >= 1
            proxy.reset()
            recent = list(objects)[-3:]  # the last read are on disk: the tier did not freeze
            assert get_many([urls[key] for key in recent]) == [objects[key] for key in recent]
            assert proxy.counts["GetObject"] == 0
        finally:
            node.stop()
        errors = [line for line in node.log().splitlines() if "disk tier:" in line]
        assert len(errors) <= 4, errors  # once per kind and interval, not per block
    finally:
        subprocess.run(["umount", "-l", str(cache_dir)], check=False)


def test_the_disk_limit_gauge_falls_with_a_filler_and_comes_back_without_it(
    tmp_path, proxy, origin_client, bucket
):
    cache_dir = tmp_path / "small"
    cache_dir.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(cache_dir)],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        settings = fault_config(proxy)
        settings["cache"] = {"dir": str(cache_dir), "block_size": "256KiB", "size": "4MiB",
                             "memory": "1MiB", "memory_item_max": "16KiB", "read_ahead": 0}  # fmt: skip
        objects = {f"o/{i:02d}": put(origin_client, bucket, f"o/{i:02d}", MiB) for i in range(8)}
        node = HoardProcess(tmp_path, settings).start()
        gauge = 'hoard_cache_limit_bytes{tier="disk"}'
        try:
            urls = {key: f"{node.endpoint}/{bucket}/{key}" for key in objects}
            assert get_many([urls[key] for key in list(objects)[:3]]) == list(objects.values())[:3]
            assert metric(node.endpoint, gauge) == 4 * MiB
            filler = cache_dir / "filler"  # another program takes what is free
            stat = os.statvfs(cache_dir)
            with open(filler, "wb") as out, contextlib.suppress(OSError):
                os.posix_fallocate(out.fileno(), 0, stat.f_bavail * stat.f_frsize)
            for key in list(objects)[3:]:
                assert get_many([urls[key]]) == [objects[key]]  # served, though not stored
            assert metric(node.endpoint, gauge) < 4 * MiB
            filler.unlink()
            deadline = time.monotonic() + 30  # the tier re-measures its room once a second
            while metric(node.endpoint, gauge) < 4 * MiB:
                assert time.monotonic() < deadline, "the disk limit never came back"
                time.sleep(0.1)
        finally:
            node.stop()
    finally:
        subprocess.run(["umount", "-l", str(cache_dir)], check=False)


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait_replaced(pid: int, killed: list[int]) -> None:
    """Until the supervisor has reaped every killed worker and started as many new ones."""
    deadline = time.monotonic() + 30
    while True:
        children = set(_children(pid))
        if not children & set(killed) and len(children) == len(killed):
            return
        assert time.monotonic() < deadline, f"workers {killed} not replaced: {children}"
        time.sleep(0.05)


def test_the_gauges_of_a_killed_worker_are_dropped(tmp_path, proxy, origin_client, bucket):
    held = put(origin_client, bucket, "held", 10 * KiB)
    settings = {**fault_config(proxy, retry={"hedge_after": "forever"}), "workers": 2}
    node = HoardProcess(tmp_path, settings).start()
    in_flight = 'hoard_origin_in_flight_requests{origin="o0"}'

    async def held_get() -> None:
        with contextlib.suppress(aiohttp.ClientError):
            await _get_body(f"{node.endpoint}/{bucket}/held")

    async def kill_workers_while_a_get_is_held() -> list[int]:
        pending = asyncio.ensure_future(held_get())
        await asyncio.to_thread(proxy.stalled.wait, 10)
        assert await asyncio.to_thread(metric, node.endpoint, in_flight) == 1
        assert node.proc is not None
        workers = _children(node.proc.pid)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        await pending  # its connection went with its worker
        return workers

    try:
        proxy.faults = fail_nth(1, Fault("hang"))
        killed = asyncio.run(kill_workers_while_a_get_is_held())
        proxy.release()
        assert node.proc is not None
        _wait_replaced(node.proc.pid, killed)  # a killed worker stays a child until reaped
        node.wait_ready(30)
        # The dead worker's request in flight is no longer summed into the gauge.
        assert metric(node.endpoint, in_flight) == 0
        # Its fill's claim went with it: the block is fetched and served again, then cached.
        url = f"{node.endpoint}/{bucket}/held"
        assert get_many([url] * 4) == [held] * 4
        gets = proxy.counts["GetObject"]
        assert get_many([url] * 4) == [held] * 4
        assert proxy.counts["GetObject"] == gets
    finally:
        node.stop()
