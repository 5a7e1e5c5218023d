"""Epoch-order prefetch end to end: a real Hoard, moto behind the counting proxy.

Caching is proved by what reaches the origin: the proxy records the path and
Range of every GetObject, so "fetched ahead of the reader" and "fetched
because the reader asked" can be told apart without timing anything.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest

from gateway.client import prefetch
from gateway.client.admin import AdminClient, AdminError
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess
from tests.origin_proxy import OriginProxy
from tests.test_block_cache import hoard_config, put

KiB = 1024
BLOCK = 64 * KiB
SIZE = 96 * KiB  # two blocks per object: 64 KiB + 32 KiB
WINDOW = 4 * SIZE


def start(tmp_path, proxy: OriginProxy, **prefetch_config: object) -> HoardProcess:
    config = hoard_config(proxy, block_size="64KiB", read_ahead=0, read_ahead_max=0)
    config["prefetch"] = {"window": WINDOW, "max_window": "1MiB", **prefetch_config}
    return HoardProcess(tmp_path, config).start()


@pytest.fixture
def node(tmp_path, proxy) -> Iterator[HoardProcess]:
    running = start(tmp_path, proxy)
    yield running
    running.stop()


def admin(node: HoardProcess) -> AdminClient:
    return AdminClient(node.endpoint, ACCESS_KEY, SECRET_KEY, timeout=10)


def origin_bytes_by_key(proxy: OriginProxy, bucket: str) -> dict[str, int]:
    """Bytes the origin sent per key, from the Range of each GetObject."""
    sent: dict[str, int] = {}
    for path, header in list(proxy.ranges):
        key = path.split(f"/{bucket}/", 1)[-1]
        first, last = header.removeprefix("bytes=").split("-")
        sent[key] = sent.get(key, 0) + int(last) - int(first) + 1
    return sent


def settle(client: AdminClient, stream: str, timeout: float = 20.0) -> dict:
    """The stream's status once nothing is in flight and the window has no room left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.call("GET", f"/_hoard/prefetch/{stream}")
        assert status["ahead_bytes"] <= status["window"], status
        full = status["ahead_bytes"] + BLOCK > status["window"]
        if status["in_flight_bytes"] == 0 and (full or status["next_key"] >= status["keys"]):
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
def test_window_is_bounded_and_reader_following_its_order_hits(node, proxy, origin_client, bucket):
    keys = [f"train/sample-{n:03d}.bin" for n in range(24)]
    for key in keys:
        put(origin_client, bucket, key, SIZE)
    proxy.reset()
    client, s3 = admin(node), node.client()
    sampler = EpochSampler(keys, node.endpoint, bucket)
    reader_fetches: list[int] = []
    for position, key in enumerate(sampler):
        status = settle(client, "sampler-0")
        read = set(sampler.order[:position])
        ahead = sum(n for k, n in origin_bytes_by_key(proxy, bucket).items() if k not in read)
        assert ahead <= WINDOW, (position, ahead, status)  # what the origin sent, not read yet
        before = len(proxy.ranges)
        assert len(s3.get_object(Bucket=bucket, Key=key)["Body"].read()) == SIZE
        reader_fetches.append(sum(1 for p, _ in proxy.ranges[before:] if p.endswith(key)))
    # Every block was fetched ahead of the reader, once: its own GETs found them cached.
    assert reader_fetches == [0] * len(keys), reader_fetches
    assert proxy.gets() == 2 * len(keys)
    final = client.call("GET", "/_hoard/prefetch/sampler-0")
    assert final["position"] == len(keys) - 1 and final["fetched_bytes"] == len(keys) * SIZE


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
