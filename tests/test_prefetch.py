"""Epoch-order prefetch end to end: a real Hoard, moto behind the counting proxy.

Caching is proved by what reaches the origin: the proxy records the path and
Range of every GetObject, so "fetched ahead of the reader" and "fetched
because the reader asked" can be told apart without timing anything.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator

import pytest

from gateway.cache.block import BlockId
from gateway.client import prefetch
from gateway.client.admin import AdminClient, AdminError
from gateway.pieces import BlockRef
from gateway.prefetch.order import Order, OrderError
from gateway.prefetch.registry import Registry
from gateway.prefetch.stream import Stream
from tests.harness import ACCESS_KEY, SECRET_KEY, FreshAdmin, HoardProcess
from tests.origin_proxy import OriginProxy
from tests.test_block_cache import hoard_config, put
from tests.test_faults import _children
from tests.test_warm import lock_holder, wait_for

KiB = 1024
BLOCK = 64 * KiB
SIZE = 96 * KiB  # two blocks per object: 64 KiB + 32 KiB
WINDOW = 4 * SIZE


def start(
    tmp_path, proxy: OriginProxy, workers: int = 1, **prefetch_config: object
) -> HoardProcess:
    config = hoard_config(proxy, block_size="64KiB", read_ahead=0, read_ahead_max=0)
    config["prefetch"] = {"window": WINDOW, "max_window": "1MiB", **prefetch_config}
    return HoardProcess(tmp_path, {**config, "workers": workers}).start()


@pytest.fixture(params=[1, 2], ids=["workers1", "workers2"])
def node(request, tmp_path, proxy) -> Iterator[HoardProcess]:
    running = start(tmp_path, proxy, workers=request.param)
    yield running
    running.stop()


def admin(node: HoardProcess) -> FreshAdmin:
    """A new connection per call: with workers: 2, calls reach either worker (the
    registration one, the GETs of boto3's pooled connection another, statuses both)."""
    return FreshAdmin(node.endpoint)


def origin_bytes_by_key(proxy: OriginProxy, bucket: str) -> dict[str, int]:
    """Bytes the origin sent per key, from the Range of each GetObject."""
    sent: dict[str, int] = {}
    for path, header in list(proxy.ranges):
        key = path.split(f"/{bucket}/", 1)[-1]
        first, last = header.removeprefix("bytes=").split("-")
        sent[key] = sent.get(key, 0) + int(last) - int(first) + 1
    return sent


def settle(client: FreshAdmin, stream: str, timeout: float = 20.0) -> dict:
    """The stream's status once nothing is in flight and the window has no room left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.call("GET", f"/_hoard/prefetch/{stream}")
        assert status["ahead_bytes"] <= status["window"], status
        full = status["ahead_bytes"] + BLOCK > status["window"]
        idle = status["in_flight_bytes"] == 0 and status["lookups"] == 0
        if idle and (full or status["next_key"] >= status["keys"]):
            return status
        time.sleep(0.05)
    raise AssertionError(f"prefetch did not settle in {timeout}s: {status}")


class EpochSampler:
    """What a torch ``Sampler`` does in the README example, without torch: shuffle per
    epoch, register the order with Hoard, then yield it."""

    def __init__(self, keys: list[str], endpoint: str, bucket: str, seed: int = 0) -> None:
        self.keys, self.endpoint, self.bucket = keys, endpoint, bucket
        self.epoch, self.seed = 0, seed
        self.order: list[str] = []

    def __iter__(self) -> Iterator[str]:
        order = self.order = list(self.keys)
        random.Random(self.seed + self.epoch).shuffle(order)
        self.epoch += 1
        prefetch(order, endpoint=self.endpoint, bucket=self.bucket, stream_id="sampler-0",
                 window=WINDOW, access_key=ACCESS_KEY, secret_key=SECRET_KEY)  # fmt: skip
        return iter(order)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("concurrency", "workers"), [(1, 1), (8, 1), (1, 2), (8, 2)])
def test_window_is_bounded_and_reader_following_its_order_hits(
    tmp_path, proxy, origin_client, bucket, concurrency, workers
):
    keys = [f"train/sample-{n:03d}.bin" for n in range(24)]
    for key in keys:
        put(origin_client, bucket, key, SIZE)
    node = start(tmp_path, proxy, workers, concurrency=concurrency)
    try:
        proxy.reset()
        client, s3 = admin(node), node.client()
        sampler = EpochSampler(keys, node.endpoint, bucket)
        reader_fetches: list[list[str]] = []  # the Range of each block the reader fetched
        for position, key in enumerate(sampler):
            status = settle(client, "sampler-0")
            read = set(sampler.order[:position])
            ahead = sum(n for k, n in origin_bytes_by_key(proxy, bucket).items() if k not in read)
            assert ahead <= WINDOW, (position, ahead, status)  # sent by the origin, not read yet
            before = len(proxy.ranges)
            assert len(s3.get_object(Bucket=bucket, Key=key)["Body"].read()) == SIZE
            reader_fetches.append([r for p, r in proxy.ranges[before:] if p.endswith(key)])
        final = client.call("GET", "/_hoard/prefetch/sampler-0")
    finally:
        node.stop()
    assert proxy.gets() == 2 * len(keys)  # each block once, by prefetch or by the reader
    assert final["position"] == len(keys) - 1
    by_reader = [r for ranges in reader_fetches for r in ranges]
    if concurrency == 1:
        # Lookups one at a time take keys whole, in order: the reader finds every block.
        assert by_reader == [], reader_fetches
    else:
        # Concurrent lookups answer out of order, so a key's second block may find the
        # window taken by farther keys' first blocks; a key's first block is always
        # there (it came with its lookup, and the window holds at least one key).
        assert all(not r.startswith("bytes=0-") for r in by_reader), reader_fetches
    expected = len(keys) * SIZE - len(by_reader) * (SIZE - BLOCK)
    if workers == 1:
        assert final["fetched_bytes"] == expected
    else:  # NOTE: a lookup's block 0 may land while its metadata is flushed to the node's
        # store, before prefetch looks at its fill, and is then counted as cached (as in warm).
        assert expected - len(keys) * BLOCK <= final["fetched_bytes"] <= expected


@pytest.mark.timeout(120)
def test_lookups_run_concurrently_within_the_slots_and_fetch_each_key_once(
    tmp_path, proxy, origin_client, bucket
):
    """Many small keys ahead of a reader that has not started: with N slots the origin
    sees more than one and at most N prefetch requests at once, one GET per key (its
    lookup's ranged GET is its block) and no HEAD. One lookup at a time would let
    the origin see a single request in flight."""
    slots = 4
    keys = [f"small/{n:03d}" for n in range(40)]
    for key in keys:
        put(origin_client, bucket, key, 4 * KiB)
    node = start(tmp_path, proxy, concurrency=slots)
    try:
        client = admin(node)
        proxy.reset()
        proxy.latency = 0.02  # a remote store's round trip, so the lookups overlap
        body = {"stream": "small", "bucket": bucket, "keys": keys, "window": "1MiB"}
        client.call("POST", "/_hoard/prefetch", body=body)
        status = settle(client, "small")
    finally:
        proxy.latency = 0.0
        node.stop()
    assert status["next_key"] == len(keys) and status["errors"] == 0, status
    assert 1 < proxy.max_in_flight <= slots, proxy.max_in_flight
    assert sorted(p for p, _ in proxy.ranges) == sorted(f"/{bucket}/{k}" for k in keys)
    assert proxy.counts["HeadObject"] == 0, proxy.counts
    assert status["fetched_bytes"] == len(keys) * 4 * KiB
    # Nearer keys start first: key i's lookup needs a free slot, so it reaches the
    # origin after at least i - slots + 1 other lookups have been answered.
    arrived = [keys.index(p.split(f"/{bucket}/", 1)[1]) for p, _ in proxy.ranges]
    assert all(position >= index - slots + 1 for position, index in enumerate(arrived)), arrived


@pytest.mark.timeout(120)
def test_next_epoch_replaces_the_order_and_delete_forgets_it(node, proxy, origin_client, bucket):
    keys = [f"e/{n:02d}" for n in range(6)]
    for key in keys:
        put(origin_client, bucket, key, SIZE)
    client = admin(node)
    sampler = EpochSampler(keys, node.endpoint, bucket)
    first = list(sampler)
    second = list(sampler)  # re-registered under the same stream id
    assert first != second and sorted(first) == sorted(second)
    status = client.call("GET", "/_hoard/prefetch/sampler-0")
    assert status["position"] == -1 and status["keys"] == len(keys)
    assert client.call("DELETE", "/_hoard/prefetch/sampler-0")["dropped"] is True
    with pytest.raises(AdminError) as gone:
        client.call("GET", "/_hoard/prefetch/sampler-0")
    assert gone.value.status == 404 and gone.value.body["error"] == "NoSuchStream"


@pytest.mark.timeout(120)
def test_manifest_registers_one_key_per_line(node, proxy, origin_client, bucket):
    keys = [f"m/{n:02d}" for n in range(5)]
    for key in keys:
        put(origin_client, bucket, key, SIZE)
    origin_client.put_object(Bucket=bucket, Key="epoch-0.txt", Body="\n".join(keys).encode())
    client = admin(node)
    body = {"stream": "manifest-0", "bucket": bucket, "manifest": "epoch-0.txt", "window": "1MiB"}
    assert client.call("POST", "/_hoard/prefetch", body=body)["keys"] == len(keys)
    status = settle(client, "manifest-0")
    assert status["next_key"] == len(keys) and status["errors"] == 0
    assert set(origin_bytes_by_key(proxy, bucket)) >= set(keys)


@pytest.mark.timeout(120)
def test_bounds_are_refused_with_json_400(tmp_path, proxy, bucket):
    node = start(tmp_path, proxy, max_keys=10, max_streams=2)
    try:
        client = admin(node)

        def refused(body: dict) -> dict:
            with pytest.raises(AdminError) as error:
                client.call("POST", "/_hoard/prefetch", body=body)
            assert error.value.status == 400, error.value.body
            return error.value.body

        base = {"bucket": bucket, "keys": ["a", "b"]}
        assert refused({**base, "stream": "s", "keys": [str(n) for n in range(11)]})["error"] == (
            "TooManyKeys")  # fmt: skip
        assert refused({**base, "stream": "s", "window": "2MiB"})["error"] == "InvalidWindow"
        assert refused({**base, "stream": "bad id!"})["error"] == "InvalidStream"
        assert refused({"stream": "s", "bucket": bucket})["error"] == "InvalidRequest"
        assert refused({**base, "stream": "s", "manifest": "m"})["error"] == "InvalidRequest"
        for stream in ("one", "two"):
            client.call("POST", "/_hoard/prefetch", body={**base, "stream": stream})
        assert refused({**base, "stream": "three"})["error"] == "TooManyStreams"
        client.call("POST", "/_hoard/prefetch", body={**base, "stream": "two"})  # a replacement
        with pytest.raises(AdminError) as unsigned:
            AdminClient(node.endpoint, ACCESS_KEY, "wrong").call("GET", "/_hoard/prefetch/one")
        assert unsigned.value.status == 403
    finally:
        node.stop()


# -- the accounting alone (gateway/prefetch/stream.py) ------------------------------------


def second_block(key: str, length: int) -> BlockRef:
    return BlockRef(BlockId("o", "b", key, "e", 1), None, BLOCK, BLOCK + length - 1)  # type: ignore[arg-type]


def test_a_lookup_reserves_a_block_until_its_size_is_known_and_the_window_holds():
    stream = Stream(Order("s", "b", ("k0", "k1", "k2", "k3"), window=3 * BLOCK), True, 0.0)
    for index in range(3):
        assert stream.room(BLOCK)
        stream.reserve(index, BLOCK)
    assert not stream.room(BLOCK) and stream.ahead_bytes == 3 * BLOCK and stream.lookups == 3
    # k2 answers first: a 1 KiB object; k0 then: two blocks, its second waits.
    assert stream.found(2, 1024, [])
    assert stream.found(0, BLOCK, [second_block("k0", 512)])
    assert stream.ahead_bytes == 2 * BLOCK + 1024 and stream.lookups == 1
    index, ref = stream.pending[0]
    assert index == 0 and stream.room(ref.length)
    stream.take(index, ref.length)
    assert stream.ahead_bytes == 2 * BLOCK + 1536 <= stream.order.window


def test_a_reader_that_overtakes_prefetch_skips_what_it_read():
    stream = Stream(Order("s", "b", ("k0", "k1", "k2", "k3"), window=8 * BLOCK), True, 0.0)
    stream.reserve(0, BLOCK)
    stream.reserve(1, BLOCK)
    assert stream.found(0, BLOCK, [second_block("k0", 100)])
    stream.move(2, 1.0)  # the reader read k0..k2 itself meanwhile
    assert stream.next_key == 3 and stream.pending == [] and stream.ahead_bytes == 0
    assert not stream.found(1, BLOCK, [second_block("k1", 100)])  # passed: nothing kept
    assert stream.pending == [] and stream.ahead_bytes == 0 and stream.lookups == 0


@pytest.mark.timeout(120)
def test_a_stream_survives_its_leader_worker_being_killed(tmp_path, proxy, origin_client, bucket):
    """workers: 2. The worker following the node's streams is killed; a sibling leads
    and follows the stream on from the reader's position: each block still once."""
    keys = [f"lead/{n:02d}" for n in range(12)]
    for key in keys:
        put(origin_client, bucket, key, SIZE)
    node = start(tmp_path, proxy, workers=2)
    lock = tmp_path / "cache" / "node" / "leader"
    try:
        client, s3 = admin(node), node.client()
        proxy.reset()
        body = {"stream": "s", "bucket": bucket, "keys": keys, "window": WINDOW}
        client.call("POST", "/_hoard/prefetch", body=body)
        settle(client, "s")
        leader = lock_holder(lock)
        assert node.proc is not None and leader in _children(node.proc.pid)
        os.kill(leader, signal.SIGKILL)
        wait_for(lambda: leader not in _children(node.proc.pid))
        wait_for(lambda: lock_holder(lock) not in (None, leader))
        for key in keys:
            assert len(s3.get_object(Bucket=bucket, Key=key)["Body"].read()) == SIZE
            settle(client, "s")
        final = client.call("GET", "/_hoard/prefetch/s")
    finally:
        node.stop()
    assert final["position"] == len(keys) - 1
    assert final["fetched_bytes"] > 0  # the new leader fetched ahead of the reader
    assert proxy.gets() == 2 * len(keys)  # each block once, whoever fetched it


def test_the_registry_is_shared_by_the_workers_of_a_node(tmp_path):
    """Two views of one directory, as two workers have: what one registers, observes or
    publishes, the other reads; the slots bound the streams; a damaged index is empty."""
    a, b = Registry(tmp_path, slots=2), Registry(tmp_path, slots=2)
    a.open()
    b.open()
    try:
        seen = b.generation()
        entry = a.register(Order("s", "bkt", ("k0", "k1", "k2"), WINDOW), active=True)
        assert b.generation() > seen and b.entries() == {"s": entry}
        assert b.keys(entry) == ("k0", "k1", "k2")
        assert b.observed(entry)[:2] == (0, -1) and b.published(entry) is None
        b.observe(entry, 2)
        seq, index, _ = a.observed(entry)
        assert (seq, index) == (1, 2)
        status = {"position": 2, "next_key": 3, "ahead_bytes": 0, "in_flight_bytes": 0,
                  "lookups": 0, "fetched_bytes": 5, "errors": 0, "active": True,
                  "idle_seconds": 0.25}  # fmt: skip
        a.publish(entry, seq, status)
        assert b.published(entry) == (1, status)
        again = b.register(Order("s", "bkt", ("k2",), WINDOW), active=False)  # next epoch
        assert again.slot == entry.slot and again.serial > entry.serial
        assert a.observed(entry) is None and a.keys(entry) is None  # the old one is gone
        a.register(Order("t", "bkt", ("k",), WINDOW), active=True)
        with pytest.raises(OrderError) as full:
            b.register(Order("u", "bkt", ("k",), WINDOW), active=True)
        assert full.value.code == "TooManyStreams"
        assert a.drop("t") and not b.drop("t") and set(b.entries()) == {"s"}
        (tmp_path / "index.json").write_text('{"s": {"slot": "x"}}')
        assert a.entries() == {}
    finally:
        a.close()
        b.close()
