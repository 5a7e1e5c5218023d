"""Hoard's own batch GET clients: ``gateway.client.bundle`` and the torch ``BundleDataset``.

In-process Hoard with moto behind it (a Hoard process where a cut must be
accounted, or the client's memory measured alone); the dataset runs in a real
``DataLoader`` with two worker processes and a batch sampler, and each batch
must be one bundle request (``hoard_bundles_total``), no GET. The client reads
fail mode's answer unframed (a Content-Length), so a cut between two members
must still be an error; a batch holds what its transform makes; workers use the
client made with the dataset.
"""

from __future__ import annotations

import importlib
import os
import pickle
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from gateway.client.bundle import BundleClient, BundleError, bundle
from gateway.client.tarstream import TarFormatError
from gateway.client.torch import BundleDataset
from tests.conftest import seed
from tests.harness import ACCESS_KEY, SECRET_KEY, HoardProcess, metric, wait_for_metric
from tests.inprocess import threaded_app
from tests.origin_proxy import Fault, OriginProxy, fail_nth
from tests.test_bundle import body_of, config, tigris

CREDENTIALS = {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
               "region_name": "us-east-1"}  # fmt: skip


@pytest.fixture
def data(bucket: str) -> dict[str, bytes]:
    objects = {f"train/{i:04d}.jpg": body_of(str(i), 500 + 37 * i) for i in range(50)}
    seed(bucket, objects)
    return objects


def test_the_plain_iterator_yields_keys_in_order(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    keys = [*sorted(data)[::-1][:20], "train/0003.jpg"]
    with threaded_app(tmp_path, config(proxy)) as hoard:
        got = list(bundle(bucket, keys, hoard.endpoint, **CREDENTIALS))
        assert got == [(key, data[key]) for key in keys]
        with pytest.raises(BundleError) as caught:
            list(bundle(bucket, ["train/0001.jpg", "nope"], hoard.endpoint, **CREDENTIALS))
        assert (caught.value.status, caught.value.code) == (404, "BundleKeyNotFound")
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        assert list(client.bundle(bucket, ["nope", "train/0002.jpg"], on_error="skip")) == [
            ("train/0002.jpg", data["train/0002.jpg"])]  # fmt: skip
        assert client.skipped == [{"key": "nope", "reason": "NoSuchKey"}]
        # The pool's connection is reused once an archive was read whole.
        for _ in range(3):
            assert len(list(client.bundle(bucket, keys))) == len(keys)
        client.close()


def test_large_objects_among_small_ones_come_whole(tmp_path: Path, proxy: OriginProxy, bucket: str):
    # Multi-block objects (64 KiB blocks), each read past the client's buffer at once.
    objects = {f"k/{i}": body_of(str(i), size)
               for i, size in enumerate([200_000, 17, 70_000, 0, 131_072, 40_000])}  # fmt: skip
    seed(bucket, objects)
    cfg = config(proxy)
    with threaded_app(tmp_path, cfg) as hoard:
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        for _ in range(2):  # cold, then warm
            assert list(client.bundle(bucket, list(objects))) == list(objects.items())
        client.close()


def _sized(key: str, data: bytes) -> tuple[str, int]:
    return key, len(data)


def test_bundle_dataset_in_a_data_loader_with_two_workers(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    with threaded_app(tmp_path, config(proxy)) as hoard:
        dataset = BundleDataset.from_prefix(bucket, "train/", hoard.endpoint, **CREDENTIALS)
        assert dataset.keys == sorted(data)
        assert dataset[7] == ("train/0007.jpg", data["train/0007.jpg"])  # alone, in this process
        copy = pickle.loads(pickle.dumps(dataset))
        assert copy[3] == ("train/0003.jpg", data["train/0003.jpg"])
        sampler = BatchSampler(SequentialSampler(dataset), batch_size=8, drop_last=False)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=list)
        before = metric(hoard.endpoint, "hoard_bundles_total")
        batches = list(loader)
        assert [item for batch in batches for item in batch] == sorted(data.items())
        assert metric(hoard.endpoint, "hoard_bundles_total") - before == len(batches) == 7
        assert metric(hoard.endpoint, 'hoard_requests_total{operation="GetObject"}') == 0
        sized = BundleDataset(bucket, sorted(data)[:4], hoard.endpoint, _sized, **CREDENTIALS)
        loader = DataLoader(sized, batch_size=2, num_workers=2, collate_fn=list)
        assert [item for batch in loader for item in batch] == [
            (key, len(data[key])) for key in sorted(data)[:4]]  # fmt: skip


def test_fail_mode_is_read_unframed_and_a_cut_between_members_is_an_error(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes]
):
    # The answer is cut between two members: its object changed since its lookup (the
    # server's test_bundle_length does the same). Unframed, the body just ends short of
    # its Content-Length, which only the archive can tell (a chunked one would fail in
    # http.client's chunk reader, with IncompleteRead).
    hoard = HoardProcess(tmp_path, config(proxy)).start()
    try:
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        keys, changed = ["train/0001.jpg", "train/0004.jpg", "train/0002.jpg"], "train/0002.jpg"
        held = [(k, data[k]) for k in (keys[0], changed)]
        assert list(client.bundle(bucket, [keys[0], changed])) == held
        proxy.faults = fail_nth(1, Fault("hang"), keys[1])
        got: list[tuple[str, bytes]] = []
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(lambda: got.extend(client.bundle(bucket, keys)))
            assert proxy.stalled.wait(10)
            tigris(hoard.endpoint).put_object(Bucket=bucket, Key=changed, Body=b"other size")
            proxy.release()
            with pytest.raises(TarFormatError):
                reading.result(30)
        assert got == [(k, data[k]) for k in keys[: len(got)]] and len(got) < 3
        assert list(client.bundle(bucket, keys[:1])) == [(keys[0], data[keys[0]])]  # reusable
        client.close()
    finally:
        proxy.release()
        assert hoard.stop() == 0, hoard.log()


def test_a_batch_holds_what_its_transform_makes_not_every_sample_at_once(
    tmp_path: Path, proxy: OriginProxy, bucket: str
):
    objects = {f"big/{i}": body_of(str(i), 200_000) for i in range(8)}
    seed(bucket, objects)
    held: list[int] = []  # the process's traced bytes as each sample reaches the transform

    def length(key: str, data: bytes) -> int:
        held.append(tracemalloc.get_traced_memory()[0])
        return len(data)

    # What the batch holds is read as each sample is transformed, not as the process's
    # peak: tracemalloc counts every thread, and under CPU contention (the suite's
    # parallel workers, CI) a transient ~10 MB was counted before the first sample, with
    # the origin idle (its proxy counted no request); its allocator was not found (a
    # profiler hook slows the thread enough that it does not happen). Hoard runs in its
    # own process, and the cold batch's blocks have landed, so the origin stays idle.
    hoard = HoardProcess(tmp_path, config(proxy)).start()
    try:
        dataset = BundleDataset(bucket, list(objects), hoard.endpoint, length, **CREDENTIALS)
        assert dataset.__getitems__(range(8)) == [200_000] * 8  # cold
        wait_for_metric(hoard.endpoint, 'hoard_cache_bytes{tier="memory"}', 8 * 200_000)
        proxy.reset()
        held.clear()
        tracemalloc.start()
        try:
            assert dataset.__getitems__(range(8)) == [200_000] * 8
        finally:
            tracemalloc.stop()
        assert proxy.counts == {}  # the warm batch never reached the origin
        assert len(held) == 8
        # A sample or two at a time (the one transformed, the next being read), never the
        # batch's 1.6 MB.
        assert max(held) < 3 * 200_000, held
    finally:
        assert hoard.stop() == 0, hoard.log()


def test_data_loader_workers_use_the_client_made_with_the_dataset(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes], monkeypatch
):
    made = tmp_path / "made"

    class Counted(BundleClient):
        def __init__(self, *args, **kwargs) -> None:
            with made.open("a") as out:
                out.write(f"{os.getpid()}\n")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("gateway.client.torch.BundleClient", Counted)
    with threaded_app(tmp_path, config(proxy)) as hoard:
        keys = sorted(data)[:16]
        dataset = BundleDataset(bucket, keys, hoard.endpoint, **CREDENTIALS)
        for _ in range(2):  # two epochs, two pairs of workers made by fork
            loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list,
                                multiprocessing_context="fork")  # fmt: skip
            assert [item for batch in loader for item in batch] == [(k, data[k]) for k in keys]
    # One client, made here: workers inherit it and open only their own connections.
    assert made.read_text().split() == [str(os.getpid())]


def test_credentials_given_whole_need_no_botocore_session(
    tmp_path: Path, proxy: OriginProxy, bucket: str, data: dict[str, bytes], monkeypatch
):
    # An endpoint, a key, its secret and a region are all a client needs: no session is
    # made for them (10-20 ms of CPU, a dataset), and what is signed with them works.
    def no_session(**credentials):
        raise AssertionError("a botocore session was made")

    module = importlib.import_module("gateway.client.bundle")  # the package names a function so
    monkeypatch.setattr(module, "aws_session", no_session)
    with threaded_app(tmp_path, config(proxy)) as hoard:
        client = BundleClient(hoard.endpoint, **CREDENTIALS)
        keys = sorted(data)[:3]
        assert list(client.bundle(bucket, keys)) == [(key, data[key]) for key in keys]
        client.close()
        with pytest.raises(AssertionError):  # the chain is still asked for what is missing
            BundleClient(hoard.endpoint, aws_access_key_id=ACCESS_KEY,
                         aws_secret_access_key=SECRET_KEY)  # fmt: skip
