"""The block cache end to end, proved by counting what reaches the origin.

A Hoard process reads from moto through ``OriginProxy``, which counts every
origin request and can slow down or fail the origin on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
import time
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import moto_origin, seed
from tests.harness import HoardProcess, metric, sum_samples
from tests.inprocess import get_all, hoard_app
from tests.origin_proxy import OriginProxy
from tests.rawhttp import sign_headers

MiB = 1024 * 1024
BLOCK = 8 * MiB


def hoard_config(proxy: OriginProxy, **cache: object) -> dict:
    return {
        "origins": {"moto": moto_origin(proxy, max_attempts=2)},
        "default_origin": "moto",
        "allow_anonymous": True,
        "cache": {"block_size": "8MiB", "size": "1GiB", "memory": "64MiB", **cache},
    }  # fmt: skip


@pytest.fixture
def node(tmp_path, proxy):
    running = HoardProcess(tmp_path, hoard_config(proxy)).start()
    yield running
    running.stop()


def get_many(urls: list[str], headers: dict[str, str] | None = None) -> list[bytes]:
    return asyncio.run(get_all(urls, headers))


def put(origin_client, bucket: str, key: str, size: int) -> bytes:
    data = os.urandom(size)
    origin_client.put_object(Bucket=bucket, Key=key, Body=data)
    return data


async def test_64_concurrent_cold_gets_cost_one_origin_get_per_block(
    tmp_path, proxy, origin_client, bucket
):
    """One worker, in this process: the real app on a loopback port (``inprocess.py``).
    Five blocks of 2 MiB, as in the two workers' test below (files on disk, past every
    small-block threshold), for a quarter of the bytes five 8 MiB blocks cost."""
    block = 2 * MiB
    data = put(origin_client, bucket, "shard-10m", 5 * block)
    async with hoard_app(tmp_path, hoard_config(proxy, block_size=block)) as node:
        proxy.reset()
        bodies = await get_all([f"{node.endpoint}/{bucket}/shard-10m"] * 64)
        assert all(body == data for body in bodies)
        assert proxy.counts["GetObject"] == 5, proxy.listed_gets()
        assert proxy.counts["HeadObject"] == 0
        # A second pass is served entirely from the cache.
        proxy.reset()
        assert await get_all([f"{node.endpoint}/{bucket}/shard-10m"] * 8) == [data] * 8
        assert sum(proxy.counts.values()) == 0
        metrics = await _text(f"{node.endpoint}/metrics")
        served = sum_samples(metrics, 'hoard_requests_total{operation="GetObject",status="200"}')
        assert served == 72
        # Process metrics cover the node's process (here: this one).
        own_fds = len(os.listdir("/proc/self/fd"))
        assert sum_samples(metrics, "process_open_fds") >= own_fds * 0.5


async def test_a_lone_cold_read_is_not_counted_as_coalesced(tmp_path, proxy, origin_client, bucket):
    """The fill a metadata miss opens is read next by the same request: that is the fill's
    own reader, not one that waited on another's (every cold GET used to count one)."""
    data = put(origin_client, bucket, "lone", 100_000)
    async with hoard_app(tmp_path, hoard_config(proxy)) as node:
        proxy.reset()
        assert await get_all([f"{node.endpoint}/{bucket}/lone"]) == [data]
        assert proxy.counts["GetObject"] == 1
        metrics = await _text(f"{node.endpoint}/metrics")
        assert sum_samples(metrics, "hoard_coalesced_waiters_total") == 0


def test_workers_share_one_origin_get_per_block_and_report_every_process(
    tmp_path, proxy, origin_client, bucket
):
    """Two workers: a subprocess, as only a process has workers. The metadata TTL
    outlasts the test: a first pass slower than the default 60 s (a loaded machine)
    would otherwise make the second pass revalidate with a LIST.

    Five blocks of 2 MiB, not of 8 MiB: the same five fills raced by 64 clients over
    both workers (with each worker claiming blocks for itself, not following the
    other's fill, this counted 19-25 GETs), for a quarter of the bytes (640 MiB
    instead of 2.5 GiB through the client). 2 MiB is past every small-block threshold
    (packed segments 256 KiB, the memory tier and kept descriptors 1 MiB), so the
    blocks are files on disk, as 8 MiB ones are."""
    workers = 2
    block = 2 * MiB
    data = put(origin_client, bucket, "shard-10m", 5 * block)
    settings = {**hoard_config(proxy, block_size=block), "workers": workers,
                "default_metadata_ttl": "1h"}  # fmt: skip
    node = HoardProcess(tmp_path, settings).start()
    try:
        proxy.reset()
        bodies = get_many([f"{node.endpoint}/{bucket}/shard-10m"] * 64)
        assert all(body == data for body in bodies)
        assert proxy.counts["GetObject"] == 5, proxy.listed_gets()
        assert proxy.counts["HeadObject"] == 0
        # A second pass is served entirely from the cache.
        proxy.reset()
        assert get_many([f"{node.endpoint}/{bucket}/shard-10m"] * 8) == [data] * 8
        assert sum(proxy.counts.values()) == 0
        metrics = asyncio.run(_text(f"{node.endpoint}/metrics"))
        served = sum_samples(metrics, 'hoard_requests_total{operation="GetObject",status="200"}')
        assert served == 72  # summed over every worker
        # Process metrics cover the node's processes: supervisor and workers.
        assert node.proc is not None
        pids = [node.proc.pid, *_children(node.proc.pid)]
        assert len(pids) == 1 + workers
        own_fds = sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)
        assert sum_samples(metrics, "process_open_fds") >= own_fds * 0.5
        # one worker alone holds far fewer than the whole tree
        assert sum_samples(metrics, "process_open_fds") > len(os.listdir(f"/proc/{pids[1]}/fd"))
    finally:
        assert node.stop() == 0


async def test_ranges_across_block_boundaries(tmp_path, proxy, origin_client, bucket):
    data = put(origin_client, bucket, "obj", 3 * BLOCK + 12345)
    async with hoard_app(tmp_path, hoard_config(proxy)) as node:
        url = f"{node.endpoint}/{bucket}/obj"
        cases = [(0, 0), (BLOCK - 1, BLOCK), (BLOCK - 10, 2 * BLOCK + 10),
                 (3 * BLOCK, len(data) - 1), (5, len(data) - 1), (len(data) - 1, len(data) - 1)]  # fmt: skip
        for first, last in cases:
            (body,) = await get_all([url], {"Range": f"bytes={first}-{last}"})
            assert body == data[first : last + 1], (first, last)
        (suffix,) = await get_all([url], {"Range": "bytes=-100"})
        assert suffix == data[-100:]
        proxy.reset()
        assert await get_all([url]) == [data]
        assert proxy.counts["GetObject"] == 0  # every block was filled by the ranged reads


async def test_ranged_get_fetches_only_the_blocks_it_covers(tmp_path, proxy, origin_client, bucket):
    data = put(origin_client, bucket, "big", 6 * BLOCK)
    proxy.reset()
    async with hoard_app(tmp_path, hoard_config(proxy)) as node:
        (body,) = await get_all(
            [f"{node.endpoint}/{bucket}/big"], {"Range": f"bytes={2 * BLOCK + 1}-{2 * BLOCK + 100}"}
        )
    assert body == data[2 * BLOCK + 1 : 2 * BLOCK + 101]
    assert (
        proxy.counts["GetObject"] == 1
        and proxy.ranges[0][1] == f"bytes={2 * BLOCK}-{3 * BLOCK - 1}"
    )


def test_restart_serves_from_disk_without_origin_gets(tmp_path, proxy, origin_client, bucket):
    data = put(origin_client, bucket, "persist", 10 * MiB)
    first = HoardProcess(tmp_path, hoard_config(proxy)).start()
    try:
        assert get_many([f"{first.endpoint}/{bucket}/persist"]) == [data]
    finally:
        first.stop()
    proxy.reset()
    second = HoardProcess(tmp_path, hoard_config(proxy)).start()
    try:
        assert get_many([f"{second.endpoint}/{bucket}/persist"]) == [data]
        assert proxy.counts["GetObject"] == 0
    finally:
        second.stop()


def _block_files(cache_dir: Path) -> list[Path]:
    return [p for p in (cache_dir / "blocks").rglob("*") if p.is_file()]


async def test_corrupted_block_is_refetched_never_served(tmp_path, proxy, origin_client, bucket):
    data = put(origin_client, bucket, "fragile", 2 * MiB)
    async with hoard_app(tmp_path, hoard_config(proxy)) as node:
        url = f"{node.endpoint}/{bucket}/fragile"
        assert await get_all([url]) == [data]
        # The answer may be sent before its block is written and indexed (the fill writes
        # to disk beside the client): wait for the index to hold it, not for time to pass.
        await _wait_for_disk_bytes(node.endpoint, 2 * MiB)
        files = _block_files(tmp_path / "cache")
        assert len(files) == 1
        raw = bytearray(files[0].read_bytes())
        raw[-1000] ^= 0xFF
        files[0].write_bytes(bytes(raw))
        # The memory tier may hold the block too; the memory copy is not the corrupted one,
        # so to prove the disk path, drop memory by reading enough other blocks is overkill:
        # the block is 2 MiB, above the memory tier's 1 MiB item limit, so disk serves it.
        proxy.reset()
        assert await get_all([url]) == [data]
        assert proxy.counts["GetObject"] == 1
        metrics = await _text(f"{node.endpoint}/metrics")
        assert "hoard_cache_corrupt_blocks_total 1.0" in metrics


async def _wait_for_disk_bytes(endpoint: str, wanted: int, timeout: float = 30.0) -> None:
    """Until the disk tier's indexed bytes (``hoard_cache_bytes{tier="disk"}``) reach ``wanted``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exposition = await _text(f"{endpoint}/metrics")
        if sum_samples(exposition, 'hoard_cache_bytes{tier="disk"}') >= wanted:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the disk tier never held {wanted} bytes")


async def _settled_file_bytes(cache_dir: Path, endpoint: str, timeout: float = 30.0) -> int:
    """Bytes of the block files once no fill is in flight: no part file left and the
    files' bytes equal to what the index holds. (A file is on disk before its row and
    an evicted row goes before its file, so the files never hold less than the index:
    equal means settled.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exposition = await _text(f"{endpoint}/metrics")
        indexed = sum_samples(exposition, 'hoard_cache_bytes{tier="disk"}')
        parts = [p for p in (cache_dir / "tmp").rglob("*") if p.is_file()]
        on_disk = _file_bytes(_block_files(cache_dir))
        if not parts and on_disk == indexed:
            return on_disk
        await asyncio.sleep(0.02)
    raise AssertionError(f"the disk tier never settled: {on_disk} bytes on disk, {indexed} indexed")


def _file_bytes(files: list[Path]) -> int:
    """Bytes of ``files`` still there: eviction may remove one between listing and stat."""
    total = 0
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


async def _text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        return await answer.text()


async def test_etag_change_after_ttl_serves_new_bytes_never_mixed(
    tmp_path, proxy, origin_client, bucket
):
    config = hoard_config(proxy)
    config["mounts"] = [{"bucket": "ttl-mount", "origin": "moto", "origin_bucket": bucket,
                         "metadata_ttl": "1s"}]  # fmt: skip
    async with hoard_app(tmp_path, config) as node:
        old = put(origin_client, bucket, "changing", 3 * BLOCK)
        url = f"{node.endpoint}/ttl-mount/changing"
        assert await get_all([url]) == [old]
        new = put(origin_client, bucket, "changing", 3 * BLOCK)
        deadline = time.monotonic() + 20
        seen_new = False
        while time.monotonic() < deadline and not seen_new:
            (body,) = await get_all([url])
            assert body in (old, new), "a response mixed two versions"
            seen_new = body == new
            await asyncio.sleep(0.3)
        assert seen_new


async def test_disk_bound_respected_with_dataset_3x_the_bound(
    tmp_path, proxy, origin_client, bucket
):
    objects = {f"d/{i}": put(origin_client, bucket, f"d/{i}", 3 * MiB) for i in range(16)}
    config = hoard_config(proxy, size="16MiB", block_size="1MiB", memory="1MiB")
    async with hoard_app(tmp_path, config) as node:
        for key, data in objects.items():
            assert await get_all([f"{node.endpoint}/{bucket}/{key}"]) == [data]
            # Fills write beside the client and a file is renamed in before its row's
            # commit evicts (and its victims are unlinked after): so the bound holds once
            # the writes this read started are done, not at every instant.
            used = await _settled_file_bytes(tmp_path / "cache", node.endpoint)
            assert used <= 16 * MiB, used
        for key, data in list(objects.items())[:3]:  # evicted early, refetched correctly
            assert await get_all([f"{node.endpoint}/{bucket}/{key}"]) == [data]


async def test_leader_disconnect_does_not_cancel_other_waiters(
    tmp_path, proxy, origin_client, bucket
):
    data = put(origin_client, bucket, "slow", 2 * MiB)
    proxy.reset()
    proxy.mode = "slow"
    proxy.slow_delay = 0.02
    try:
        async with hoard_app(tmp_path, hoard_config(proxy)) as node:
            url = f"{node.endpoint}/{bucket}/slow"
            async with aiohttp.ClientSession() as session, session.get(url) as leader:
                # Its first bytes mean the fill is under way (the origin trickles the
                # rest); then the leader hangs up, and eight readers come for the block.
                await leader.content.readexactly(1024)
            bodies = await get_all([url] * 8)
    finally:
        proxy.mode = "ok"
    assert all(body == data for body in bodies)
    assert proxy.counts["GetObject"] == 1


def test_client_gone_before_the_headers_is_not_an_error(node, proxy, origin_client, bucket):
    data = put(origin_client, bucket, "abandoned", 256 * 1024)
    proxy.reset()
    proxy.mode = "slow"
    proxy.slow_delay = 0.3  # the first bytes come after the client has left
    host, port = node.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"GET /{bucket}/abandoned HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    assert get_many([f"{node.endpoint}/{bucket}/abandoned"]) == [data]
    proxy.mode = "ok"
    for _ in range(100):  # both requests' access-log lines (written every 0.25 s)
        if node.log().count(f"/{bucket}/abandoned GetObject") >= 2:
            break
        time.sleep(0.1)
    log = node.log()
    assert log.count(f"/{bucket}/abandoned GetObject") == 2, log
    assert "unhandled error" not in log and "Traceback" not in log, log
    assert proxy.counts["GetObject"] == 1


@pytest.mark.parametrize("query", ["", "?versionId=null"], ids=["cached", "forwarded"])
def test_client_gone_while_hoard_waits_to_drain_is_not_an_error(node, origin_client, bucket, query):
    """A client that stops reading a large answer and resets: Hoard, paused on a full
    socket, got aiohttp's bare ConnectionError. That was a cut with a traceback on a
    GetObject, and an unhandled error (a 500 in the access log) on a forwarded read
    (s3-tests' test_multipart_get_part family reads parts of 15 MiB objects that way)."""
    put(origin_client, bucket, "unread", 8 * MiB)  # more than every socket buffer holds
    host = f"127.0.0.1:{node.port}"
    target = f"/{bucket}/unread{query}"
    head = "".join(f"{n}: {v}\r\n" for n, v in {**sign_headers("GET", host, target), "Host": host}.items())  # fmt: skip
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET {target} HTTP/1.1\r\n{head}\r\n".encode())
        assert sock.recv(12) == b"HTTP/1.1 200"
        _wait_until_unsent_settles(node.port, sock.getsockname()[1])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    gone = 'hoard_responses_cut_total{reason="client_gone"}'
    deadline = time.monotonic() + 10
    while metric(node.endpoint, gone) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(node.endpoint, gone) == 1
    log = node.log()
    assert "unhandled error" not in log and "Traceback" not in log, log


def _wait_until_unsent_settles(server_port: int, client_port: int) -> None:
    """Until Hoard's socket to the client holds bytes the client has not taken and no
    more go in: the kernel's buffer is full, so Hoard's writer waits to drain."""
    previous, deadline = -1, time.monotonic() + 10
    while time.monotonic() < deadline:
        unsent = _send_queue(server_port, client_port)
        if unsent > 0 and unsent == previous:
            return
        previous = unsent
        time.sleep(0.05)
    raise AssertionError(f"Hoard's send queue never settled ({previous} bytes)")


def _send_queue(local_port: int, remote_port: int) -> int:
    """``tx_queue`` of the IPv4 TCP socket ``local_port`` → ``remote_port`` (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(address.rpartition(":")[2], 16) for address in fields[1:3])
        if (local, remote) == (local_port, remote_port):
            return int(fields[4].partition(":")[0], 16)
    return 0


async def test_origin_down_after_warm_up_serves_cache_and_stale_metadata(
    tmp_path, proxy, origin_client, bucket
):
    config = hoard_config(proxy)
    config["mounts"] = [{"bucket": "warm", "origin": "moto", "origin_bucket": bucket,
                         "metadata_ttl": "1s"}]  # fmt: skip
    data = put(origin_client, bucket, "warm-obj", 3 * MiB)
    put(origin_client, bucket, "listed/a", 10)
    listed = "/warm?list-type=2&prefix=listed/"
    async with hoard_app(tmp_path, config) as node:
        try:
            assert await get_all([f"{node.endpoint}/warm/warm-obj"]) == [data]
            assert b"listed/a" in (await get_all([node.endpoint + listed]))[0]
            await asyncio.sleep(1.5)  # the metadata is stale now (time is the condition)
            proxy.mode = "down"
            assert await get_all([f"{node.endpoint}/warm/warm-obj"]) == [data]
            assert b"listed/a" in (await get_all([node.endpoint + listed]))[0]
        finally:
            proxy.mode = "ok"


async def test_64_identical_lists_cost_one_origin_list(tmp_path, proxy, origin_client, bucket):
    for i in range(30):
        origin_client.put_object(Bucket=bucket, Key=f"imgs/{i:03d}.jpg", Body=b"x")
    proxy.reset()
    async with hoard_app(tmp_path, hoard_config(proxy)) as node:
        url = f"{node.endpoint}/{bucket}?list-type=2&prefix=imgs/&max-keys=7"
        bodies = await get_all([url] * 64)
    assert len({hashlib.sha256(b).hexdigest() for b in bodies}) == 1
    assert proxy.counts["ListObjects"] == 1


def test_disk_full_still_serves_from_origin(tmp_path, proxy, origin_client, bucket):
    cache_dir = tmp_path / "tiny"
    cache_dir.mkdir()
    if os.system(f"mount -t tmpfs -o size=3m tmpfs {cache_dir} 2>/dev/null") != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        config = hoard_config(proxy, dir=str(cache_dir), block_size="1MiB", memory="1MiB")
        node = HoardProcess(tmp_path, config).start()
        try:
            datas = {
                f"full/{i}": put(origin_client, bucket, f"full/{i}", 2 * MiB + 7) for i in range(3)
            }
            for key, data in datas.items():
                assert get_many([f"{node.endpoint}/{bucket}/{key}"]) == [data]
            for key, data in datas.items():
                assert get_many([f"{node.endpoint}/{bucket}/{key}"]) == [data]
        finally:
            node.stop()
    finally:
        os.system(f"umount {cache_dir}")


async def test_second_pass_over_a_dataset_costs_no_origin_request(
    tmp_path, proxy, origin_client, bucket
):
    images = {
        f"imgs/{i:03d}.jpg": put(origin_client, bucket, f"imgs/{i:03d}.jpg", 96 * 1024)
        for i in range(40)
    }
    async with hoard_app(tmp_path, hoard_config(proxy)) as node:
        urls = [f"{node.endpoint}/{bucket}/{key}" for key in images]
        assert await get_all(urls) == list(images.values())
        proxy.reset()
        assert await get_all(urls) == list(images.values())
    assert sum(proxy.counts.values()) == 0


def test_cached_listing_pages_match_the_origin(tmp_path, proxy, origin_client, bucket):
    seed(bucket, {f"ds/{i % 13}/f{i:05d}": b"" for i in range(1200)})
    node = HoardProcess(tmp_path, hoard_config(proxy)).start()
    try:
        client = node.client()

        def walk(c, **params):
            return [
                ([o["Key"] for o in page.get("Contents", [])],
                 [p["Prefix"] for p in page.get("CommonPrefixes", [])])
                for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, **params)
            ]  # fmt: skip

        proxy.reset()
        first = walk(client, Prefix="ds/")
        lists_cold = proxy.counts["ListObjects"]
        assert lists_cold == 2  # the whole prefix, fetched once in pages of 1000
        proxy.reset()
        for params in ({"Prefix": "ds/"}, {"Prefix": "ds/", "Delimiter": "/"},
                       {"Prefix": "ds/3/", "PaginationConfig": {"PageSize": 17}},
                       {"Prefix": "ds/", "StartAfter": "ds/5/"}):  # fmt: skip
            ours = walk(client, **params)
            theirs = walk(origin_client, **params)
            assert ours == theirs, params
        assert walk(client, Prefix="ds/") == first
        assert proxy.counts["ListObjects"] == 0
    finally:
        node.stop()


def test_admin_stats_and_drop(tmp_path, proxy, origin_client, bucket):
    from tests.rawhttp import signed_send

    node = HoardProcess(tmp_path, hoard_config(proxy)).start()
    try:
        keep = put(origin_client, bucket, "keep/a", 300_000)
        drop = put(origin_client, bucket, "drop/a", 300_000)
        assert get_many(
            [f"{node.endpoint}/{bucket}/keep/a", f"{node.endpoint}/{bucket}/drop/a"]
        ) == [keep, drop]
        assert asyncio.run(_status(f"{node.endpoint}/_hoard/stats")) == 403  # anonymous
        stats = signed_send(node.port, "GET", "/_hoard/stats")
        assert stats.status == 200 and b'"memory"' in stats.body and b'"disk"' in stats.body
        dropped = signed_send(node.port, "DELETE", f"/_hoard/cache?bucket={bucket}&prefix=drop%2F")
        assert dropped.status == 200 and b'"disk_blocks": 1' in dropped.body
        proxy.reset()
        assert get_many(
            [f"{node.endpoint}/{bucket}/keep/a", f"{node.endpoint}/{bucket}/drop/a"]
        ) == [keep, drop]
        assert proxy.gets("/drop/a") == 1 and proxy.gets("/keep/a") == 0
        metrics = asyncio.run(_text(f"{node.endpoint}/metrics"))
        # The drop/a re-read went to the origin, through the "default" (passthrough) mount.
        assert sum_samples(metrics, 'hoard_bytes_served_total{source="origin",mount="default"}')
        assert sum_samples(metrics, 'hoard_metadata_lookups_total{kind="head",state="miss"}')
        assert sum_samples(metrics, 'hoard_cache_bytes{tier="disk"}')
    finally:
        node.stop()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


async def _status(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        return answer.status


async def test_failed_cold_fill_is_a_clear_s3_error_and_not_cached(
    tmp_path, proxy, origin_client, bucket
):
    data = put(origin_client, bucket, "unlucky", 3 * MiB)
    async with hoard_app(tmp_path, hoard_config(proxy)) as node:
        url = f"{node.endpoint}/{bucket}/unlucky"
        proxy.mode = "down"
        try:
            status, body = await _status_and_body(url)
            assert status == 503 and b"<Code>SlowDown</Code>" in body
        finally:
            proxy.mode = "ok"
        assert await get_all([url]) == [data]  # the failure was not cached
        metrics = await _text(f"{node.endpoint}/metrics")
    assert (
        'hoard_origin_errors_total{error="OriginThrottled",operation="GetObject",origin="o0"}'
        in metrics
    )


async def _status_and_body(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        return answer.status, await answer.read()


def test_a_block_id_is_named_by_its_five_fields_alone() -> None:
    """Equal fields: equal ids, one hash, one dict slot (the hash is kept once computed,
    the digest too); any field different: another block."""
    from dataclasses import replace

    from gateway.cache.block import BlockId

    block = BlockId("origin", "bucket", "key", "etag", 0)
    same = BlockId("origin", "bucket", "key", "etag", 0)
    _ = same.digest  # a kept digest is no part of the identity
    assert block == same and hash(block) == hash(same) and {block: 1}[same] == 1
    assert hash(block) == hash(block)  # kept, and the same when asked again
    for field, value in (("origin", "o2"), ("bucket", "b2"), ("key", "k2"), ("etag", "e2"),
                         ("index", 1)):  # fmt: skip
        other = replace(block, **{field: value})
        assert other != block and other not in {block}
    assert block != ("origin", "bucket", "key", "etag", 0)
