"""Warm jobs on a 3-node cluster, cancel, and a real restart of the accepting node.

Every node reads moto through one counting ``OriginProxy``; blocks are 1 MiB.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cache.block import BlockId
from gateway.cluster.rendezvous import Ranking
from tests.harness import FreshAdmin, HoardProcess
from tests.origin_proxy import OriginProxy
from tests.test_auto_warm import wait_for_jobs
from tests.test_cluster import SECRET, wait_live
from tests.test_warm import (  # proxy is a (module-scoped) fixture, exported below
    BLOCK,
    admin,
    assert_monotonic,
    blocks_of,
    node_config,
    proxy,
    put_dataset,
    wait_job,
)

__all__ = ["proxy"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, proxy) -> Iterator[list[HoardProcess]]:
    root = tmp_path_factory.mktemp("warm-cluster")
    nodes = [HoardProcess(root / f"node{i}", node_config(proxy)) for i in range(3)]
    for node in nodes:
        node.config["cluster"] = {"self": node.endpoint, "peers": [n.endpoint for n in nodes],
                                  "secret": SECRET, "probe_interval": "0.25s"}  # fmt: skip
    try:
        for node in nodes:
            node.start()
        wait_live(nodes, 3)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _stores(node: HoardProcess, block: BlockId) -> bool:
    """Whether the node's disk tier indexes the block (its own file, or packed in a segment)."""
    index = Path(node.config["cache"]["dir"]) / "index.sqlite3"
    with contextlib.closing(sqlite3.connect(index)) as conn:
        row = conn.execute(
            "SELECT 1 FROM blocks WHERE digest = ?", (bytes.fromhex(block.digest),)
        ).fetchone()
    return row is not None


def test_a_cluster_warms_each_block_once_on_its_owner(cluster, proxy, origin_client, bucket):
    sizes = [4 * BLOCK + 7 * i for i in range(8)] + [2000 * (i + 1) for i in range(8)]
    data = put_dataset(origin_client, bucket, "ds/", sizes)
    client = admin(cluster[0])
    proxy.reset()
    started = time.monotonic()
    job = client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "ds/"})
    seen = wait_job(client, job["id"])
    elapsed = time.monotonic() - started
    final = seen[-1]
    assert final["state"] == "done", final
    assert_monotonic(seen)
    assert final["bytes_done"] == final["bytes_total"] == sum(sizes)
    assert final["objects_done"] == final["objects_total"] == len(sizes)
    assert set(final["nodes"]) == {node.endpoint for node in cluster}
    blocks = blocks_of(sizes)
    print(f"3 nodes warmed {blocks} blocks, {sum(sizes)} bytes in {elapsed:.2f}s: "
          f"{dict(proxy.counts)}, {proxy.get_bytes} origin GET bytes")  # fmt: skip
    assert proxy.counts["GetObject"] == blocks, proxy.listed_gets()
    assert proxy.get_bytes == sum(sizes)
    # Each block is on its owner by rendezvous over the three nodes, and only there.
    ranking = Ranking([node.endpoint for node in cluster])
    by_url = {node.endpoint: node for node in cluster}
    per_node = dict.fromkeys(by_url, 0)
    for key, body in data.items():
        etag = origin_client.head_object(Bucket=bucket, Key=key)["ETag"]
        for index in range(-(-len(body) // BLOCK)):
            block = BlockId("moto", bucket, key, etag, index)
            owner = ranking.rank(block.digest)[0].name
            per_node[owner] += 1
            for url, node in by_url.items():
                assert _stores(node, block) == (url == owner), (key, index, url)
    assert all(count > 0 for count in per_node.values()), per_node
    proxy.reset()
    for i, (key, body) in enumerate(sorted(data.items())):
        assert cluster[i % 3].client().get_object(Bucket=bucket, Key=key)["Body"].read() == body
    assert sum(proxy.counts.values()) == 0, proxy.counts


def test_a_cold_epoch_read_through_one_node_warms_the_rest_on_every_owner(
    cluster, proxy, origin_client, bucket
):
    """Auto-warm in a cluster: the node that served the listing counts the cold reads
    whose first block it fetched from the origin itself (a third of them, the blocks it
    owns), then its job's shares fill each block once on its owner."""
    data = put_dataset(origin_client, bucket, "auto/", [2000 + i for i in range(150)])
    s3 = cluster[0].client(max_pool_connections=1)
    assert s3.list_objects_v2(Bucket=bucket, Prefix="auto/")["KeyCount"] == 150
    proxy.reset()
    order = random.Random(5).sample(sorted(data), len(data))
    # 120 reads: node 0 owns ~40 of their blocks (fewer than the 16 auto_after: p ~ 2e-6).
    for key in order[:120]:
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data[key]
    jobs = wait_for_jobs(FreshAdmin(cluster[0].endpoint), "auto/")
    assert {j["state"] for j in jobs} == {"done"}, jobs
    assert all(set(j["nodes"]) == {n.endpoint for n in cluster} for j in jobs), jobs
    for key in order[120:]:
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data[key]
    assert proxy.counts["GetObject"] == len(data), proxy.listed_gets()  # each block once


def test_cancel_stops_origin_traffic_on_every_node(cluster, proxy, origin_client, bucket):
    sizes = [4 * BLOCK] * 12
    put_dataset(origin_client, bucket, "slow/", sizes)
    client = admin(cluster[1])
    proxy.reset()
    proxy.mode, proxy.slow_delay = "slow", 0.02
    try:
        job = client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "slow/"})
        _wait_for(lambda: client.call("GET", f"/_hoard/warm/{job['id']}")["bytes_done"] > 0)
        cancelled = client.call("DELETE", f"/_hoard/warm/{job['id']}")
        assert cancelled["state"] == "cancelled"
        # Fills already in flight finish (at most warm.concurrency per node); nothing new starts.
        settled = _settle(proxy)
        time.sleep(1.0)
        assert proxy.counts["GetObject"] == settled
        assert settled < blocks_of(sizes), settled
        final = client.call("GET", f"/_hoard/warm/{job['id']}")
        assert final["state"] == "cancelled"
        assert all(n["state"] == "cancelled" for n in final["nodes"].values()), final["nodes"]
    finally:
        proxy.mode = "ok"


def _settle(proxy: OriginProxy, quiet: float = 0.5, timeout: float = 20.0) -> int:
    """Wait until the origin GET count stops moving for ``quiet`` seconds; that count."""
    deadline = time.monotonic() + timeout
    last, since = proxy.counts["GetObject"], time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = proxy.counts["GetObject"]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError("origin traffic never stopped")


def _wait_for(condition, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_a_job_resumes_after_the_accepting_node_is_killed(tmp_path, proxy, origin_client, bucket):
    sizes = [3 * BLOCK] * 10
    data = put_dataset(origin_client, bucket, "r/", sizes)
    node = HoardProcess(tmp_path / "solo", node_config(proxy)).start()
    try:
        client = admin(node)
        proxy.reset()
        proxy.mode, proxy.slow_delay = "slow", 0.01
        job = client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "r/"})
        _wait_for(lambda: client.call("GET", f"/_hoard/warm/{job['id']}")["bytes_done"]
                  >= 8 * BLOCK)  # fmt: skip
        before = client.call("GET", f"/_hoard/warm/{job['id']}")
        node.stop(signal.SIGKILL)
        proxy.mode = "ok"
        node.start()
        seen = [before, *wait_job(client, job["id"])]
        assert seen[-1]["state"] == "done", seen[-1]
        assert_monotonic(seen)
        assert seen[-1]["bytes_done"] == seen[-1]["bytes_total"] == sum(sizes)
        # Blocks stored before the kill are not fetched again; those in flight may be.
        fetched = proxy.counts["GetObject"]
        print(f"restart: {fetched} origin GETs for {blocks_of(sizes)} blocks")
        assert blocks_of(sizes) <= fetched <= blocks_of(sizes) + 4
        proxy.reset()
        for key, body in data.items():
            assert node.client().get_object(Bucket=bucket, Key=key)["Body"].read() == body
        assert proxy.counts["GetObject"] == 0, proxy.counts
    finally:
        proxy.mode = "ok"
        node.stop()
