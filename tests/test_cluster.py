"""Three Hoard processes as one cluster, proved by counting what reaches the origin.

Every node reads moto through one ``OriginProxy``; the nodes name each other in
``cluster.peers`` and share a secret. Blocks are 8 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime

import aiohttp
import pytest
import requests
import yaml

from gateway.app.cli import main
from gateway.cluster.peers import (
    BlockRequest,
    metadata_target,
    nonce_text,
    request_headers,
)
from gateway.metadata.query import MetadataQuery
from tests.conftest import module_proxy, moto_origin
from tests.harness import HoardProcess, metric
from tests.origin_proxy import OriginProxy
from tests.rawhttp import signed_send

MiB = 1024 * 1024
BLOCK = 8 * MiB
SECRET = "cluster-test-secret"


def _config(proxy: OriginProxy, cache: dict | None = None) -> dict:
    return {
        "origins": {"moto": moto_origin(proxy, max_attempts=2)},
        "default_origin": "moto",
        "allow_anonymous": True,
        "access_log": False,
        "cache": {"block_size": "8MiB", "size": "1GiB", "memory": "64MiB", **(cache or {})},
    }  # fmt: skip


def cluster_config(node: HoardProcess, peers: list[str]) -> dict:
    # A killed node refuses connections, so it is found out within fail_after probes
    # however long probe_timeout is. A short timeout would only mark live nodes dead on
    # a loaded machine (their answer late, not absent), and their reads would go to the
    # origin: these tests count origin requests, not failure detection's timing.
    return {"self": node.endpoint, "peers": peers, "secret": SECRET, "probe_interval": "0.25s",
            "probe_timeout": "5s", "fail_after": 2, "rejoin_after": 2}  # fmt: skip


def start_cluster(
    tmp_path, proxy: OriginProxy, count: int = 3, cache: dict | None = None
) -> list[HoardProcess]:
    nodes = [HoardProcess(tmp_path / f"node{i}", _config(proxy, cache)) for i in range(count)]
    peers = [node.endpoint for node in nodes]
    for node in nodes:
        node.config["cluster"] = cluster_config(node, peers)
    started: list[HoardProcess] = []
    try:
        for node in nodes:
            started.append(node.start())
        wait_live(nodes, count)
    except BaseException:
        for node in started:
            node.stop()
        raise
    return nodes


def cluster_view(node: HoardProcess) -> dict:
    answer = signed_send(node.port, "GET", "/_hoard/cluster")
    assert answer.status == 200, answer.body
    return json.loads(answer.body)


def wait_live(nodes: list[HoardProcess], count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(cluster_view(node)["live"]) == count for node in nodes):
            return
        time.sleep(0.1)
    raise AssertionError([cluster_view(node)["live"] for node in nodes])


proxy = module_proxy  # one proxy for the module's nodes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, proxy) -> Iterator[list[HoardProcess]]:
    nodes = start_cluster(tmp_path_factory.mktemp("cluster"), proxy)
    yield nodes
    for node in nodes:
        assert node.stop() == 0, node.log()


async def _get_all(urls: list[str]) -> list[bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(url: str) -> bytes:
            async with session.get(url) as answer:
                assert answer.status == 200, await answer.text()
                return await answer.read()

        return await asyncio.gather(*(one(url) for url in urls))


def get_many(urls: list[str]) -> list[bytes]:
    return asyncio.run(_get_all(urls))


async def _digest_all(urls: list[str]) -> list[str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def one(url: str) -> str:
            digest = hashlib.sha256()
            async with session.get(url) as answer:
                assert answer.status == 200, await answer.text()
                async for chunk in answer.content.iter_chunked(1024 * 1024):
                    digest.update(chunk)
            return digest.hexdigest()

        return await asyncio.gather(*(one(url) for url in urls))


def digests_of_many(urls: list[str]) -> list[str]:
    """The SHA-256 of each body, hashed as it streams: many large bodies never held at once."""
    return asyncio.run(_digest_all(urls))


def test_dataset_round_robin_is_fetched_once_per_cluster(cluster, proxy, origin_client, bucket):
    sizes = [1 * MiB + 17 * i for i in range(12)] + [2 * BLOCK + 12345 * i for i in range(1, 5)]
    data = {f"shard-{i:03d}": os.urandom(size) for i, size in enumerate(sizes)}
    for key, body in data.items():
        origin_client.put_object(Bucket=bucket, Key=key, Body=body)
    keys = sorted(data)
    urls = [f"{cluster[i % 3].endpoint}/{bucket}/{key}" for i, key in enumerate(keys)]
    total = sum(sizes)
    proxy.reset()
    assert get_many(urls) == [data[key] for key in keys]
    print(f"first pass: {proxy.bytes} origin bytes for {total}, {dict(proxy.counts)}")
    assert proxy.bytes <= 1.02 * total, (proxy.bytes, total, proxy.counts)
    proxy.reset()
    assert get_many(urls) == [data[key] for key in keys]
    print(f"second pass: {proxy.bytes} origin bytes, {dict(proxy.counts)}")
    assert sum(proxy.counts.values()) == 0, proxy.counts
    peer = [metric(node.endpoint, 'hoard_bytes_served_total{source="peer"}') for node in cluster]
    assert sum(peer) > 0


def test_cold_readers_on_every_node_cost_one_origin_get_per_block(
    cluster, proxy, origin_client, bucket
):
    data = os.urandom(64 * MiB)
    origin_client.put_object(Bucket=bucket, Key="big", Body=data)
    proxy.reset()
    digests = digests_of_many(
        [f"{node.endpoint}/{bucket}/big" for node in cluster for _ in range(32)]
    )
    assert digests == [hashlib.sha256(data).hexdigest()] * 96
    print(f"64 MiB x 96 readers: {dict(proxy.counts)}, {proxy.bytes} origin bytes")
    assert proxy.counts["GetObject"] == 8, proxy.listed_gets()
    assert proxy.bytes == len(data)


def test_a_write_through_one_node_is_seen_by_another(cluster, origin_client, bucket):
    a, b = cluster[0].client(), cluster[1].client()
    origin_client.put_object(Bucket=bucket, Key="k", Body=b"old")
    assert b.get_object(Bucket=bucket, Key="k")["Body"].read() == b"old"  # cached on b
    assert b.list_objects_v2(Bucket=bucket)["Contents"][0]["Size"] == 3
    a.put_object(Bucket=bucket, Key="k", Body=b"brand new")
    assert b.get_object(Bucket=bucket, Key="k")["Body"].read() == b"brand new"
    assert b.head_object(Bucket=bucket, Key="k")["ContentLength"] == 9
    assert b.list_objects_v2(Bucket=bucket)["Contents"][0]["Size"] == 9
    a.delete_object(Bucket=bucket, Key="k")
    assert b.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_an_origin_change_one_node_meets_is_healed_on_every_node(cluster, origin_client, bucket):
    """An object replaced behind Hoard's back: the node whose fill meets the 412 forgets it
    and tells the others, which then serve the new version, not theirs until the TTL."""
    old, new = os.urandom(BLOCK + 1000), os.urandom(BLOCK + 1000)
    origin_client.put_object(Bucket=bucket, Key="moved", Body=old)
    urls = [f"{node.endpoint}/{bucket}/moved" for node in cluster]
    head = {"Range": "bytes=0-999"}
    for url in urls:  # every node holds the metadata (60 s TTL), block 0 is cached
        assert requests.get(url, headers=head, timeout=30).content == old[:1000]
    origin_client.put_object(Bucket=bucket, Key="moved", Body=new)
    # Block 1 was never cached: its fill asks with If-Match, meets the 412, heals, retries.
    tail = requests.get(urls[0], headers={"Range": f"bytes={BLOCK}-"}, timeout=30)
    assert (tail.status_code, tail.content) == (206, new[BLOCK:])
    for url in urls[1:]:  # told in the background: bounded wait for what they serve
        deadline = time.monotonic() + 30
        while (served := requests.get(url, headers=head, timeout=30).content) != new[:1000]:
            assert served == old[:1000]
            assert time.monotonic() < deadline, "the other node still serves the old version"
            time.sleep(0.05)


_SENDER = os.urandom(8)
_COUNTER = iter(range(1, 1 << 62))


def _signed(node: HoardProcess, target: str, secret: str = SECRET, method: str = "GET") -> dict:
    """Headers a node's client would send ``node`` for ``target``, with a fresh nonce."""
    nonce = nonce_text(_SENDER, next(_COUNTER))
    return request_headers(secret, method, node.endpoint, target, str(int(time.time())), nonce)


def test_peer_endpoint_needs_the_cluster_signature(cluster, origin_client, bucket):
    data = os.urandom(1000)
    origin_client.put_object(Bucket=bucket, Key="secret", Body=data)
    etag = origin_client.head_object(Bucket=bucket, Key="secret")["ETag"]
    block = BlockRequest("moto", bucket, "secret", etag, 0, 0, 999, 0, 1000)
    url = cluster[0].endpoint + block.target()
    unsigned = requests.get(url, timeout=5)
    wrong = requests.get(url, timeout=5, headers=_signed(cluster[0], block.target(), "not-it"))
    for answer in (unsigned, wrong):
        assert answer.status_code == 403
        assert data not in answer.content
    right = requests.get(url, timeout=5, headers=_signed(cluster[0], block.target()))
    assert right.status_code == 200 and right.content == data
    # The metadata endpoint too: no size or ETag without the signature.
    meta = metadata_target(MetadataQuery("head", "moto", bucket, "secret", 60.0, 10.0))
    for headers in ({}, _signed(cluster[1], meta, "wrong")):
        answer = requests.get(cluster[1].endpoint + meta, timeout=5, headers=headers)
        assert answer.status_code == 403 and etag.strip('"') not in answer.text
    answer = requests.get(cluster[1].endpoint + meta, timeout=5, headers=_signed(cluster[1], meta))
    assert answer.status_code == 200 and answer.json()["etag"] == etag


def test_a_captured_peer_request_cannot_be_replayed_on_any_node(cluster):
    """The issue's replay: a signed drop-everything request, captured and sent again,
    to the node it was for and to the others."""
    target = "/_hoard/peer/invalidate?all=1&sha256=" + hashlib.sha256(b"[]").hexdigest()
    captured = _signed(cluster[0], target, method="POST")
    first = requests.post(cluster[0].endpoint + target, data=b"[]", headers=captured, timeout=5)
    assert first.status_code == 204
    for node in cluster:  # the same node again, and every other
        again = requests.post(node.endpoint + target, data=b"[]", headers=captured, timeout=5)
        assert again.status_code == 403, node.endpoint


def test_a_killed_node_leaves_and_readers_never_notice(tmp_path, proxy, origin_client, bucket):
    nodes = start_cluster(tmp_path, proxy)
    try:
        data = {f"large-{i}": os.urandom(4 * BLOCK - 1000 * i) for i in range(4)}
        for key, body in data.items():
            origin_client.put_object(Bucket=bucket, Key=key, Body=body)
        keys = sorted(data) * 4
        survivors = nodes[1:]
        urls = [f"{survivors[i % 2].endpoint}/{bucket}/{key}" for i, key in enumerate(keys)]
        proxy.mode, proxy.slow_delay = "slow", 0.01  # cold fills take seconds: kill mid-stream
        proxy.reset()

        async def read_while_killing() -> tuple[list[bytes], float]:
            reads = asyncio.ensure_future(_get_all(urls))
            await asyncio.sleep(1.0)
            assert not reads.done()
            killed = time.time()
            nodes[0].stop(signal.SIGKILL)
            return await reads, killed

        bodies, killed = asyncio.run(read_while_killing())
        proxy.mode = "ok"
        assert bodies == [data[key] for key in keys]
        total = sum(len(body) for body in data.values())
        print(f"SIGKILL mid-read, 16 readers: {proxy.bytes} origin bytes for {total}, "
              f"{dict(proxy.counts)}")  # fmt: skip
        for node in survivors:
            assert nodes[0].endpoint not in cluster_view(node)["live"]
            # When it left, by the survivor's own clock (this process is busy streaming).
            detection = _left_at(node, nodes[0].endpoint) - killed
            print(f"killed node left {node.endpoint}'s live set after {detection:.2f}s")
            assert detection < 2.0  # fail_after 2 x probe_interval 0.25 s, with slack
    finally:
        proxy.mode = "ok"
        for node in nodes:
            node.stop()


def _left_at(node: HoardProcess, url: str) -> float:
    for line in node.log().splitlines():
        if f"cluster peer {url} left the live set" in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise AssertionError(f"{url} never left the live set of {node.endpoint}")


def test_a_cluster_without_a_secret_is_a_config_error(tmp_path, capsys):
    config = tmp_path / "hoard.yaml"
    config.write_text(
        "cluster: {self: 'http://127.0.0.1:9000', peers: ['http://127.0.0.1:9001']}\n"
        "origins: {d: {type: posix, path: .}}\ndefault_origin: d\n"
    )
    assert main(["serve", "--config", str(config)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["hoard: config error: cluster.secret: a cluster (cluster.self with peers "
                     "or dns) needs a secret"]  # fmt: skip


async def _storm(method: str, urls: list[str]) -> list[int]:
    """Every request at once; the statuses, in order."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one(url: str) -> int:
            async with session.request(method, url) as answer:
                await answer.read()
                return answer.status

        return await asyncio.gather(*(one(url) for url in urls))


def test_list_and_head_storms_over_every_node_reach_the_origin_once(
    cluster, proxy, origin_client, bucket
):
    for i in range(30):
        origin_client.put_object(Bucket=bucket, Key=f"train/{i:03d}.bin", Body=b"x" * i)
    spread = [cluster[i % 3].endpoint for i in range(96)]  # 3 nodes x 32 concurrent
    proxy.reset()
    lists = [f"{node}/{bucket}?list-type=2&prefix=train/" for node in spread]
    assert asyncio.run(_storm("GET", lists)) == [200] * 96
    print(f"3 x 32 identical LISTs: {dict(proxy.counts)}, {proxy.bytes} origin bytes")
    assert proxy.counts == {"ListObjects": 1}, proxy.counts
    # A miss is one origin HEAD; the S3 origin tells NoSuchKey from NoSuchBucket with a
    # HeadBucket after it, so the negative answer (cached as such on every node) costs two.
    for name, status, origin in (
        ("train/007.bin", 200, {"HeadObject": 1}),
        ("train/missing.bin", 404, {"HeadObject": 1, "HeadBucket": 1}),
    ):
        proxy.reset()
        heads = [f"{node}/{bucket}/{name}" for node in spread]
        assert asyncio.run(_storm("HEAD", heads)) == [status] * 96
        print(f"3 x 32 HEADs of one key ({status}): {dict(proxy.counts)}")
        assert proxy.counts == origin, proxy.counts
    # Every node now answers from its own cache: no origin, no owner.
    proxy.reset()
    assert asyncio.run(_storm("GET", lists[:3])) == [200] * 3
    assert asyncio.run(_storm("HEAD", heads[:3])) == [404] * 3
    assert sum(proxy.counts.values()) == 0, proxy.counts


def _dataset(origin_client, bucket: str, sizes: list[int]) -> dict[str, bytes]:
    data = {f"part-{i:03d}": os.urandom(size) for i, size in enumerate(sizes)}
    for key, body in data.items():
        origin_client.put_object(Bucket=bucket, Key=key, Body=body)
    return data


def _read_round_robin(nodes: list[HoardProcess], bucket: str, data: dict[str, bytes]) -> None:
    keys = sorted(data)
    urls = [f"{nodes[i % len(nodes)].endpoint}/{bucket}/{key}" for i, key in enumerate(keys)]
    assert get_many(urls) == [data[key] for key in keys]


def _reconfigure(node: HoardProcess, peers: list[str]) -> None:
    """Rewrite the node's config file with ``peers`` and have it re-read it (SIGHUP)."""
    node.config["cluster"] = cluster_config(node, peers)
    (node.workdir / f"hoard-{node.port}.yaml").write_text(yaml.safe_dump(node.config))
    assert node.proc is not None
    node.proc.send_signal(signal.SIGHUP)


def test_a_fourth_node_joins_a_warm_cluster_without_refetching(
    tmp_path, proxy, origin_client, bucket
):
    small = {"block_size": "1MiB"}  # many blocks from little data: shares are statistical
    nodes = start_cluster(tmp_path, proxy, cache=small)
    newcomer = HoardProcess(tmp_path / "node3", _config(proxy, small))
    try:
        data = _dataset(origin_client, bucket, [MiB * (1 + i % 4) + 999 * i for i in range(20)])
        total = sum(len(body) for body in data.values())
        proxy.reset()
        _read_round_robin(nodes, bucket, data)
        print(f"warm-up, 3 nodes: {proxy.bytes} origin bytes for {total}, {dict(proxy.counts)}")
        peers = [node.endpoint for node in [*nodes, newcomer]]
        newcomer.config["cluster"] = cluster_config(newcomer, peers)
        newcomer.start()
        for node in nodes:
            _reconfigure(node, peers)  # the running nodes learn of it at run time
        wait_live([*nodes, newcomer], 4)
        proxy.reset()
        _read_round_robin([*nodes, newcomer], bucket, data)
        handed = metric(newcomer.endpoint, 'hoard_peer_requests_total{operation="handoff"}')
        print(f"re-read, 4 nodes: {proxy.bytes} origin bytes for {total} "
              f"({proxy.bytes / total:.2%}), {dict(proxy.counts)}, {handed:.0f} handoff asks")  # fmt: skip
        assert proxy.bytes <= 0.02 * total, (proxy.bytes, total, proxy.counts)
        assert handed > 0  # the newcomer owns blocks, and got them from their old owners
        proxy.reset()
        _read_round_robin([*nodes, newcomer], bucket, data)
        assert proxy.counts["GetObject"] == 0, proxy.counts
    finally:
        for node in [*nodes, newcomer]:
            node.stop()


def test_a_restarted_node_rejoins_serves_and_gets_the_invalidations_it_missed(
    tmp_path, proxy, origin_client, bucket
):
    nodes = start_cluster(tmp_path, proxy)
    a, _, c = nodes
    try:
        data = _dataset(origin_client, bucket, [MiB + 7 * i for i in range(6)] + [2 * BLOCK + 5])
        total = sum(len(body) for body in data.values())
        origin_client.put_object(Bucket=bucket, Key="k", Body=b"old")
        _read_round_robin([c], bucket, data)
        assert c.client().head_object(Bucket=bucket, Key="k")["ContentLength"] == 3
        _wait_stored(c, bucket, "k")  # a restart would serve it from c's metadata store
        c.stop(signal.SIGKILL)
        a.client().put_object(Bucket=bucket, Key="k", Body=b"brand new")  # c misses it
        c.start()
        wait_live(nodes, 3)
        proxy.reset()
        _read_round_robin([c, *nodes], bucket, data)
        print(f"restarted node re-reads: {proxy.bytes} origin bytes for {total}, "
              f"{dict(proxy.counts)}")  # fmt: skip
        assert proxy.bytes == 0, proxy.counts  # its disk survived; the others still own theirs
        deadline = time.monotonic() + 10
        while c.client().head_object(Bucket=bucket, Key="k")["ContentLength"] != 9:
            assert time.monotonic() < deadline, "c still serves metadata it missed"
            time.sleep(0.1)
        assert metric(a.endpoint, 'hoard_peer_requests_total{operation="replay"}') >= 1
        assert c.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"brand new"
        listed = c.client().list_objects_v2(Bucket=bucket, Prefix="k")["Contents"]
        assert [(e["Key"], e["Size"]) for e in listed] == [("k", 9)]
    finally:
        for node in nodes:
            node.stop()


def _wait_stored(node: HoardProcess, bucket: str, key: str, timeout: float = 10.0) -> None:
    """Until ``key``'s metadata is in the node's on-disk store (flushed every 0.5 s)."""
    path = node.workdir / "cache" / "metadata.sqlite3"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
            query = "SELECT 1 FROM objects WHERE bucket=? AND key=?"
            if db.execute(query, (bucket, key)).fetchone():
                return
        time.sleep(0.1)
    raise AssertionError(f"{key} never reached {path}")
