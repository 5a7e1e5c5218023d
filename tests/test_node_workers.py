"""One node, two workers, one state: storms, stats, metrics and membership are the node's.

Real Hoard processes with ``workers: 2`` (moto behind the counting proxy);
every request opens its own connection, so requests reach both workers, and
what reaches the origin is counted there. The warm and prefetch cases with
two workers are in test_warm.py and test_prefetch.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from gateway.app.cli import _parser, load
from gateway.app.cores import available_cores, cgroup_quota
from gateway.config.settings import ConfigError
from tests.conftest import module_proxy
from tests.harness import FreshAdmin, HoardProcess, metric, s3_client
from tests.test_block_cache import hoard_config
from tests.test_cluster import cluster_config
from tests.test_faults import _children
from tests.test_warm import lock_holder, wait_for

MiB = 1024 * 1024


proxy = module_proxy  # one proxy for the module's nodes


@pytest.fixture(scope="module")
def node(tmp_path_factory, proxy) -> Iterator[HoardProcess]:
    config = {**hoard_config(proxy, memory="64MiB"), "workers": 2}
    running = HoardProcess(tmp_path_factory.mktemp("workers"), config).start()
    yield running
    assert running.stop() == 0, running.log()


async def _storm(method: str, urls: list[str]) -> list[int]:
    """Every request at once, each on its own connection; the statuses, in order."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(url: str) -> int:
            async with session.request(method, url) as answer:
                await answer.read()
                return answer.status

        return await asyncio.gather(*(one(url) for url in urls))


def test_list_and_head_storms_cost_one_origin_request_per_node(node, proxy, origin_client, bucket):
    for i in range(20):
        origin_client.put_object(Bucket=bucket, Key=f"storm/{i:03d}.bin", Body=b"x" * i)
    proxy.reset()
    lists = [f"{node.endpoint}/{bucket}?list-type=2&prefix=storm/"] * 64
    assert asyncio.run(_storm("GET", lists)) == [200] * 64
    print(f"64 identical LISTs over 2 workers: {dict(proxy.counts)}")
    assert proxy.counts == {"ListObjects": 1}, proxy.counts
    for name, status, origin in (
        ("storm/007.bin", 200, {"HeadObject": 1}),
        ("storm/missing.bin", 404, {"HeadObject": 1, "HeadBucket": 1}),
    ):
        proxy.reset()
        heads = [f"{node.endpoint}/{bucket}/{name}"] * 64
        assert asyncio.run(_storm("HEAD", heads)) == [status] * 64
        print(f"64 HEADs of one key ({status}) over 2 workers: {dict(proxy.counts)}")
        assert proxy.counts == origin, proxy.counts


def test_a_missing_key_costs_one_origin_head_per_node_over_time(node, proxy, bucket):
    """A 404 one worker learned is the node's for the negative TTL, as a found
    object in the store is: HEADs one after another, each on a connection of its
    own (SO_REUSEPORT spreads them over both workers: all 24 on one worker has a
    chance of 2^-23), cost one origin HEAD, not one per worker."""
    url = f"{node.endpoint}/{bucket}/gone/{os.urandom(4).hex()}"
    proxy.reset()
    statuses = [asyncio.run(_storm("HEAD", [url]))[0] for _ in range(24)]
    assert statuses == [404] * 24
    assert proxy.counts == {"HeadObject": 1, "HeadBucket": 1}, proxy.counts


def test_stats_and_metrics_are_the_nodes_from_either_worker(node, origin_client, bucket):
    origin_client.put_object(Bucket=bucket, Key="stats/one", Body=os.urandom(MiB))
    asyncio.run(_storm("GET", [f"{node.endpoint}/{bucket}/stats/one"] * 8))
    client = FreshAdmin(node.endpoint)
    stored = MiB + 64  # the block and its header

    def views() -> list[dict]:
        return [client.call("GET", "/_hoard/stats") for _ in range(8)]

    # A worker sees the disk index's totals as of its last look (each second).
    wait_for(lambda: all(v["workers"] == 2 and v["disk"]["used_bytes"] == stored
                         for v in views()))  # fmt: skip
    # cache.memory bounds the node: each worker holds half of it.
    assert {v["memory"]["capacity"] for v in views()} == {64 * MiB}
    wait_for(lambda: metric(node.endpoint, 'hoard_cache_bytes{tier="disk"}') == stored)
    for _ in range(4):  # each scrape reaches either worker: the disk is counted once
        assert metric(node.endpoint, 'hoard_cache_limit_bytes{tier="memory"}') == 64 * MiB
        assert metric(node.endpoint, 'hoard_cache_bytes{tier="disk"}') == stored
        assert metric(node.endpoint, 'hoard_cache_limit_bytes{tier="disk"}') == 1024 * MiB


def _fresh_get(url: str) -> bytes:
    """One keep-alive GET on a connection of its own (SO_REUSEPORT picks the worker)."""
    with requests.Session() as session:
        answer = session.get(url, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.content


# After the stats test: it counts the disk tier's bytes from empty.
def test_a_worker_answers_on_the_hit_path_what_a_sibling_learned(
    node, proxy, origin_client, bucket
):
    """A key read once, on either worker, is a hit-path answer on both from then on: the
    worker that did not read it learns its metadata from the node's store, not from a
    general-path read of its own. 16 keys read twice more on connections of their own
    (spread over both workers): every read is a hit (the old code took the general path
    on a worker's first sight of a key: three in four keys, expected 12 of the 32 reads)."""
    keys = [f"sight/{os.urandom(4).hex()}" for _ in range(16)]
    bodies = {key: os.urandom(4096) for key in keys}
    for key, body in bodies.items():  # at the origin: a write through Hoard would cache it
        origin_client.put_object(Bucket=bucket, Key=key, Body=body)
    stored = metric(node.endpoint, 'hoard_cache_bytes{tier="disk"}')
    for key in keys:  # the cold read: a miss on whichever worker the connection reaches
        assert _fresh_get(f"{node.endpoint}/{bucket}/{key}") == bodies[key]
    wanted = stored + 16 * 4096  # (each block file holds its header too)
    wait_for(lambda: metric(node.endpoint, 'hoard_cache_bytes{tier="disk"}') >= wanted)
    proxy.reset()
    hits = metric(node.endpoint, "hoard_hit_path_responses_total")
    for key in keys * 2:
        assert _fresh_get(f"{node.endpoint}/{bucket}/{key}") == bodies[key]
    assert metric(node.endpoint, "hoard_hit_path_responses_total") - hits == 32
    assert sum(proxy.counts.values()) == 0, proxy.counts


@pytest.mark.timeout(120)
def test_one_prober_per_node_and_a_new_leader_when_it_dies(tmp_path, proxy):
    """A 2-node cluster of 2 workers each: every worker of a node shows the same view;
    the leader worker is killed; its successor notices a peer going away."""
    nodes = [HoardProcess(tmp_path / f"n{i}", {**hoard_config(proxy), "workers": 2})
             for i in range(2)]  # fmt: skip
    peers = [n.endpoint for n in nodes]
    for n in nodes:
        n.config["cluster"] = cluster_config(n, peers)
    try:
        for n in nodes:
            n.start()
        first = FreshAdmin(nodes[0].endpoint)
        wait_for(lambda: all(len(first.call("GET", "/_hoard/cluster")["live"]) == 2
                             for _ in range(6)))  # fmt: skip
        assert (tmp_path / "n0" / "cache" / "node" / "membership.json").exists()
        leader = lock_holder(tmp_path / "n0" / "cache" / "node" / "leader")
        assert nodes[0].proc is not None and leader in _children(nodes[0].proc.pid)
        os.kill(leader, signal.SIGKILL)
        wait_for(lambda: leader not in _children(nodes[0].proc.pid))
        wait_for(lambda: lock_holder(tmp_path / "n0" / "cache" / "node" / "leader")
                 not in (None, leader))  # fmt: skip
        nodes[1].stop()
        started = time.monotonic()
        wait_for(lambda: all(first.call("GET", "/_hoard/cluster")["live"] == [peers[0]]
                             for _ in range(6)))  # fmt: skip
        print(f"peer dropped by the new leader's view in {time.monotonic() - started:.1f}s")
    finally:
        for n in nodes:
            n.stop()


def _cgroup(root: Path, own: str, files: dict[str, str]) -> Path:
    """A fake /sys/fs/cgroup with ``files`` (relative paths) and /proc/self/cgroup."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc_self = root / "proc-self-cgroup"
    proc_self.write_text(f"0::{own}\n")
    return proc_self


def test_available_cores_follow_the_tightest_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    proc = _cgroup(tmp_path, "/", {"cpu.max": "max 100000\n"})
    assert cgroup_quota(tmp_path, proc) is None
    assert available_cores(tmp_path, proc) == affinity
    # v2, nested: the pod's parent allows 1.5 cores, the container itself more.
    nested = tmp_path / "v2"
    proc = _cgroup(nested, "/kubepods/pod1/c1", {
        "kubepods/pod1/cpu.max": "150000 100000\n", "kubepods/pod1/c1/cpu.max": "400000 100000\n",
    })  # fmt: skip
    assert cgroup_quota(nested, proc) == 1.5
    assert available_cores(nested, proc) == 1  # rounded down: one worker at full speed
    v1 = tmp_path / "v1"
    proc = _cgroup(v1, "/", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                             "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})  # fmt: skip
    assert cgroup_quota(v1, proc) is None
    (v1 / "cpu,cpuacct/cpu.cfs_quota_us").write_text("100000\n")
    assert available_cores(v1, proc) == 1


def test_workers_auto_is_resolved_at_load(tmp_path):
    config = tmp_path / "hoard.yaml"
    config.write_text("workers: auto\norigins: {d: {type: posix, path: .}}\ndefault_origin: d\n")
    args = _parser().parse_args(["serve", "--config", str(config)])
    assert load(args).workers == available_cores()
    args = _parser().parse_args(["serve", "--config", str(config), "--workers", "3"])
    assert load(args).workers == 3
    config.write_text("workers: many\n")
    with pytest.raises(ConfigError):
        load(_parser().parse_args(["serve", "--config", str(config)]))


async def _lanes_on_both_workers(host: str, port: int) -> list[tuple[Any, Any]]:
    """Keep-alive connections until both workers hold at least one (told apart by their
    request ids' prefix, one per process); at most 40 tries (SO_REUSEPORT spreads them)."""
    from tests.test_express_lane import read_raw

    held: dict[bytes, list[tuple[Any, Any]]] = {}
    for _ in range(40):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /_hoard/health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        answer = await read_raw(reader)
        worker = dict(answer.lines()).get(b"x-amz-request-id", b"")[:8]
        held.setdefault(worker, []).append((reader, writer))
        if len(held) == 2:
            break
    assert len(held) == 2, "one worker took every connection"
    return [pair for pairs in held.values() for pair in pairs]


@pytest.mark.parametrize("signing", ["presigned", "header"])
async def test_a_write_through_one_worker_is_seen_by_the_other_workers_lane(node, bucket, signing):
    """The express lane (s3/express.py) on both workers holds a key's answer; a write
    acknowledged by either worker is seen by the very next repeat on every connection of
    both: the lane checks the node's journal and the key's metadata on every repeat."""
    from tests.rawhttp import presign, sign_headers
    from tests.test_express_lane import read_raw

    host = node.endpoint.removeprefix("http://")
    port = int(host.rsplit(":", 1)[1])
    key = f"lane/{os.urandom(4).hex()}"
    client = s3_client(node.endpoint)
    client.put_object(Bucket=bucket, Key=key, Body=b"old" * 1000)
    target = f"/{bucket}/{key}"
    presigned = presign("GET", host, target) if signing == "presigned" else None

    def request() -> bytes:
        if presigned is not None:
            return f"GET {presigned} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        signed = sign_headers("GET", host, target)
        lines = "".join(f"{name}: {value}\r\n" for name, value in signed.items())
        return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{lines}\r\n".encode()

    connections = await _lanes_on_both_workers(host, port)
    try:
        for reader, writer in connections * 3:  # kept by the first, then the lane's
            writer.write(request())
            assert (await read_raw(reader)).body == b"old" * 1000
        hits = metric(node.endpoint, "hoard_hit_path_responses_total")
        client.put_object(Bucket=bucket, Key=key, Body=b"new" * 500)  # either worker
        for reader, writer in connections * 2:
            writer.write(request())
            answer = await read_raw(reader)
            assert answer.status == 200 and answer.body == b"new" * 500
        assert metric(node.endpoint, "hoard_hit_path_responses_total") > hits
    finally:
        for _, writer in connections:
            writer.close()
