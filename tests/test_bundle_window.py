"""How many of a bundle's cold keys are in flight at once, and that what is ready goes out.

The origin proxy holds every GetObject (a ``hang`` fault) until the test
releases it, and its fault plan, called as each GET arrives, says when the
``n``-th has arrived: a window of 16 never lets the 40th arrive while the
first ones are held, a window that grows to 64 does. One GET per object is
checked once released.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.app.server import HIT_PATH
from gateway.client.bundle import BundleClient, BundleError
from gateway.s3.bundle.ahead import MAX_AHEAD
from tests.conftest import seed
from tests.harness import metric, wait_for_metric
from tests.inprocess import threaded_app
from tests.origin_proxy import Fault, FaultPlan, OriginProxy
from tests.test_bundle import body_of, config
from tests.test_bundle_client import CREDENTIALS

COLD = 40  # more than the old window of 16, fewer than MAX_AHEAD


def _hold_all(arrived: int, reached: threading.Event) -> FaultPlan:
    """Every GET held; ``reached`` set when the ``arrived``-th one arrives."""

    def plan(number: int, path: str, byte_range: str) -> Fault:
        if number >= arrived:
            reached.set()
        return Fault("hang")

    return plan


def _objects(bucket: str, prefix: str, count: int) -> dict[str, bytes]:
    objects = {f"{prefix}/{i:03d}": body_of(f"{prefix}{i}", 2000 + i) for i in range(count)}
    seed(bucket, objects)
    return objects


def test_fail_mode_looks_up_more_cold_keys_at_once(tmp_path: Path, proxy: OriginProxy, bucket: str):
    assert COLD <= MAX_AHEAD
    cold = _objects(bucket, "cold", COLD)
    with threaded_app(tmp_path, config(proxy)) as hoard:
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        reached = threading.Event()
        proxy.reset()
        proxy.faults = _hold_all(COLD, reached)
        with ThreadPoolExecutor(1) as pool:
            got = pool.submit(lambda: list(client.bundle(bucket, list(cold))))
            try:
                assert reached.wait(60), f"only {proxy.max_in_flight} cold keys in flight"
            finally:
                proxy.faults = None
                proxy.release()
            assert got.result(60) == list(cold.items())
        assert proxy.gets() == COLD  # one origin GET per object, none twice
        client.close()


def test_the_window_grows_past_small_objects_and_sends_what_is_ready(
    tmp_path: Path, proxy: OriginProxy, bucket: str
):
    warm = _objects(bucket, "warm", 8)
    cold = _objects(bucket, "cold", COLD)
    with threaded_app(tmp_path, config(proxy)) as hoard:
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        assert list(client.bundle(bucket, list(warm))) == list(warm.items())
        reached = threading.Event()
        proxy.reset()
        proxy.faults = _hold_all(COLD, reached)
        answer = client.bundle(bucket, [*warm, *cold], on_error="skip")
        with ThreadPoolExecutor(1) as pool:
            try:
                # The warm members arrive while every cold key is still held at the origin.
                first = pool.submit(lambda: [next(answer) for _ in warm])
                assert first.result(60) == list(warm.items())
                # Small objects seen: all 40 cold keys are opened at once, not 16.
                assert reached.wait(60), f"only {proxy.max_in_flight} cold keys in flight"
            finally:
                proxy.faults = None
                proxy.release()
            assert pool.submit(list, answer).result(60) == list(cold.items())
        assert client.skipped == []
        assert proxy.gets() == COLD
        client.close()


def test_fail_mode_knows_held_keys_without_the_origin(
    tmp_path: Path, proxy: OriginProxy, bucket: str
):
    # ``Reader.size_now`` answers a held key's size on the loop; anything else is None
    # and goes the read's way (``block_refs``), so a missing key is still a 404.
    objects = _objects(bucket, "k", 3)
    with threaded_app(tmp_path, config(proxy)) as hoard:
        reader = hoard.app[HIT_PATH]._reader
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        assert [reader.size_now(bucket, key) for key in objects] == [None] * 3  # nothing held
        assert list(client.bundle(bucket, list(objects))) == list(objects.items())
        assert [reader.size_now(bucket, key) for key in objects] == list(map(len, objects.values()))
        proxy.reset()
        assert list(client.bundle(bucket, list(objects))) == list(objects.items())
        assert proxy.counts == {}  # held: nothing asked of the origin
        with pytest.raises(BundleError) as caught:
            list(client.bundle(bucket, [*objects, "k/none"]))
        assert caught.value.code == "BundleKeyNotFound"
        assert reader.size_now(bucket, "k/none") is None  # a negative entry: not a size
        client.close()


def test_fail_mode_opens_held_keys_with_their_lookup(
    tmp_path: Path, proxy: OriginProxy, bucket: str
):
    # The held keys of a warm batch are opened as they are looked up (``held_first``),
    # and the stream sends what was opened: one metadata lookup a key, not two.
    objects = _objects(bucket, "h", 20)
    with threaded_app(tmp_path, config(proxy)) as hoard:
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        keys = [*objects, "h/003"]  # one asked twice
        expected = [(key, objects[key]) for key in keys]
        assert list(client.bundle(bucket, keys)) == expected  # cold
        # The cold batch's blocks land a moment after the client has every byte; a key read
        # before its block landed is no held key (it is looked up again on the read's way).
        wait_for_metric(hoard.endpoint, 'hoard_cache_bytes{tier="memory"}',
                        sum(map(len, objects.values())))  # fmt: skip
        lookups = "hoard_metadata_lookups_total"
        before = metric(hoard.endpoint, lookups)
        assert list(client.bundle(bucket, keys)) == expected
        assert metric(hoard.endpoint, lookups) - before == len(keys)
        client.close()
