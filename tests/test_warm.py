"""Warm jobs against real Hoard processes, with moto behind the counting proxy.

Single-node cases here, each with one worker and with two (``workers: 2``: the
admin client's connections reach either worker, and every answer must be the
node's); the 3-node cluster and restart cases in test_warm_cluster.py. Blocks are 1 MiB so datasets stay small; the memory tier keeps nothing (its item
limit is below a block), so every hit after warming is a disk hit.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.client.admin import AdminClient, AdminError
from tests.conftest import module_proxy, moto_origin
from tests.harness import ACCESS_KEY, FreshAdmin, HoardProcess
from tests.origin_proxy import OriginProxy
from tests.test_faults import _children

MiB = 1024 * 1024
BLOCK = MiB


def node_config(proxy: OriginProxy, **cache: str) -> dict:
    return {
        "origins": {"moto": moto_origin(proxy, max_attempts=2)},
        "default_origin": "moto",
        "access_log": False,
        "cache": {"block_size": "1MiB", "size": "256MiB", "memory": "8MiB",
                  "memory_item_max": "64KiB", **cache},
        "warm": {"concurrency": 4},
    }  # fmt: skip


def admin(node: HoardProcess) -> FreshAdmin:
    return FreshAdmin(node.endpoint)


def wait_job(client: FreshAdmin, job_id: str, timeout: float = 60.0) -> list[dict]:
    """Poll until the job is finished; every status seen, in order."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.call("GET", f"/_hoard/warm/{job_id}")
        seen.append(status)
        if status["state"] in ("done", "failed", "cancelled"):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} not finished: {seen[-1]}")


def assert_monotonic(seen: list[dict]) -> None:
    for field in ("objects_done", "bytes_done"):
        values = [s[field] for s in seen]
        assert values == sorted(values), (field, values)


def put_dataset(origin_client, bucket: str, prefix: str, sizes: list[int]) -> dict[str, bytes]:
    data = {f"{prefix}{i:04d}.bin": os.urandom(size) for i, size in enumerate(sizes)}
    for key, body in data.items():
        origin_client.put_object(Bucket=bucket, Key=key, Body=body)
    return data


def blocks_of(sizes: list[int]) -> int:
    return sum(-(-size // BLOCK) for size in sizes)


proxy = module_proxy  # one proxy for the module's nodes


@pytest.fixture(scope="module", params=[1, 2], ids=["workers1", "workers2"])
def node(request, tmp_path_factory, proxy) -> Iterator[HoardProcess]:
    config = {**node_config(proxy), "workers": request.param}
    process = HoardProcess(tmp_path_factory.mktemp("warm"), config).start()
    yield process
    assert process.stop() == 0, process.log()


def test_warm_a_prefix_fetches_each_block_once_then_reads_are_hits(
    node, proxy, origin_client, bucket
):
    sizes = [3 * BLOCK + 100 * i for i in range(6)] + [1000 * (i + 1) for i in range(10)]
    data = put_dataset(origin_client, bucket, "train/", sizes)
    put_dataset(origin_client, bucket, "other/", [BLOCK])  # not under the prefix
    client = admin(node)
    proxy.reset()
    job = client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "train/"})
    seen = wait_job(client, job["id"])
    final = seen[-1]
    assert final["state"] == "done", final
    assert_monotonic(seen)
    assert final["objects_done"] == final["objects_total"] == len(sizes)
    assert final["bytes_done"] == final["bytes_total"] == sum(sizes)
    assert final["errors"] == 0 and final["eta"] == 0
    print(f"warm: {dict(proxy.counts)}, {proxy.get_bytes} origin GET bytes for {sum(sizes)}")
    assert proxy.counts["GetObject"] == blocks_of(sizes)
    assert proxy.counts["HeadObject"] == 0  # block 0's GET told the metadata
    assert proxy.get_bytes == sum(sizes)
    # Exact with 2 workers too: a block 0 that lands while its metadata is flushed to
    # the shared store, before the job looks, is still counted as fetched.
    assert final["bytes_fetched"] == sum(sizes)
    proxy.reset()
    s3 = node.client()
    for key, body in data.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    assert sum(proxy.counts.values()) == 0, proxy.counts
    listed = client.call("GET", "/_hoard/warm")["jobs"]
    assert job["id"] in [j["id"] for j in listed]


def test_a_warm_job_and_readers_of_the_same_keys_fetch_each_block_once(
    node, proxy, origin_client, bucket
):
    """The benchmark's train-warm: a warm job of a prefix starts as readers read it.

    The origin answers after a delay, so the job's and the readers' misses of
    one object overlap. Whoever gets there first, each block is fetched once
    and no object costs a HEAD: a cold read learns the metadata from its
    first-block GET, and the job must not ask for it separately.
    """
    sizes = [20_000 + 10 * i for i in range(48)]  # one block each
    data = put_dataset(origin_client, bucket, "race/", sizes)
    order = sorted(data)
    random.Random(7).shuffle(order)  # readers go in their own order, the job in key order
    client, s3 = admin(node), node.client()
    proxy.reset()
    proxy.latency = 0.02
    try:
        job = client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "race/"})
        with ThreadPoolExecutor(4) as pool:
            bodies = list(pool.map(lambda k: s3.get_object(Bucket=bucket, Key=k)["Body"].read(),
                                   order))  # fmt: skip
        final = wait_job(client, job["id"])[-1]
    finally:
        proxy.latency = 0.0
    assert bodies == [data[key] for key in order]
    assert final["state"] == "done" and final["bytes_done"] == sum(sizes), final
    print(f"warm + readers: {dict(proxy.counts)}")
    assert sorted(path for path, _ in proxy.ranges) == sorted(f"/{bucket}/{k}" for k in order)
    assert proxy.counts["HeadObject"] == 0, proxy.counts


def test_warm_keys_and_a_manifest_report_missing_keys_as_errors(node, proxy, origin_client, bucket):
    data = put_dataset(origin_client, bucket, "k/", [2 * BLOCK, 5000, BLOCK + 1])
    keys = sorted(data)
    origin_client.put_object(Bucket=bucket, Key="manifest.txt",
                             Body=("\n".join(keys[:2]) + "\n\n").encode())  # fmt: skip
    client = admin(node)
    by_manifest = client.call("POST", "/_hoard/warm", body={"bucket": bucket,
                                                             "manifest": "manifest.txt"})  # fmt: skip
    final = wait_job(client, by_manifest["id"])[-1]
    assert final["state"] == "done" and final["objects_total"] == 2, final
    by_keys = client.call("POST", "/_hoard/warm",
                          body={"bucket": bucket, "keys": [keys[2], "k/missing"]})  # fmt: skip
    final = wait_job(client, by_keys["id"])[-1]
    assert final["state"] == "failed", final
    assert final["errors"] == 1 and "k/missing" in final["error_samples"][0]
    assert final["objects_done"] == final["objects_total"] == 2
    assert "1 of 2 objects failed" in final["reason"]


def test_bad_requests_are_refused_with_json(node, bucket):
    client = admin(node)
    for body, status in (({"prefix": "x"}, 400), ({"bucket": bucket}, 400),
                         ({"bucket": bucket, "prefix": "a", "keys": ["b"]}, 400),
                         ({"bucket": "no-such-bucket-here", "prefix": ""}, 404)):  # fmt: skip
        with pytest.raises(AdminError) as refused:
            client.call("POST", "/_hoard/warm", body=body)
        assert refused.value.status == status, refused.value.body
    with pytest.raises(AdminError) as missing:
        client.call("GET", "/_hoard/warm/nope")
    assert missing.value.status == 404 and missing.value.body["error"] == "NoSuchJob"
    with pytest.raises(AdminError) as unsigned:
        AdminClient(node.endpoint, ACCESS_KEY, "wrong").call("GET", "/_hoard/warm")
    assert unsigned.value.status == 403


@pytest.fixture(scope="module")
def small_node(tmp_path_factory, proxy) -> Iterator[HoardProcess]:
    """A 12 MiB disk tier of which 6 MiB may be pinned."""
    config = node_config(proxy, size="12MiB", pin_quota="6MiB")
    process = HoardProcess(tmp_path_factory.mktemp("pin"), config).start()
    yield process
    assert process.stop() == 0, process.log()


def _stats(node: HoardProcess) -> dict:
    return admin(node).call("GET", "/_hoard/stats")


def test_pinned_data_survives_a_scan_of_three_times_the_cache(
    small_node, proxy, origin_client, bucket
):
    pinned = put_dataset(origin_client, bucket, "pinned/", [BLOCK] * 4 + [1000])
    unpinned = put_dataset(origin_client, bucket, "plain/", [BLOCK] * 4)
    scan = put_dataset(origin_client, bucket, "scan/", [2 * BLOCK] * 18)  # 36 MiB: 3x the cache
    client = admin(small_node)
    pin_job = client.call("POST", "/_hoard/warm",
                          body={"bucket": bucket, "prefix": "pinned/", "pin": True})  # fmt: skip
    assert wait_job(client, pin_job["id"])[-1]["state"] == "done"
    assert wait_job(client, client.call("POST", "/_hoard/warm", body={
        "bucket": bucket, "prefix": "plain/"})["id"])[-1]["state"] == "done"  # fmt: skip
    assert _stats(small_node)["disk"]["pinned_bytes"] >= 4 * BLOCK + 1000
    s3 = small_node.client()
    for key in scan:
        s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert _stats(small_node)["disk"]["evictions"] > 0
    proxy.reset()
    for key, body in pinned.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    assert proxy.counts["GetObject"] == 0, proxy.listed_gets()
    for key in unpinned:  # the control: warmed but not pinned, so the scan evicted it
        s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert proxy.counts["GetObject"] > 0
    # Unpinning releases the quota; the job's record says so.
    unpinned_job = client.call("DELETE", f"/_hoard/warm/{pin_job['id']}", query={"unpin": "1"})
    assert unpinned_job["state"] == "done" and unpinned_job["pinned"] is False
    assert _stats(small_node)["disk"]["pinned_bytes"] == 0


def test_a_pin_beyond_the_quota_is_refused_or_fails_naming_it(small_node, origin_client, bucket):
    big = put_dataset(origin_client, bucket, "big/", [BLOCK] * 8)  # 8 MiB > 6 MiB quota
    client = admin(small_node)
    with pytest.raises(AdminError) as refused:
        client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "big/", "pin": True})
    assert refused.value.status == 409
    assert refused.value.body["error"] == "PinQuotaExceeded"
    assert "cache.pin_quota" in refused.value.body["message"]
    # A key list's sizes are known only as it runs: the job fails when it reaches the quota.
    job = client.call("POST", "/_hoard/warm",
                      body={"bucket": bucket, "keys": sorted(big), "pin": True})  # fmt: skip
    final = wait_job(client, job["id"])[-1]
    assert final["state"] == "failed" and "cache.pin_quota" in final["reason"], final
    assert _stats(small_node)["disk"]["pinned_bytes"] <= 6 * MiB
    client.call("DELETE", f"/_hoard/warm/{job['id']}", query={"unpin": "1"})
    assert _stats(small_node)["disk"]["pinned_bytes"] == 0


def lock_holder(path: Path) -> int | None:
    """The pid holding a ``flock`` on ``path``, from ``/proc/locks`` (None: nobody)."""
    inode = path.stat().st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields and fields[1] == "FLOCK" and fields[5].endswith(f":{inode}"):
            return int(fields[4])
    return None


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_job_survives_the_worker_running_it_being_killed(tmp_path, proxy, origin_client, bucket):
    """workers: 2. Any worker answers for the job; the worker running it is killed
    mid-job; a sibling (or its replacement) resumes it from its checkpoint."""
    sizes = [3 * BLOCK] * 10
    data = put_dataset(origin_client, bucket, "k/", sizes)
    node = HoardProcess(tmp_path, {**node_config(proxy), "workers": 2}).start()
    client = admin(node)
    try:
        proxy.reset()
        proxy.mode, proxy.slow_delay = "slow", 0.01
        job = client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "k/"})
        # Every call is a new connection, so both workers answer these.
        seen = [client.call("GET", f"/_hoard/warm/{job['id']}") for _ in range(16)]
        assert {s["id"] for s in seen} == {job["id"]}
        assert all(job["id"] in [j["id"] for j in client.call("GET", "/_hoard/warm")["jobs"]]
                   for _ in range(8))  # fmt: skip
        wait_for(lambda: client.call("GET", f"/_hoard/warm/{job['id']}")["bytes_done"]
                 >= 8 * BLOCK)  # fmt: skip
        before = client.call("GET", f"/_hoard/warm/{job['id']}")
        runner = lock_holder(tmp_path / "cache" / "warm" / f"{job['id']}.lock")
        assert runner is not None and node.proc is not None
        assert runner in _children(node.proc.pid)
        os.kill(runner, signal.SIGKILL)
        proxy.mode = "ok"
        # Connections its socket had queued are reset; later ones reach the others.
        wait_for(lambda: runner not in _children(node.proc.pid))
        seen = [before, *wait_job(client, job["id"])]
        assert seen[-1]["state"] == "done", seen[-1]
        assert_monotonic(seen)
        assert seen[-1]["bytes_done"] == seen[-1]["bytes_total"] == sum(sizes)
        fetched = proxy.counts["GetObject"]
        print(f"worker killed: {fetched} origin GETs for {blocks_of(sizes)} blocks")
        # Fetched again at most: the GETs in flight in the killed worker (warm.concurrency),
        # and blocks it wrote whose index rows were not committed yet (seen: 5 in all).
        assert blocks_of(sizes) <= fetched <= blocks_of(sizes) + 2 * 4
        wait_for(lambda: len(_children(node.proc.pid)) == 2)  # replaced
        proxy.reset()
        s3 = node.client()
        for key, body in data.items():
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
        assert proxy.counts["GetObject"] == 0, proxy.counts
    finally:
        proxy.mode = "ok"
        assert node.stop() == 0, node.log()


def test_a_cancel_through_any_worker_stops_the_job(tmp_path, proxy, origin_client, bucket):
    """workers: 2: the cancel reaches the worker running the share, wherever it lands."""
    sizes = [4 * BLOCK] * 8
    put_dataset(origin_client, bucket, "c/", sizes)
    node = HoardProcess(tmp_path, {**node_config(proxy), "workers": 2}).start()
    client = admin(node)
    try:
        proxy.reset()
        proxy.mode, proxy.slow_delay = "slow", 0.02
        job = client.call("POST", "/_hoard/warm", body={"bucket": bucket, "prefix": "c/"})
        wait_for(lambda: client.call("GET", f"/_hoard/warm/{job['id']}")["bytes_done"] > 0)
        cancelled = client.call("DELETE", f"/_hoard/warm/{job['id']}")
        assert cancelled["state"] == "cancelled"
        assert cancelled["nodes"]["local"]["state"] == "cancelled", cancelled
        stopped = proxy.counts["GetObject"]
        # Fills in flight finish (at most warm.concurrency); nothing new starts.
        for _ in range(8):
            final = client.call("GET", f"/_hoard/warm/{job['id']}")
            assert final["state"] == "cancelled"
            assert final["nodes"]["local"]["state"] == "cancelled"
        assert proxy.counts["GetObject"] <= stopped + 4
        assert proxy.counts["GetObject"] < blocks_of(sizes)
    finally:
        proxy.mode = "ok"
        assert node.stop() == 0, node.log()
